// CPU GEMM: cblas_sgemm (OpenBLAS) on f32; f16/bf16 operands are widened to
// f32 scratch first, since OpenBLAS 0.3.21 has no half-precision GEMM.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/detail/cpu_float.h"
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

void sgemm(const GemmArgs& g, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
           float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(g.m),
              static_cast<blasint>(g.n), static_cast<blasint>(g.k), g.alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), g.beta, c,
              static_cast<blasint>(ldc));
}

// One GEMM of a batch (g.batch is ignored).
void gemm_one(const GemmArgs& g) {
  if (g.ab_type == DType::f32) {
    sgemm(g, static_cast<const float*>(g.a), g.lda, static_cast<const float*>(g.b), g.ldb,
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
    sgemm(g, a.data(), lda, b.data(), ldb, static_cast<float*>(g.c), g.ldc);
    return;
  }
  // 16-bit C: compute in f32 (reading C only when beta needs it), round once.
  std::vector<float> c = g.beta != 0.0f ? widen(g.c, g.c_type, g.m, g.n, g.ldc)
                                        : std::vector<float>(static_cast<std::size_t>(g.m * g.n));
  sgemm(g, a.data(), lda, b.data(), ldb, c.data(), g.n);
  for (std::int64_t r = 0; r < g.m; ++r)
    for (std::int64_t col = 0; col < g.n; ++col)
      detail::store_f32(g.c, g.c_type, r * g.ldc + col, c[r * g.n + col]);
}

}  // namespace

void gemm(const GemmArgs& g) {
  validate_gemm(g);
  if (g.m == 0 || g.n == 0) return;
  GemmArgs one = g;
  for (std::int64_t i = 0; i < g.batch; ++i) {
    one.a = static_cast<const char*>(g.a) + i * g.stride_a * dtype_size(g.ab_type);
    one.b = static_cast<const char*>(g.b) + i * g.stride_b * dtype_size(g.ab_type);
    one.c = static_cast<char*>(g.c) + i * g.stride_c * dtype_size(g.c_type);
    gemm_one(one);
  }
}

void set_gemm_threads(int threads) { openblas_set_num_threads(std::max(1, threads)); }

// Note [BLAS kernels].
CpuGemmKernels cpu_gemm_kernels() {
  CpuGemmKernels k;
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
