// GEMM on raw row-major buffers: C = alpha * op(A) op(B) + beta * C, with A and
// B in f32, f16 or bf16, f32 accumulation, and C in f32 or the input type.
// beta = 1 accumulates into C (how weight gradients land in the f32 buffer).
// batch > 1 runs that many GEMMs of one shape on operands a fixed stride apart
// (attention's per-head products: cuBLASLt strided batches, a loop on the CPU);
// the outputs may be stacked or side by side in C's rows, never overlapping.
// CPU: OpenBLAS (16-bit inputs are widened to f32 first). CUDA: cuBLASLt with
// the algorithm cached per shape (Note [timed gemm algorithms]), and a
// caller-provided workspace. An epilogue (GemmEpilogue) fuses a Linear's
// bias, bias+GELU(tanh) and their gradients into the GEMM on CUDA; the CPU
// composes the separate ops of kernels/bias.h and kernels/activation.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

// Note [gemm epilogues]: what runs after the product, in row-major terms
// (C is [m, n]; cuBLASLt's names, for its column-major view of C^T, follow).
// Every epilogue needs batch 1 and a dense C (ldc = n); the bias and the
// bias gradient are f32 vectors.
// - bias: C = op(A) op(B) + bias[n], broadcast over rows (EPILOGUE_BIAS).
// - bias_gelu_aux: aux = op(A) op(B) + bias, C = GELU_tanh(aux), aux dense
//   [m, n] in C's type kept for backward (EPILOGUE_GELU_AUX_BIAS).
// - dgelu_bgrad: C = (op(A) op(B)) * GELU_tanh'(aux), and bias_grad[n] = the
//   sum of C's rows: the gradient at a fused Linear+GELU's pre-activation
//   computed by the GEMM that makes the gradient at its output
//   (EPILOGUE_DGELU_BGRAD).
// - bgrad_a: bias_grad[m] = sum over k of op(A)[i, k], beside any product:
//   the dW = dy^T x GEMM (trans_a, A = dy [k, m] with lda = m) gives the bias
//   gradient from the dy it reads anyway (EPILOGUE_BGRADB: cuBLASLt's B is
//   our A).
// The bias gradient is added to bias_grad when bias_grad_accumulate, else it
// overwrites it (cuBLASLt's epilogue overwrites: on CUDA an accumulating call
// sums into scratch and adds). beta must be 0 with bias_gelu_aux and
// dgelu_bgrad. CPU (the reference): the GEMM, then add_bias, GELU(tanh),
// its backward and bias_grad in that order, the bits of the unfused layers.
// CUDA: the epilogue where cuBLASLt offers an algorithm for it, else the same
// separate kernels (Note [epilogue fallback], kernels/cuda/gemm.cu).
enum class GemmEpilogue { none, bias, bias_gelu_aux, dgelu_bgrad, bgrad_a };
const char* gemm_epilogue_name(GemmEpilogue epilogue);  // "bias_gelu_aux"

struct GemmArgs {
  bool trans_a = false;  // A is stored [k, m] instead of [m, k]
  bool trans_b = false;  // B is stored [n, k] instead of [k, n]
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* a = nullptr;
  std::int64_t lda = 0;  // row stride of A as stored
  const void* b = nullptr;
  std::int64_t ldb = 0;
  void* c = nullptr;
  std::int64_t ldc = 0;
  DType ab_type = DType::f32;  // type of A and B
  DType c_type = DType::f32;   // f32, or ab_type
  std::int64_t batch = 1;      // GEMMs in this call
  std::int64_t stride_a = 0;   // elements from one batch's A to the next
  std::int64_t stride_b = 0;
  std::int64_t stride_c = 0;
  GemmEpilogue epilogue = GemmEpilogue::none;  // Note [gemm epilogues]
  const float* bias = nullptr;                 // [n]: bias, bias_gelu_aux
  float* bias_grad = nullptr;                  // [n] dgelu_bgrad, [m] bgrad_a
  bool bias_grad_accumulate = false;           // add to bias_grad instead of overwriting
  void* aux = nullptr;  // [m, n] in c_type, dense: written by bias_gelu_aux, read by dgelu_bgrad
};

// Throws InvalidArgument naming the field at fault (types, sizes, strides).
void validate_gemm(const GemmArgs& args);

namespace cpu {
void gemm(const GemmArgs& args);
// Threads the GEMM library may use for one GEMM (per process); 1 until set
// (Note [one GEMM thread by default], kernels/cpu/gemm.cpp).
void set_gemm_threads(int threads);
// What set_gemm_threads last set (1 until then).
int gemm_threads();

// Note [CPU GEMM libraries]: the f32 GEMM under every CPU layer is one
// library's sgemm. At one thread on a 2-vCPU Intel Xeon VM (family 6, model
// 167 as it reports itself; AVX-512), GF/s at the Linear, attention and
// im2col shapes of the presets, median of 7 interleaved blocks
// (docs/benchmarks.md, "CPU GEMM libraries"):
// oneDNN 2.6 (Debian's libdnnl) 183-215 and MKL 2026 (PyPI's mkl) 194-215
// at the seven Linear shapes, OpenBLAS 0.3.21 (SkylakeX kernels) 168-188,
// BLIS 0.9 84-118; at attention's 128x128x32 scores OpenBLAS 129 against
// 187-195 (at its 128x32x128 values OpenBLAS leads, 215 against 196-210); at
// the convolutions' im2col 54-144 against 101-187. oneDNN is the one a
// Debian user installs, so a build that finds it (scripts/install-deps.sh
// installs libdnnl-dev) uses its dnnl_sgemm by default, and OpenBLAS stays the
// fallback: built in always, chosen with use_gemm_library (programs: the
// environment's LOCKSTEP_CPU_GEMM=openblas). Both are deterministic for a
// given shape and thread count, and neither's bits equal the other's. oneDNN
// threads with OpenMP (Debian's build): the count is set on the calling
// thread before each call, and OpenMP's workers spin briefly after each GEMM
// (OMP_WAIT_POLICY=passive stops that where a loader or communication thread
// needs the core).
enum class GemmLibrary { onednn, openblas };
const char* gemm_library_name(GemmLibrary library);  // "oneDNN", "OpenBLAS"
// The libraries this build has, its default first.
std::vector<GemmLibrary> gemm_libraries();
GemmLibrary gemm_library();  // the one in use
// Throws InvalidArgument when the build lacks `library`.
void use_gemm_library(GemmLibrary library);
// "onednn" or "openblas" (any case); throws InvalidArgument naming `what`,
// the value and the libraries this build has.
GemmLibrary parse_gemm_library(const std::string& name, const std::string& what);
// Row-major f32 C = alpha op(A) op(B) + beta C through `library`'s own call:
// what a benchmark's baseline calls. Like gemm(), it blocks the asynchronous
// signals around oneDNN's call (Note [GEMM signal mask], kernels/cpu/gemm.cpp).
void raw_sgemm(GemmLibrary library, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
               std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// Note [BLAS kernels]: OpenBLAS (DYNAMIC_ARCH) picks its kernels by the
// processor's model number when it loads, and Debian 12's 0.3.21 does not know
// processors newer than it: on a 5th-generation Xeon (family 6, model 207) it
// falls back to its generic "Prescott" SSE3 kernels, and the mlp step is about
// 5 times slower (bench_step mlp b128: 38.3 ms against 8.3 ms with the
// SkylakeX kernels, on that Xeon). OPENBLAS_CORETYPE, read only at load, picks
// the kernels by name; scripts/openblas-coretype.sh prints the name this rule
// gives, for scripts that start programs.
struct CpuGemmKernels {
  std::string library;  // the library in use: "oneDNN 2.6.3", "OpenBLAS 0.3.21"
  std::string kernels;  // "avx512_core" (oneDNN's ISA), "SkylakeX" (OpenBLAS's choice)
  // With OpenBLAS in use: the OPENBLAS_CORETYPE this processor should have
  // when OpenBLAS chose generic kernels on a processor with AVX2 or AVX-512;
  // "" otherwise.
  std::string better_coretype;
  // "OpenBLAS 0.3.21, SkylakeX kernels".
  std::string describe() const;
  // The warning to print when better_coretype is set, naming the fix.
  std::string advice() const;
};
CpuGemmKernels cpu_gemm_kernels();
}  // namespace cpu

namespace cuda {
// Workspace the caller provides to gemm(); cuBLASLt's recommendation for Hopper.
constexpr std::size_t kGemmWorkspaceBytes = 32u << 20;
void gemm(const GemmArgs& args, void* workspace, std::size_t workspace_bytes, CudaStream stream);

// Note [epilogue fallback]: how often each epilogue ran fused in cuBLASLt and
// how often as the separate kernels, and why the last fallback happened
// ("no algorithm", "f32 GELU", "aux not 16-byte aligned", "deterministic",
// "disabled").
struct GemmEpilogueCounts {
  std::int64_t fused = 0;
  std::int64_t fallback = 0;
  std::string last_fallback_reason;
};
// Indexed by GemmEpilogue (none's entry stays empty); since process start or
// the last reset.
std::vector<GemmEpilogueCounts> gemm_epilogue_counts();
void reset_gemm_epilogue_counts();
// Every epilogue takes the separate kernels while the fusion switch is off
// (kernels/fusion.h; tests force the fallback with it).

// Note [timed gemm algorithms]: what the plan cache holds, one line per plan:
// shape, types, epilogue, and the algorithm and how it was chosen ("timed 4
// of 8: 0.412 ms" or "heuristic first (deterministic)").
std::vector<std::string> gemm_plan_descriptions();
// Off: every new plan takes the heuristic's first algorithm. On by default
// (bench_step --no-gemm-timing turns it off).
void set_gemm_timing(bool on);
}  // namespace cuda

}  // namespace lockstep::kernels
