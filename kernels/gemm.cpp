// Argument checks shared by the CPU and CUDA GEMMs (kernels/gemm.h).
#include <algorithm>
#include <string>

#include "kernels/error.h"
#include "kernels/gemm.h"

namespace lockstep::kernels {

void validate_gemm(const GemmArgs& g) {
  auto fail = [](const std::string& what) { throw InvalidArgument("gemm: " + what); };
  if (!is_floating(g.ab_type))
    fail(std::string("A/B dtype ") + dtype_name(g.ab_type) + " is not f32, f16 or bf16");
  if (g.c_type != DType::f32 && g.c_type != g.ab_type)
    fail(std::string("C dtype ") + dtype_name(g.c_type) + " must be f32 or the input dtype " +
         dtype_name(g.ab_type));
  if (g.m < 0 || g.n < 0 || g.k < 0)
    fail("negative size m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) +
         " k=" + std::to_string(g.k));
  const std::int64_t a_cols = g.trans_a ? g.m : g.k;
  const std::int64_t b_cols = g.trans_b ? g.k : g.n;
  if (g.lda < std::max<std::int64_t>(1, a_cols))
    fail("lda=" + std::to_string(g.lda) + " is smaller than A's row length " +
         std::to_string(a_cols));
  if (g.ldb < std::max<std::int64_t>(1, b_cols))
    fail("ldb=" + std::to_string(g.ldb) + " is smaller than B's row length " +
         std::to_string(b_cols));
  if (g.ldc < std::max<std::int64_t>(1, g.n))
    fail("ldc=" + std::to_string(g.ldc) + " is smaller than C's row length " + std::to_string(g.n));
  if (g.batch < 1) fail("batch=" + std::to_string(g.batch) + " must be at least 1");
  // The batches' outputs are apart when stacked (a stride of at least m
  // rows) or side by side in each row of C (heads in a row of attention's
  // output, Note [heads in place] in engine/nn/attention.cpp).
  const bool stacked = g.stride_c >= g.m * g.ldc;
  const bool side_by_side = g.stride_c >= g.n && (g.batch - 1) * g.stride_c + g.n <= g.ldc;
  if (g.batch > 1 && (g.stride_a < 0 || g.stride_b < 0 || !(stacked || side_by_side)))
    fail("batch strides a=" + std::to_string(g.stride_a) + " b=" + std::to_string(g.stride_b) +
         " c=" + std::to_string(g.stride_c) +
         " must be non-negative, and C's must keep the batches' outputs apart (at least m*ldc=" +
         std::to_string(g.m * g.ldc) + ", or at least n=" + std::to_string(g.n) +
         " with all batches' columns inside ldc=" + std::to_string(g.ldc) + ")");
  if (g.m > 0 && g.n > 0 && (!g.c || (g.k > 0 && (!g.a || !g.b)))) fail("null data pointer");
  if (g.epilogue == GemmEpilogue::none) return;
  // Note [gemm epilogues].
  const std::string epilogue = std::string("epilogue ") + gemm_epilogue_name(g.epilogue);
  if (g.batch != 1 || g.ldc != std::max<std::int64_t>(1, g.n))
    fail(epilogue + " needs batch=1 and a dense C, got batch=" + std::to_string(g.batch) +
         " ldc=" + std::to_string(g.ldc) + " n=" + std::to_string(g.n));
  const bool empty = g.m == 0 || g.n == 0;
  switch (g.epilogue) {
    case GemmEpilogue::bias:
      if (!g.bias && !empty) fail(epilogue + " needs a bias pointer");
      break;
    case GemmEpilogue::bias_gelu_aux:
    case GemmEpilogue::dgelu_bgrad:
      if (g.beta != 0.0f)
        fail(epilogue + " needs beta=0, got beta=" + std::to_string(g.beta) +
             " (accumulate into a separate buffer)");
      if (!empty &&
          (!g.aux || (g.epilogue == GemmEpilogue::bias_gelu_aux ? !g.bias : !g.bias_grad)))
        fail(epilogue + " needs the aux buffer and the " +
             (g.epilogue == GemmEpilogue::bias_gelu_aux ? "bias" : "bias gradient") + " pointer");
      break;
    case GemmEpilogue::bgrad_a:
      if (!g.trans_a || g.lda != std::max<std::int64_t>(1, g.m))
        fail(epilogue + " sums A stored [k, m] densely (trans_a, lda=m), got trans_a=" +
             std::to_string(g.trans_a) + " lda=" + std::to_string(g.lda) +
             " m=" + std::to_string(g.m));
      if (!g.bias_grad && g.m > 0) fail(epilogue + " needs the bias gradient pointer");
      break;
    case GemmEpilogue::none:
      break;
  }
}

const char* gemm_epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::bias:
      return "bias";
    case GemmEpilogue::bias_gelu_aux:
      return "bias_gelu_aux";
    case GemmEpilogue::dgelu_bgrad:
      return "dgelu_bgrad";
    case GemmEpilogue::bgrad_a:
      return "bgrad_a";
    case GemmEpilogue::none:
      break;
  }
  return "none";
}

}  // namespace lockstep::kernels
