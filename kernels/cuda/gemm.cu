// CUDA GEMM on cuBLASLt (kernels/gemm.h). Row-major C = op(A) op(B) is computed
// as the column-major C^T = op(B)^T op(A)^T, so no data moves. Each distinct
// shape (sizes, strides, types, transposes, pointer alignment) is planned once:
// descriptors and the heuristic's first algorithm are cached, so a training
// step makes no heuristic queries after the first.
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
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/conv.h"
#include "kernels/cuda/check.h"
#include "kernels/elementwise.h"
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

struct PlanKey {
  int device;
  bool trans_a, trans_b;
  std::int64_t m, n, k, lda, ldb, ldc;
  DType ab_type, c_type;
  std::uint32_t align_a, align_b, align_c;
  std::size_t workspace_bytes;
  std::int64_t batch, stride_a, stride_b, stride_c;
  bool deterministic;  // Note [deterministic gemm]
  auto tie() const {
    return std::tie(device, trans_a, trans_b, m, n, k, lda, ldb, ldc, ab_type, c_type, align_a,
                    align_b, align_c, workspace_bytes, batch, stride_a, stride_b, stride_c,
                    deterministic);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
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
};

// Leaked on purpose: cuBLASLt handles must not be destroyed after the CUDA
// runtime has shut down, which static destructors cannot guarantee.
Cache& cache() {
  static Cache* instance = new Cache;
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

std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const PlanKey& key) {
  auto plan = std::make_unique<Plan>();
  // Column-major view (see the file comment): Lt's A is our B, Lt's B is our A.
  const cublasOperation_t op_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LOCKSTEP_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  LOCKSTEP_CHECK_CUBLAS(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
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

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->a, plan->b, plan->c,
                                                       plan->c, pref, 1, &result, &found));
  if (found == 0) {
    throw LibraryError("cuBLAS", CUBLAS_STATUS_NOT_SUPPORTED,
                       "cuBLASLt has no algorithm for gemm m=" + std::to_string(key.m) +
                           " n=" + std::to_string(key.n) + " k=" + std::to_string(key.k) + " " +
                           dtype_name(key.ab_type) + "->" + dtype_name(key.c_type) +
                           (key.deterministic ? " in deterministic mode" : "") +
                           " (check leading dimensions and buffer alignment)");
  }
  plan->algo = result.algo;
  return plan;
}

}  // namespace

void gemm(const GemmArgs& g, void* workspace, std::size_t workspace_bytes, CudaStream stream) {
  validate_gemm(g);
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
                    workspace_bytes,
                    g.batch,
                    g.batch > 1 ? g.stride_a : 0,
                    g.batch > 1 ? g.stride_b : 0,
                    g.batch > 1 ? g.stride_c : 0,
                    deterministic()};
  Cache& c = cache();
  cublasLtHandle_t handle;
  const Plan* plan;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto h = c.handles.find(device);
    if (h == c.handles.end()) {
      cublasLtHandle_t created;
      LOCKSTEP_CHECK_CUBLAS(cublasLtCreate(&created));
      h = c.handles.emplace(device, created).first;
    }
    handle = h->second;
    auto p = c.plans.find(key);
    if (p == c.plans.end()) p = c.plans.emplace(key, make_plan(handle, key)).first;
    plan = p->second.get();
  }
  LOCKSTEP_CHECK_CUBLAS(cublasLtMatmul(handle, plan->op, &g.alpha, g.b, plan->a, g.a, plan->b,
                                       &g.beta, g.c, plan->c, g.c, plan->c, &plan->algo, workspace,
                                       workspace_bytes, stream));
}

}  // namespace lockstep::kernels::cuda
