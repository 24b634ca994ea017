// CPU GEMM: one library's f32 sgemm (Note [CPU GEMM libraries]: oneDNN's
// dnnl_sgemm where the build found it, OpenBLAS's cblas_sgemm otherwise or
// when asked); f16/bf16 operands are widened to f32 scratch first, since
// neither library's sgemm takes half precision.
#include <cblas.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <csignal>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#if LOCKSTEP_WITH_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

#include "kernels/activation.h"
#include "kernels/bias.h"
#include "kernels/detail/cpu_float.h"
#include "kernels/error.h"
#include "kernels/gemm.h"

namespace lockstep::kernels::cpu {
namespace {

// Copies a rows x cols matrix with row stride ld into dense f32.
std::vector<float> widen(const void* src, DType type, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld) {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = detail::load_f32(src, type, r * ld + c);
  return out;
}

std::atomic<GemmLibrary> current_library{gemm_libraries().front()};
// Note [one GEMM thread by default]: one thread until set_gemm_threads. A
// process per rank shares the node's cores with its peers (torchrun sets
// OMP_NUM_THREADS=1 for the same reason), and OpenMP's workers spin after
// each GEMM: with oneDNN's default of a thread per core, 4 ranks on 2 cores
// took 95 s for mpi_tests_4_ranks_invariant, 3 s at one thread each.
std::atomic<int> configured_threads{1};
std::once_flag openblas_default_threads;

#if LOCKSTEP_WITH_ONEDNN
const char* onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_sse41:
      return "sse41";
    default:
      return "other";
  }
}
#endif

// Note [GEMM signal mask]: oneDNN 2.6's f32 GEMM kernels (the AVX2 and
// AVX-512 "nocopy" ones dnnl_sgemm picks for small-batch shapes such as
// mlp's) move the stack pointer into a workspace they take from the heap
// whenever a block's K exceeds what fits on the stack (84 in the AVX-512
// kernel): the JIT code does `mov rsp, ws` for its packing buffer. A signal
// handled on that thread meanwhile has its frame (a few KB with the AVX-512
// and AMX state) written below rsp, over the heap chunks before the
// workspace (oneDNN issue 4845, fixed in 3.11.2; Debian 12 ships 2.6.3).
// lockstep-train handles SIGINT, SIGTERM and SIGUSR1 (engine/run_control.cpp)
// and SIGUSR2 (the flight recorder), and Linux gives a signal sent to the
// process to its main thread first, the one that runs the GEMMs: mpirun's
// abort (SIGTERM to the ranks in mid-step) once left programs_stop's
// "mpirun, SIGINT" case dead in glibc's "corrupted size vs. prev_size" at a
// later free in Linear::backward. Measured on the 2-vCPU VM: 2-rank mlp runs
// of lockstep-train with SIGUSR2 sent to both ranks every 2 ms died so in 4
// of 4 runs (a free() inside dnnl_sgemm, from Linear::backward); with
// LOCKSTEP_CPU_GEMM=openblas in 0 of 2, with this mask in 0 of 5 (3000
// steps, about 5000 rounds of signals each). dnnl_sgemm alone, with
// pthread_kill in a loop corrupted the heap at m=16 n=10 k=512 (mlp's fc3) in
// 2 of 2 runs, and in 0 of 2 with the mask. So every call into oneDNN runs
// with the asynchronous signals blocked on the calling thread: a signal sent
// meanwhile waits the length of one GEMM, or goes to another thread of the
// process. OpenMP's workers, made by libgomp inside a multi-threaded call,
// inherit the blocked mask and so never take one. The faults a kernel itself
// raises (SIGSEGV and the like) stay deliverable. The mask costs two system
// calls per gemm() (0.19 us together on that VM, against mlp's step of 9
// calls in about 8 ms). OpenBLAS keeps rsp on the stack: no mask there.
class AsyncSignalsBlocked {
 public:
  AsyncSignalsBlocked() {
    sigset_t blocked;
    sigfillset(&blocked);
    for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT})
      sigdelset(&blocked, fault);
    pthread_sigmask(SIG_BLOCK, &blocked, &previous_);
  }
  ~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  AsyncSignalsBlocked(const AsyncSignalsBlocked&) = delete;
  AsyncSignalsBlocked& operator=(const AsyncSignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

// One library's sgemm, without the guard of Note [GEMM signal mask]: callers hold it.
void library_sgemm(GemmLibrary library, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                   std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
                   std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
#if LOCKSTEP_WITH_ONEDNN
  if (library == GemmLibrary::onednn) {
    const int threads = configured_threads.load(std::memory_order_relaxed);
    if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
    const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k,
                                            alpha, a, lda, b, ldb, beta, c, ldc);
    if (status != dnnl_success)
      throw InvalidArgument("dnnl_sgemm m=" + std::to_string(m) + " n=" + std::to_string(n) +
                            " k=" + std::to_string(k) + " failed with status " +
                            std::to_string(static_cast<int>(status)));
    return;
  }
#endif
  (void)library;
  std::call_once(openblas_default_threads, [] {
    openblas_set_num_threads(configured_threads.load(std::memory_order_relaxed));
  });
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void sgemm(GemmLibrary library, const GemmArgs& g, const float* a, std::int64_t lda, const float* b,
           std::int64_t ldb, float* c, std::int64_t ldc) {
  library_sgemm(library, g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a, lda, b, ldb, g.beta, c,
                ldc);
}

// One GEMM of a batch (g.batch is ignored).
void gemm_one(GemmLibrary library, const GemmArgs& g) {
  if (g.ab_type == DType::f32) {
    sgemm(library, g, static_cast<const float*>(g.a), g.lda, static_cast<const float*>(g.b), g.ldb,
          static_cast<float*>(g.c), g.ldc);
    return;
  }
  const std::int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const std::vector<float> a = widen(g.a, g.ab_type, a_rows, a_cols, g.lda);
  const std::vector<float> b = widen(g.b, g.ab_type, b_rows, b_cols, g.ldb);
  const std::int64_t lda = std::max<std::int64_t>(1, a_cols),
                     ldb = std::max<std::int64_t>(1, b_cols);
  if (g.c_type == DType::f32) {
    sgemm(library, g, a.data(), lda, b.data(), ldb, static_cast<float*>(g.c), g.ldc);
    return;
  }
  // 16-bit C: compute in f32 (reading C only when beta needs it), round once.
  std::vector<float> c = g.beta != 0.0f ? widen(g.c, g.c_type, g.m, g.n, g.ldc)
                                        : std::vector<float>(static_cast<std::size_t>(g.m * g.n));
  sgemm(library, g, a.data(), lda, b.data(), ldb, c.data(), g.n);
  for (std::int64_t r = 0; r < g.m; ++r)
    for (std::int64_t col = 0; col < g.n; ++col)
      detail::store_f32(g.c, g.c_type, r * g.ldc + col, c[r * g.n + col]);
}

// The product alone (g.epilogue is ignored).
void gemm_product(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0) return;
  // Note [GEMM signal mask]: once for the whole batch.
  const GemmLibrary library = current_library.load(std::memory_order_relaxed);
  std::optional<AsyncSignalsBlocked> quiet;
  if (library == GemmLibrary::onednn) quiet.emplace();
  GemmArgs one = g;
  for (std::int64_t i = 0; i < g.batch; ++i) {
    one.a = static_cast<const char*>(g.a) + i * g.stride_a * dtype_size(g.ab_type);
    one.b = static_cast<const char*>(g.b) + i * g.stride_b * dtype_size(g.ab_type);
    one.c = static_cast<char*>(g.c) + i * g.stride_c * dtype_size(g.c_type);
    gemm_one(library, one);
  }
}

// Zeroes an overwritten bias gradient, so that bias_grad's += sets it.
void start_bias_grad(const GemmArgs& g, std::int64_t length) {
  if (!g.bias_grad_accumulate) std::fill(g.bias_grad, g.bias_grad + length, 0.0f);
}

}  // namespace

// Note [gemm epilogues]: the unfused layers' ops in their order, so a fused
// Linear keeps the bits of Linear, GELU and their backward on the CPU.
void gemm(const GemmArgs& g) {
  validate_gemm(g);
  const std::int64_t elements = g.m * g.n;
  switch (g.epilogue) {
    case GemmEpilogue::none:
      gemm_product(g);
      return;
    case GemmEpilogue::bias:
      gemm_product(g);
      add_bias(g.c, g.c_type, g.bias, g.m, g.n);
      return;
    case GemmEpilogue::bias_gelu_aux: {
      GemmArgs pre = g;
      pre.c = g.aux;
      gemm_product(pre);
      add_bias(g.aux, g.c_type, g.bias, g.m, g.n);
      activation_forward(Activation::gelu_tanh, g.aux, g.c, g.c_type, elements);
      return;
    }
    case GemmEpilogue::dgelu_bgrad:
      gemm_product(g);
      activation_backward(Activation::gelu_tanh, g.c, g.aux, g.c, g.c_type, elements);
      start_bias_grad(g, g.n);
      bias_grad(g.c, g.c_type, g.m, g.n, g.bias_grad);
      return;
    case GemmEpilogue::bgrad_a:
      gemm_product(g);
      start_bias_grad(g, g.m);
      bias_grad(g.a, g.ab_type, g.k, g.m, g.bias_grad);
      return;
  }
}

void set_gemm_threads(int threads) {
  configured_threads.store(std::max(1, threads), std::memory_order_relaxed);
  std::call_once(openblas_default_threads, [] {});
  openblas_set_num_threads(std::max(1, threads));
}

int gemm_threads() { return configured_threads.load(std::memory_order_relaxed); }

const char* gemm_library_name(GemmLibrary library) {
  return library == GemmLibrary::onednn ? "oneDNN" : "OpenBLAS";
}

std::vector<GemmLibrary> gemm_libraries() {
#if LOCKSTEP_WITH_ONEDNN
  return {GemmLibrary::onednn, GemmLibrary::openblas};
#else
  return {GemmLibrary::openblas};
#endif
}

GemmLibrary gemm_library() { return current_library.load(std::memory_order_relaxed); }

namespace {
std::string libraries_text() {
  std::string text;
  for (GemmLibrary l : gemm_libraries()) {
    std::string name = gemm_library_name(l);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    text += (text.empty() ? "" : ", ") + name;
  }
  return text;
}
}  // namespace

void use_gemm_library(GemmLibrary library) {
  const std::vector<GemmLibrary> built = gemm_libraries();
  if (std::find(built.begin(), built.end(), library) == built.end())
    throw InvalidArgument(std::string("CPU GEMM library ") + gemm_library_name(library) +
                          " is not in this build (it has " + libraries_text() +
                          "; install libdnnl-dev and rebuild for oneDNN)");
  current_library.store(library, std::memory_order_relaxed);
}

GemmLibrary parse_gemm_library(const std::string& name, const std::string& what) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (GemmLibrary l : {GemmLibrary::onednn, GemmLibrary::openblas}) {
    std::string known = gemm_library_name(l);
    std::transform(known.begin(), known.end(), known.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (lower == known) {
      use_gemm_library(l);  // refuses one the build lacks, naming what it has
      return l;
    }
  }
  throw InvalidArgument(what + " '" + name + "' is not a CPU GEMM library; this build has " +
                        libraries_text());
}

void raw_sgemm(GemmLibrary library, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
               std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  std::optional<AsyncSignalsBlocked> quiet;  // Note [GEMM signal mask]
  if (library == GemmLibrary::onednn) quiet.emplace();
  library_sgemm(library, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Note [BLAS kernels].
CpuGemmKernels cpu_gemm_kernels() {
  CpuGemmKernels k;
#if LOCKSTEP_WITH_ONEDNN
  if (gemm_library() == GemmLibrary::onednn) {
    const dnnl_version_t* v = dnnl_version();
    k.library = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                std::to_string(v->patch);
    k.kernels = onednn_isa();
    return k;
  }
#endif
  const std::string config =
      openblas_get_config();  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
  const std::size_t version_end = config.find(' ', config.find(' ') + 1);
  k.library = config.substr(0, version_end);
  k.kernels = openblas_get_corename();
  // OpenBLAS's kernels for processors without AVX: what it falls back to.
  constexpr std::array<std::string_view, 12> generic{"Prescott",  "Core2",  "Penryn",  "Dunnington",
                                                     "Nehalem",   "Atom",   "Katmai",  "Coppermine",
                                                     "Northwood", "Banias", "Opteron", "Barcelona"};
  const bool fell_back = std::find(generic.begin(), generic.end(), k.kernels) != generic.end();
  __builtin_cpu_init();
  if (fell_back && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    k.better_coretype = "SkylakeX";
  else if (fell_back && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    k.better_coretype = "Haswell";
  return k;
}

std::string CpuGemmKernels::describe() const { return library + ", " + kernels + " kernels"; }

std::string CpuGemmKernels::advice() const {
  if (better_coretype.empty()) return {};
  return library + " does not recognise this processor and uses its generic " + kernels +
         " kernels, several times slower than this processor allows (Note [BLAS kernels]): start "
         "the program with OPENBLAS_CORETYPE=" +
         better_coretype + " in its environment (mpirun -x OPENBLAS_CORETYPE=" + better_coretype +
         ")";
}

}  // namespace lockstep::kernels::cpu
