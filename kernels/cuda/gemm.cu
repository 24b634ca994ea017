// CUDA GEMM on cuBLASLt (kernels/gemm.h). Row-major C = op(A) op(B) is computed
// as the column-major C^T = op(B)^T op(A)^T, so no data moves. Each distinct
// shape (sizes, strides, types, transposes, pointer alignment, epilogue) is
// planned once: descriptors and the algorithm (Note [timed gemm algorithms])
// are cached, so a training step makes no heuristic queries after the first.
//
// Note [timed gemm algorithms]: outside deterministic runs a new plan asks the
// heuristic for up to kTimedCandidates algorithms and times each on the
// caller's stream with events (one untimed run, then kTimedRuns timed), and
// keeps the fastest for the process; bench_gemm reached 68-69% of peak with
// the heuristic's first at the MLP shapes. Products under kTimedMinFlops keep
// the heuristic's first. Deterministic runs keep the
// heuristic's first (the same choice on every rank and every run). No timing
// while the stream is being captured into a CUDA graph (events cannot be
// waited on then): such a plan keeps the heuristic's first. Timing writes the
// outputs the real call then overwrites; with beta != 0 (C is read) it writes
// D into a scratch copy of C's extent taken with cudaMallocAsync, and keeps
// the heuristic's first if that allocation fails. The first use of a shape
// therefore waits for the stream once. A shape planned again for buffers of
// another alignment takes the algorithm timed first where the heuristic offers
// it there too: one process then gives a shape one algorithm, and the same
// bits, whichever buffers it runs on (ZeRO's gathered copies, say), as the
// heuristic's first did before. Ranks time apart and may choose differently;
// rank-invariant runs are deterministic, so the heuristic's first.
//
// Note [deterministic gemm]: with kernels::deterministic() (--deterministic,
// --rank-invariant) the heuristic may only offer algorithms whose split-K
// reduction is none or in place (mask CUBLASLT_REDUCTION_SCHEME_INPLACE; NONE
// is 0, no bit: the parts are added in the output buffer in a sequence
// cuBLASLt's counters fix), never one that reduces in a separate pass over a
// workspace of the compute or output type.
// The setting is part of the plan's key, so each setting keeps its own plans;
// a shape gets one algorithm per setting, the same on every rank of a job on
// one GPU model (the key holds the shape and the workspace, not the rank).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/activation.h"
#include "kernels/bias.h"
#include "kernels/conv.h"
#include "kernels/cuda/check.h"
#include "kernels/elementwise.h"
#include "kernels/fusion.h"
#include "kernels/gemm.h"

namespace lockstep::kernels::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

// The largest power of two up to 256 that divides the address: cuBLASLt only
// offers algorithms whose alignment needs the buffers meet.
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// Every matrix of a strided batch must meet the alignment: the base's and the
// stride's (in bytes) together.
std::uint32_t alignment_of(const void* p, std::int64_t stride, DType type) {
  const auto stride_bytes = static_cast<std::uintptr_t>(stride) * dtype_size(type);
  return std::min(alignment_of(p), alignment_of(reinterpret_cast<const void*>(stride_bytes)));
}

constexpr int kTimedCandidates = 8;
constexpr int kTimedRuns = 3;
// Products smaller than this (2 m n k batch) keep the heuristic's first: at
// ~650 TF/s they take under 2 us, and timing costs a wait for the stream per
// shape (generate_greedy plans ~8 new shapes per token).
constexpr double kTimedMinFlops = 1e9;
// Epilogue scratch (the bias in C's type, an accumulating bias gradient) sits
// at the workspace's start in a whole number of these, so cuBLASLt's part
// keeps the workspace's alignment.
constexpr std::size_t kScratchAlign = 256;

struct PlanKey {
  int device;
  bool trans_a, trans_b;
  std::int64_t m, n, k, lda, ldb, ldc;
  DType ab_type, c_type;
  std::uint32_t align_a, align_b, align_c;
  std::size_t workspace_bytes;
  std::int64_t batch, stride_a, stride_b, stride_c;
  bool deterministic;  // Note [deterministic gemm]
  GemmEpilogue epilogue;
  std::uint32_t align_bias, align_aux;  // the heuristic reads both pointers' alignment
  auto tie() const {
    return std::tie(device, trans_a, trans_b, m, n, k, lda, ldb, ldc, ab_type, c_type, align_a,
                    align_b, align_c, workspace_bytes, batch, stride_a, stride_b, stride_c,
                    deterministic, epilogue, align_bias, align_aux);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  // Epilogue plans: whether cuBLASLt runs it (else the separate kernels), and
  // whether the bias is handed over in C's type (no algorithm took an f32 one).
  std::atomic<bool> fused{false};
  bool bias_in_c_type = false;
  std::string fallback_reason;
  std::string description;  // Note [timed gemm algorithms]
  // The epilogue's pointers are descriptor attributes, set per call.
  std::mutex call_mutex;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct Cache {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;  // one per device, never destroyed (see below)
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::array<GemmEpilogueCounts, 5> counts;  // Note [epilogue fallback]
  // The timed choice per shape, whatever the buffers' alignment (Note [timed
  // gemm algorithms]).
  std::map<PlanKey, cublasLtMatmulAlgo_t> timed;
  std::atomic<bool> timing{true};
};

// Leaked on purpose: cuBLASLt handles must not be destroyed after the CUDA
// runtime has shut down, which static destructors cannot guarantee.
Cache& cache() {
  static Cache* instance = [] { return new Cache; }();
  return *instance;
}

// Strided batches: `count` matrices, `stride` elements apart.
void set_batch(cublasLtMatrixLayout_t layout, std::int64_t count, std::int64_t stride) {
  const auto batch = static_cast<std::int32_t>(count);
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &batch, sizeof batch));
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(op, attribute, &value, sizeof value));
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::bias_gelu_aux:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::dgelu_bgrad:
      return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GemmEpilogue::bgrad_a:
      return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our A (file comment)
    case GemmEpilogue::none:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool has_aux(GemmEpilogue e) {
  return e == GemmEpilogue::bias_gelu_aux || e == GemmEpilogue::dgelu_bgrad;
}
bool is_bias_grad(GemmEpilogue e) {
  return e == GemmEpilogue::dgelu_bgrad || e == GemmEpilogue::bgrad_a;
}
// Length of the epilogue's bias (gradient) vector.
std::int64_t vector_length(const GemmArgs& g) {
  return g.epilogue == GemmEpilogue::bgrad_a ? g.m : g.n;
}
std::size_t scratch_bytes(const GemmArgs& g) {
  const auto bytes = static_cast<std::size_t>(vector_length(g)) * sizeof(float);
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

// The pointers and the workspace of one call, as the plan's epilogue takes them.
struct CallPointers {
  const void* bias = nullptr;  // bias, its C-type copy, bias_grad or its scratch
  void* aux = nullptr;
  void* workspace = nullptr;  // cuBLASLt's part
  std::size_t workspace_bytes = 0;
  void* scratch = nullptr;  // the workspace's start (scratch_bytes)
};

std::string shape_text(const PlanKey& key) {
  std::string text = "m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
                     " k=" + std::to_string(key.k) + (key.trans_a ? " Ta" : "") +
                     (key.trans_b ? " Tb" : "") + " " + dtype_name(key.ab_type) + "->" +
                     dtype_name(key.c_type);
  if (key.batch > 1) text += " batch=" + std::to_string(key.batch);
  if (key.epilogue != GemmEpilogue::none)
    text += std::string(" epilogue=") + gemm_epilogue_name(key.epilogue);
  return text;
}

// Builds the descriptor for `epilogue` (DEFAULT when none) and asks the
// heuristic; returns how many algorithms it offered.
int query(cublasLtHandle_t handle, Plan& plan, const PlanKey& key, GemmEpilogue epilogue,
          bool bias_in_c_type, const CallPointers& p,
          std::vector<cublasLtMatmulHeuristicResult_t>& results) {
  if (plan.op) {
    cublasLtMatmulDescDestroy(plan.op);
    plan.op = nullptr;
  }
  // Column-major view (see the file comment): Lt's A is our B, Lt's B is our A.
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_desc(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  if (epilogue != GemmEpilogue::none) {
    set_desc(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE,
             static_cast<std::uint32_t>(lt_epilogue(epilogue)));
    // Note [epilogue fallback]: the bias and the bias gradient are f32; a bias
    // may be handed over in C's type instead, a gradient never (rounded to
    // bf16 it would lose what the f64 column sums keep).
    const auto vector_type =
        static_cast<std::int32_t>(bias_in_c_type ? cuda_type(key.c_type) : CUDA_R_32F);
    set_desc(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, vector_type);
    set_desc(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (has_aux(epilogue)) {
      // cuBLASLt's view of aux is C^T: n rows, ld in elements, a multiple of 8.
      set_desc(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
      // Its type is C's (AUX_DATA_TYPE's default), as the CPU twin keeps it.
      set_desc(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, std::int64_t{key.n});
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                  decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_guard(pref, cublasLtMatmulPreferenceDestroy);
  const std::uint64_t max_workspace = key.workspace_bytes;
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof max_workspace));
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_b, sizeof key.align_b));
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_a, sizeof key.align_a));
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof key.align_c));
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof key.align_c));
  if (key.deterministic) {  // Note [deterministic gemm]
    const std::uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_INPLACE;
    LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  }
  results.assign(kTimedCandidates, cublasLtMatmulHeuristicResult_t{});
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, plan.op, plan.a, plan.b, plan.c, plan.c, pref,
                                     kTimedCandidates, results.data(), &found);
  // An epilogue cuBLASLt cannot do for these types may answer NOT_SUPPORTED
  // (or INVALID_VALUE) rather than no results: all mean "take the separate
  // kernels"; the product alone keeps the error.
  if (status != CUBLAS_STATUS_SUCCESS && epilogue != GemmEpilogue::none) return 0;
  LOCKSTEP_CHECK_CUBLAS(status);
  results.resize(static_cast<std::size_t>(found));
  results.erase(std::remove_if(results.begin(), results.end(),
                               [&](const cublasLtMatmulHeuristicResult_t& r) {
                                 return r.state != CUBLAS_STATUS_SUCCESS ||
                                        r.workspaceSize > key.workspace_bytes;
                               }),
                results.end());
  return static_cast<int>(results.size());
}

// What one timed or real call needs besides the plan.
struct Operands {
  const GemmArgs* g;
  CallPointers p;
  CudaStream stream;
};

cublasStatus_t run(cublasLtHandle_t handle, Plan& plan, const cublasLtMatmulAlgo_t& algo,
                   const Operands& o, void* d) {
  const GemmArgs& g = *o.g;
  return cublasLtMatmul(handle, plan.op, &g.alpha, g.b, plan.a, g.a, plan.b, &g.beta, g.c, plan.c,
                        d, plan.c, &algo, o.p.workspace, o.p.workspace_bytes, o.stream);
}

// A plan's key without the buffers' alignments: the shape whose timed
// choice every alignment's plan reuses where its candidates include it.
PlanKey shape_only(PlanKey key) {
  key.align_a = key.align_b = key.align_c = key.align_bias = key.align_aux = 0;
  return key;
}

// Note [timed gemm algorithms]. Returns the index of the fastest candidate
// and describes the choice. `earlier`: the algorithm timed for this shape at
// another alignment, taken again where it is a candidate, so that one process
// gives a shape the same algorithm (and bits) whichever buffers it runs on.
std::size_t time_candidates(cublasLtHandle_t handle, Plan& plan, const PlanKey& key,
                            const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                            const Operands& o, bool timing_on, const cublasLtMatmulAlgo_t* earlier,
                            std::string& description) {
  const std::string count = std::to_string(candidates.size());
  if (key.deterministic) {
    description = "heuristic first of " + count + " (deterministic)";
    return 0;
  }
  if (!timing_on || candidates.size() < 2) {
    description = "heuristic first of " + count + (timing_on ? "" : " (timing off)");
    return 0;
  }
  if (2.0 * static_cast<double>(key.m) * static_cast<double>(key.n) * static_cast<double>(key.k) *
          static_cast<double>(key.batch) <
      kTimedMinFlops) {
    description = "heuristic first of " + count + " (under 1 GFLOP: not timed)";
    return 0;
  }
  for (std::size_t i = 0; earlier && i < candidates.size(); ++i)
    if (std::memcmp(&candidates[i].algo, earlier, sizeof *earlier) == 0) {
      description = "#" + std::to_string(i) + " of " + count + ", as timed at another alignment";
      return i;
    }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LOCKSTEP_CHECK_CUDA(cudaStreamIsCapturing(o.stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    description = "heuristic first of " + count + " (stream capturing)";
    return 0;
  }
  const GemmArgs& g = *o.g;
  void* d = g.c;
  if (g.beta != 0.0f) {  // C is read: time into a scratch D of C's extent
    const auto bytes =
        static_cast<std::size_t>((g.batch - 1) * g.stride_c + g.m * g.ldc) * dtype_size(g.c_type);
    if (cudaMallocAsync(&d, bytes, o.stream) != cudaSuccess) {
      cudaGetLastError();  // clear it: the plan works without timing
      description = "heuristic first of " + count + " (no memory to time with beta != 0)";
      return 0;
    }
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  LOCKSTEP_CHECK_CUDA(cudaEventCreate(&start));
  LOCKSTEP_CHECK_CUDA(cudaEventCreate(&stop));
  std::size_t best = 0;
  float best_ms = -1.0f, first_ms = -1.0f;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (run(handle, plan, candidates[i].algo, o, d) != CUBLAS_STATUS_SUCCESS) continue;
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(start, o.stream));
    bool ok = true;
    for (int r = 0; r < kTimedRuns && ok; ++r)
      ok = run(handle, plan, candidates[i].algo, o, d) == CUBLAS_STATUS_SUCCESS;
    LOCKSTEP_CHECK_CUDA(cudaEventRecord(stop, o.stream));
    LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0.0f;
    LOCKSTEP_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (!ok) continue;
    ms /= kTimedRuns;
    if (i == 0) first_ms = ms;
    if (best_ms < 0.0f || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (d != g.c) LOCKSTEP_CHECK_CUDA(cudaFreeAsync(d, o.stream));
  if (best_ms < 0.0f) {  // none ran: the real call says why (gemm())
    description = "heuristic first of " + count + " (no candidate ran when timed)";
    return 0;
  }
  char text[160];
  std::snprintf(text, sizeof text, "timed %s: #%zu %.4f ms (heuristic first %.4f ms)",
                count.c_str(), best, static_cast<double>(best_ms), static_cast<double>(first_ms));
  description = text;
  return best;
}

// Plans the product with key.epilogue fused where cuBLASLt offers it (first
// with an f32 bias, then a bias in C's type in the scratch), else the product
// alone.
std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const PlanKey& key, const Operands& o,
                                bool timing_on,
                                std::map<PlanKey, cublasLtMatmulAlgo_t>& timed_algos) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t ab = cuda_type(key.ab_type), c = cuda_type(key.c_type);
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, ab, key.trans_b ? key.k : key.n,
                                                   key.trans_b ? key.n : key.k, key.ldb));
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, ab, key.trans_a ? key.m : key.k,
                                                   key.trans_a ? key.k : key.m, key.lda));
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan->c, c, key.n, key.m, key.ldc));
  if (key.batch > 1) {
    set_batch(plan->a, key.batch, key.stride_b);
    set_batch(plan->b, key.batch, key.stride_a);
    set_batch(plan->c, key.batch, key.stride_c);
  }
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  Operands timed = o;
  // The product alone, or first with the epilogue and an f32 bias.
  int found = query(handle, *plan, key, key.epilogue, false, o.p, candidates);
  if (key.epilogue != GemmEpilogue::none) {
    const bool forward_bias =
        key.epilogue == GemmEpilogue::bias || key.epilogue == GemmEpilogue::bias_gelu_aux;
    if (found == 0 && forward_bias && key.c_type != DType::f32) {
      timed.p.bias = o.p.scratch;
      found = query(handle, *plan, key, key.epilogue, true, timed.p, candidates);
      plan->bias_in_c_type = found > 0;
      if (plan->bias_in_c_type) {  // what the timed runs read
        cast(o.g->bias, DType::f32, o.p.scratch, key.c_type, key.n, o.stream);
        plan->description = std::string("bias in ") + dtype_name(key.c_type) + "; ";
      }
    }
    plan->fused = found > 0;
    if (!plan->fused) {  // gemm() runs the separate kernels, whose product has its own plan
      plan->fallback_reason = "no algorithm";
      plan->description = shape_text(key) + ": no cuBLASLt algorithm, separate kernels";
      return plan;
    }
  }
  if (found == 0) {
    throw LibraryError("cuBLAS", CUBLAS_STATUS_NOT_SUPPORTED,
                       "cuBLASLt has no algorithm for gemm " + shape_text(key) +
                           (key.deterministic ? " in deterministic mode" : "") +
                           " (check leading dimensions and buffer alignment)");
  }
  std::string chosen;
  const auto earlier = timed_algos.find(shape_only(key));
  const std::size_t best =
      time_candidates(handle, *plan, key, candidates, timed, timing_on,
                      earlier == timed_algos.end() ? nullptr : &earlier->second, chosen);
  plan->algo = candidates[best].algo;
  if (chosen.rfind("timed", 0) == 0) timed_algos.emplace(shape_only(key), plan->algo);
  plan->description = shape_text(key) + ": " + plan->description + chosen;
  return plan;
}

void count(GemmEpilogue e, bool fused, const std::string& reason) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  GemmEpilogueCounts& n = c.counts[static_cast<std::size_t>(e)];
  if (fused) {
    ++n.fused;
  } else {
    ++n.fallback;
    n.last_fallback_reason = reason;
  }
}

// The plan of `g`'s product with `epilogue` (none: the product alone), made
// on first use.
Plan& find_plan(const GemmArgs& g, GemmEpilogue epilogue, const CallPointers& p, CudaStream stream,
                cublasLtHandle_t& handle) {
  int device = 0;
  LOCKSTEP_CHECK_CUDA(cudaGetDevice(&device));
  const PlanKey key{device,
                    g.trans_a,
                    g.trans_b,
                    g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.ldb,
                    g.ldc,
                    g.ab_type,
                    g.c_type,
                    alignment_of(g.a, g.batch > 1 ? g.stride_a : 0, g.ab_type),
                    alignment_of(g.b, g.batch > 1 ? g.stride_b : 0, g.ab_type),
                    alignment_of(g.c, g.batch > 1 ? g.stride_c : 0, g.c_type),
                    p.workspace_bytes,
                    g.batch,
                    g.batch > 1 ? g.stride_a : 0,
                    g.batch > 1 ? g.stride_b : 0,
                    g.batch > 1 ? g.stride_c : 0,
                    deterministic(),
                    epilogue,
                    epilogue == GemmEpilogue::none ? 0u : alignment_of(p.bias),
                    has_aux(epilogue) ? alignment_of(p.aux) : 0u};
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto h = c.handles.find(device);
  if (h == c.handles.end()) {
    cublasLtHandle_t created;
    LOCKSTEP_CHECK_CUBLAS(cublasLtCreate(&created));
    h = c.handles.emplace(device, created).first;
  }
  handle = h->second;
  auto found = c.plans.find(key);
  if (found == c.plans.end())
    found = c.plans.emplace(key, make_plan(handle, key, Operands{&g, p, stream}, c.timing, c.timed))
                .first;
  return *found->second;
}

// One call of a plan: its epilogue's pointers (when fused) into the
// descriptor, then the product. A fused plan's refusal is returned (cuBLASLt
// checks before it launches, so nothing was written); the product alone's throws.
cublasStatus_t call_plan(cublasLtHandle_t handle, Plan& plan, const GemmArgs& g,
                         GemmEpilogue epilogue, const CallPointers& p, CudaStream stream) {
  std::lock_guard<std::mutex> call(plan.call_mutex);
  if (plan.fused) {
    set_desc(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
    if (has_aux(epilogue)) set_desc(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux);
    return run(handle, plan, plan.algo, Operands{&g, p, stream}, g.c);
  }
  LOCKSTEP_CHECK_CUBLAS(run(handle, plan, plan.algo, Operands{&g, p, stream}, g.c));
  return CUBLAS_STATUS_SUCCESS;
}

// The product alone as today's path: cuBLASLt, or k = 0 row by row.
void plain_gemm(const GemmArgs& g, void* workspace, std::size_t workspace_bytes,
                CudaStream stream) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // cuBLASLt rejects k = 0; C = beta C row by row
    for (std::int64_t row = 0; row < g.m * g.batch; ++row) {
      const std::int64_t offset = row / g.m * g.stride_c + row % g.m * g.ldc;
      void* c_row = static_cast<char*>(g.c) + offset * dtype_size(g.c_type);
      if (g.beta == 0.0f)
        fill(c_row, g.c_type, g.n, 0.0, stream);
      else
        scale(c_row, g.c_type, g.n, g.beta, stream);
    }
    return;
  }
  const CallPointers p{nullptr, nullptr, workspace, workspace_bytes, nullptr};
  cublasLtHandle_t handle;
  Plan& plan = find_plan(g, GemmEpilogue::none, p, stream, handle);
  call_plan(handle, plan, g, GemmEpilogue::none, p, stream);
}

// Note [epilogue fallback]: an epilogue (Note [gemm epilogues]) runs fused in
// cuBLASLt unless one of these holds, and then runs as the separate kernels
// below, in the CPU twin's order (kernels/cpu/gemm.cpp): the unfused Linear,
// GELU and bias-gradient kernels as they ran before the epilogues.
// - the fusion switch off (kernels::set_fused_kernels, Note [one fusion
//   switch]: "fusions off"), or an empty product ("empty");
// - a bias gradient under kernels::deterministic() ("deterministic"): the f64
//   column sums keep bits that depend on the shape alone (Note [column
//   chunks]), where cuBLASLt's reduction order is its algorithm's;
// - GELU or its derivative into an f32 C ("f32 GELU"): cuBLASLt does not say
//   how it evaluates tanh (CUTLASS's epilogues use the hardware tanh.approx,
//   2^-11 relative), which f16/bf16 rounding (2^-11, 2^-8) covers but an f32
//   run, held to the CPU within 1e-4 by the [gpu] tests, would not;
// - a GELU aux whose ld (n) is not a multiple of 8, as cuBLASLt requires, or
//   an aux or bias pointer not 16-byte aligned;
// - no algorithm: the heuristic offers none (or refuses the descriptor) with an
//   f32 bias, nor, for a forward bias into f16/bf16, with the bias in C's type
//   (cast per call into the workspace's scratch; a bias gradient is never
//   taken in a 16-bit type).
// The bias gradient an epilogue writes overwrites its buffer; an accumulating
// call (micro-batches after the first) has it written to the scratch and then
// added to the f32 gradient, one f32 add per element. gemm_epilogue_counts()
// says how often each epilogue ran either way and the last reason, and
// gemm_plan_descriptions() which algorithm each plan holds.
void separate_kernels(const GemmArgs& g, void* workspace, std::size_t workspace_bytes,
                      CudaStream stream) {
  GemmArgs product = g;
  product.epilogue = GemmEpilogue::none;
  const std::int64_t elements = g.m * g.n;
  auto bias_gradient = [&](const void* rows_buffer, DType type, std::int64_t rows,
                           std::int64_t cols) {
    if (cols == 0) return;
    if (!g.bias_grad_accumulate) fill(g.bias_grad, DType::f32, cols, 0.0, stream);
    const std::size_t needed = bias_grad_workspace_bytes(rows, cols);
    if (needed > workspace_bytes)
      throw InvalidArgument("gemm epilogue " + std::string(gemm_epilogue_name(g.epilogue)) +
                            ": the bias gradient's column sums need " + std::to_string(needed) +
                            " bytes of workspace, the caller gave " +
                            std::to_string(workspace_bytes));
    bias_grad(rows_buffer, type, rows, cols, g.bias_grad, workspace, stream);
  };
  switch (g.epilogue) {
    case GemmEpilogue::none:
      plain_gemm(product, workspace, workspace_bytes, stream);
      return;
    case GemmEpilogue::bias:
      plain_gemm(product, workspace, workspace_bytes, stream);
      add_bias(g.c, g.c_type, g.bias, g.m, g.n, stream);
      return;
    case GemmEpilogue::bias_gelu_aux:
      product.c = g.aux;
      plain_gemm(product, workspace, workspace_bytes, stream);
      add_bias(g.aux, g.c_type, g.bias, g.m, g.n, stream);
      activation_forward(Activation::gelu_tanh, g.aux, g.c, g.c_type, elements, stream);
      return;
    case GemmEpilogue::dgelu_bgrad:
      plain_gemm(product, workspace, workspace_bytes, stream);
      activation_backward(Activation::gelu_tanh, g.c, g.aux, g.c, g.c_type, elements, stream);
      bias_gradient(g.c, g.c_type, g.m, g.n);
      return;
    case GemmEpilogue::bgrad_a:
      plain_gemm(product, workspace, workspace_bytes, stream);
      bias_gradient(g.a, g.ab_type, g.k, g.m);
      return;
  }
}

// Why `g`'s epilogue cannot be fused whatever cuBLASLt offers; "" if it may be.
std::string static_fallback_reason(const GemmArgs& g, std::size_t workspace_bytes) {
  if (!kernels::fused_kernels()) return "fusions off";
  if (g.m == 0 || g.n == 0 || g.k == 0) return "empty";
  // Note [deterministic gemm]: the bias gradient keeps the f64 column sums
  // (Note [column chunks]), whose bits depend on the shape alone; cuBLASLt's
  // reduction is deterministic for one algorithm but its order is its own.
  if (deterministic() && is_bias_grad(g.epilogue)) return "deterministic";
  if (has_aux(g.epilogue) && g.c_type == DType::f32) return "f32 GELU";
  if (has_aux(g.epilogue) && g.n % 8 != 0)
    return "aux ld " + std::to_string(g.n) + " not a multiple of 8";
  if (has_aux(g.epilogue) && alignment_of(g.aux) < 16) return "aux not 16-byte aligned";
  const void* vector = is_bias_grad(g.epilogue) ? static_cast<const void*>(g.bias_grad) : g.bias;
  if (alignment_of(vector) < 16) return "bias (gradient) not 16-byte aligned";
  if (workspace_bytes < 2 * scratch_bytes(g)) return "workspace too small";
  return "";
}

}  // namespace

void gemm(const GemmArgs& g, void* workspace, std::size_t workspace_bytes, CudaStream stream) {
  validate_gemm(g);
  if (g.epilogue == GemmEpilogue::none) {
    plain_gemm(g, workspace, workspace_bytes, stream);
    return;
  }
  // Note [gemm epilogues], Note [epilogue fallback].
  const std::string reason = static_fallback_reason(g, workspace_bytes);
  if (!reason.empty()) {
    count(g.epilogue, false, reason);
    separate_kernels(g, workspace, workspace_bytes, stream);
    return;
  }
  // The scratch at the workspace's start: the bias in C's type, or the bias
  // gradient of an accumulating call; cuBLASLt gets the rest.
  const std::size_t scratch = scratch_bytes(g);
  CallPointers p{nullptr, g.aux, static_cast<char*>(workspace) + scratch, workspace_bytes - scratch,
                 workspace};
  const bool accumulate_scratch = is_bias_grad(g.epilogue) && g.bias_grad_accumulate;
  if (is_bias_grad(g.epilogue))
    p.bias = accumulate_scratch ? p.scratch : g.bias_grad;
  else
    p.bias = g.bias;
  cublasLtHandle_t handle;
  Plan& plan = find_plan(g, g.epilogue, p, stream, handle);
  if (plan.fused && plan.bias_in_c_type) {
    cast(g.bias, DType::f32, p.scratch, g.c_type, g.n, stream);
    p.bias = p.scratch;
  }
  const cublasStatus_t status =
      plan.fused ? call_plan(handle, plan, g, g.epilogue, p, stream) : CUBLAS_STATUS_SUCCESS;
  if (status != CUBLAS_STATUS_SUCCESS) {  // the heuristic offered what the call refuses
    std::lock_guard<std::mutex> lock(cache().mutex);
    plan.fused = false;
    plan.fallback_reason =
        std::string("cuBLASLt refused the call (") + cublasLtGetStatusName(status) + ")";
    plan.description += "; then " + plan.fallback_reason + ", separate kernels";
  }
  count(g.epilogue, plan.fused, plan.fallback_reason);
  if (!plan.fused) {
    separate_kernels(g, workspace, workspace_bytes, stream);
    return;
  }
  if (accumulate_scratch)
    add(g.bias_grad, p.scratch, g.bias_grad, DType::f32, vector_length(g), stream);
}

std::vector<GemmEpilogueCounts> gemm_epilogue_counts() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {c.counts.begin(), c.counts.end()};
}

void reset_gemm_epilogue_counts() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.counts = {};
}

void set_gemm_timing(bool on) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.timing = on;
}

std::vector<std::string> gemm_plan_descriptions() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::vector<std::string> lines;
  for (const auto& [key, plan] : c.plans) lines.push_back(plan->description);
  return lines;
}

}  // namespace lockstep::kernels::cuda
