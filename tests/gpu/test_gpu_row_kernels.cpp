// The CUDA kernels that reduce or scatter over rows, against their CPU twins:
// the two-pass column sums (a Linear's bias gradient, LayerNorm's dgamma and
// dbeta: Note [column chunks]) within f64 reordering plus one f32 rounding,
// and the same bits on a second run; the embedding lookup and its sorted
// gradient bit for bit, and the lookup's record of an index outside the
// vocabulary; accuracy's block argmax (first maximum, NaN as the CPU treats
// it); and the kernels whose per-element index math became 32-bit or per row
// (head moves, bias add, the cross-entropy backward), bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/attention.h"
#include "kernels/bias.h"
#include "kernels/classification.h"
#include "kernels/embedding.h"
#include "kernels/error.h"
#include "kernels/layernorm.h"
#include "support/embedding_order.h"
#include "support/reference.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const Device kGpu = Device::cuda(0);

Tensor workspace(std::size_t bytes) {
  return Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::u8, kGpu);
}

// Both sides add the same f64 terms, in different orders: they differ by at most
// 2^-52 rows sum|terms| ((n - 1) 2^-53 sum|t| each), then by one f32 rounding.
void require_column_sums_close(const std::vector<float>& gpu, const std::vector<float>& cpu,
                               const std::vector<double>& magnitude, std::int64_t rows,
                               const char* what) {
  REQUIRE(gpu.size() == cpu.size());
  for (std::size_t j = 0; j < cpu.size(); ++j) {
    INFO(what << " column " << j << ": cuda " << gpu[j] << ", cpu " << cpu[j]);
    const double tol = std::ldexp(std::fabs(cpu[j]), -23) +
                       std::ldexp(static_cast<double>(rows) * magnitude[j], -52) + 1e-30;
    REQUIRE(std::fabs(gpu[j] - cpu[j]) <= tol);
  }
}

// count indices of `type` in [0, vocab), as i64 values and as storage bytes.
std::vector<std::int64_t> random_indices(std::int64_t count, std::int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, vocab - 1);
  std::vector<std::int64_t> v(count);
  for (auto& i : v) i = dist(rng);
  return v;
}

Tensor indices_on_gpu(const std::vector<std::int64_t>& v, DType type) {
  const auto n = static_cast<std::int64_t>(v.size());
  if (type == DType::i64) return Tensor::from_vector(v, {n}, DType::i64, kGpu);
  return Tensor::from_vector(std::vector<std::int32_t>(v.begin(), v.end()), {n}, DType::i32, kGpu);
}

}  // namespace

TEST_CASE("cuda bias gradient matches the cpu over many row chunks, the same bits each run",
          "[gpu][bias]") {
  // 5000 x 77: 79 chunks of 64 rows (the last 8) x 3 tiles (the last 13 columns);
  // 16384 x 768 is gpt2's; one row and no rows are the edges.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {5000, 77}, {16384, 768}, {1, 40}, {0, 33}};
  for (const auto& [rows, cols] : shapes) {
    for (DType type : {DType::f32, DType::f16, DType::bf16}) {
      INFO(rows << " x " << cols << " " << dtype_name(type));
      const auto dy = test::random_matrix(rows * cols, type, 41);
      const auto db0 = test::random_matrix(cols, DType::f32, 42).values;
      std::vector<float> cpu = db0;
      kernels::cpu::bias_grad(dy.bytes.data(), type, rows, cols, cpu.data());
      std::vector<double> magnitude(cols, 0.0);
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) magnitude[j] += std::fabs(dy.values[i * cols + j]);
      const Tensor g = Tensor::from_host(dy.bytes.data(), {rows * cols}, type, kGpu);
      Tensor ws = workspace(kernels::cuda::bias_grad_workspace_bytes(rows, cols));
      std::vector<float> runs[2];
      for (auto& run : runs) {
        Tensor db = Tensor::from_vector(db0, {cols}, DType::f32, kGpu);
        kernels::cuda::bias_grad(g.data(), type, rows, cols, db.data_as<float>(), ws.data(),
                                 nullptr);
        run = db.to_vector<float>();
      }
      require_column_sums_close(runs[0], cpu, magnitude, rows, "db");
      CHECK(runs[1] == runs[0]);
    }
  }
}

TEST_CASE("cuda LayerNorm weight and bias gradients match the cpu, the same bits each run",
          "[gpu][layernorm]") {
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {
      {5000, 77}, {16384, 768}, {3, 40}};
  for (const auto& [rows, cols] : shapes) {
    INFO(rows << " x " << cols);
    const kernels::LayerNormShape s{rows, cols, 1e-5f};
    const auto x = test::random_matrix(rows * cols, DType::f32, 43).values;
    const auto dy = test::random_matrix(rows * cols, DType::f32, 44).values;
    const auto gamma = test::random_matrix(cols, DType::f32, 45).values;
    const auto beta = test::random_matrix(cols, DType::f32, 46).values;
    const auto dgamma0 = test::random_matrix(cols, DType::f32, 47).values;
    const auto dbeta0 = test::random_matrix(cols, DType::f32, 48).values;
    // One set of statistics for both backwards: the CPU forward's.
    std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols);
    kernels::cpu::layernorm_forward(s, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                    rstd.data());
    std::vector<float> dgamma = dgamma0, dbeta = dbeta0;
    kernels::cpu::layernorm_backward(s, dy.data(), x.data(), mean.data(), rstd.data(), gamma.data(),
                                     dx.data(), dgamma.data(), dbeta.data());
    std::vector<double> mag_gamma(cols, 0.0), mag_beta(cols, 0.0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) {
        const double g = dy[i * cols + j];
        mag_gamma[j] += std::fabs(g * (x[i * cols + j] - static_cast<double>(mean[i])) * rstd[i]);
        mag_beta[j] += std::fabs(g);
      }
    const Tensor gx = Tensor::from_vector(x, {rows * cols}, DType::f32, kGpu);
    const Tensor gdy = Tensor::from_vector(dy, {rows * cols}, DType::f32, kGpu);
    const Tensor gmean = Tensor::from_vector(mean, {rows}, DType::f32, kGpu);
    const Tensor grstd = Tensor::from_vector(rstd, {rows}, DType::f32, kGpu);
    const Tensor ggamma = Tensor::from_vector(gamma, {cols}, DType::f32, kGpu);
    Tensor gdx = Tensor::empty({rows * cols}, DType::f32, kGpu);
    Tensor ws = workspace(kernels::cuda::layernorm_backward_workspace_bytes(s));
    std::vector<float> runs_gamma[2], runs_beta[2];
    for (int run = 0; run < 2; ++run) {
      Tensor gdgamma = Tensor::from_vector(dgamma0, {cols}, DType::f32, kGpu);
      Tensor gdbeta = Tensor::from_vector(dbeta0, {cols}, DType::f32, kGpu);
      kernels::cuda::layernorm_backward(
          s, gdy.data_as<float>(), gx.data_as<float>(), gmean.data_as<float>(),
          grstd.data_as<float>(), ggamma.data_as<float>(), gdx.data_as<float>(),
          gdgamma.data_as<float>(), gdbeta.data_as<float>(), ws.data(), nullptr);
      runs_gamma[run] = gdgamma.to_vector<float>();
      runs_beta[run] = gdbeta.to_vector<float>();
    }
    require_column_sums_close(runs_gamma[0], dgamma, mag_gamma, rows, "dgamma");
    require_column_sums_close(runs_beta[0], dbeta, mag_beta, rows, "dbeta");
    CHECK(runs_gamma[1] == runs_gamma[0]);
    CHECK(runs_beta[1] == runs_beta[0]);
    // dx: the same row formula in f64 (differing in summation order): 1e-5 relative.
    const auto gpu_dx = gdx.to_vector<float>();
    // The message is built only for the element that fails: an INFO per
    // element made this test take 22 s on the H200 machine's host.
    for (std::size_t k = 0; k < dx.size(); ++k) {
      if (std::fabs(gpu_dx[k] - dx[k]) <= 1e-5 + 1e-5 * std::fabs(dx[k])) continue;
      INFO("dx element " << k << ": cuda " << gpu_dx[k] << ", cpu " << dx[k]);
      REQUIRE(std::fabs(gpu_dx[k] - dx[k]) <= 1e-5 + 1e-5 * std::fabs(dx[k]));
    }
  }
}

TEST_CASE("cuda embedding gradient adds in its stated order, repeated indices included",
          "[gpu][embedding]") {
  // vocab 50 over 4096 tokens: runs of about 80 positions per row, summed in
  // chunks (Note [embedding gradient order]); gpt2's 50304 over 16384 tokens
  // (most rows untouched, none used more than kEmbeddingChunk times: the CPU
  // loop's bits); a single token. The reference is that order on the host.
  struct Case {
    std::int64_t count, vocab, dim;
  };
  for (const Case c : {Case{4096, 50, 77}, Case{16384, 50304, 768}, Case{1, 7, 5}}) {
    for (DType type : {DType::i64, DType::i32}) {
      INFO(c.count << " tokens, vocab " << c.vocab << ", dim " << c.dim << ", "
                   << dtype_name(type));
      const kernels::EmbeddingShape s{c.count, c.vocab, c.dim, type};
      const auto idx = random_indices(c.count, c.vocab, 51);
      const auto dout = test::random_matrix(c.count * c.dim, DType::f32, 52).values;
      const auto dw0 = test::random_matrix(c.vocab * c.dim, DType::f32, 53).values;
      std::vector<float> cpu = dw0;
      const kernels::EmbeddingShape cpu_s{c.count, c.vocab, c.dim, DType::i64};  // idx's type
      test::embedding_backward_in_cuda_order(cpu_s.count, cpu_s.vocab, cpu_s.dim, dout.data(),
                                             idx.data(), cpu.data());
      const Tensor gidx = indices_on_gpu(idx, type);
      const Tensor gdout = Tensor::from_vector(dout, {c.count * c.dim}, DType::f32, kGpu);
      Tensor gdw = Tensor::from_vector(dw0, {c.vocab * c.dim}, DType::f32, kGpu);
      Tensor ws = workspace(kernels::cuda::embedding_backward_workspace_bytes(s));
      kernels::cuda::embedding_backward(s, gdout.data_as<float>(), gidx.data(),
                                        gdw.data_as<float>(), ws.data(), nullptr);
      const auto gpu = gdw.to_vector<float>();
      // The first differing element only: 38.6M INFOs did not end in 60 s.
      for (std::size_t k = 0; k < cpu.size(); ++k) {
        if (std::memcmp(&gpu[k], &cpu[k], sizeof(float)) == 0) continue;
        INFO("dweight element " << k << ": cuda " << gpu[k] << ", cpu " << cpu[k]);
        REQUIRE(std::memcmp(&gpu[k], &cpu[k], sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE(
    "cuda embedding lookup equals the cpu's and records the first index outside the vocabulary",
    "[gpu][embedding]") {
  const std::int64_t count = 300, vocab = 40, dim = 33;
  const auto weight = test::random_matrix(vocab * dim, DType::f32, 54).values;
  const Tensor gw = Tensor::from_vector(weight, {vocab * dim}, DType::f32, kGpu);
  for (DType type : {DType::i64, DType::i32}) {
    INFO(dtype_name(type));
    const kernels::EmbeddingShape s{count, vocab, dim, type};
    auto idx = random_indices(count, vocab, 55);
    std::vector<float> cpu(count * dim);
    const kernels::EmbeddingShape cpu_s{count, vocab, dim, DType::i64};  // idx's type
    kernels::cpu::embedding_forward(cpu_s, weight.data(), idx.data(), cpu.data());
    Tensor out = Tensor::empty({count * dim}, DType::f32, kGpu);
    Tensor first_bad = Tensor::empty({1}, DType::i64, kGpu);
    auto lookup = [&] {
      const Tensor gidx = indices_on_gpu(idx, type);
      kernels::cuda::embedding_forward(s, gw.data_as<float>(), gidx.data(), out.data_as<float>(),
                                       first_bad.data_as<std::int64_t>(), nullptr);
      return first_bad.to_vector<std::int64_t>()[0];
    };
    CHECK(lookup() == -1);
    CHECK(out.to_vector<float>() == cpu);
    // Positions 250 (index vocab) and 17 (index -1): the first position is 17,
    // whichever block gets there first.
    idx[250] = vocab;
    idx[17] = -1;
    CHECK(lookup() == 17);
    REQUIRE_THROWS_AS(kernels::cpu::embedding_forward(cpu_s, weight.data(), idx.data(), cpu.data()),
                      InvalidArgument);
  }
}

TEST_CASE("cuda accuracy takes each row's first largest logit, as the cpu does",
          "[gpu][classification]") {
  // Each row gets one label: the CPU's argmax (then every row must count) or the
  // index of a tie or of a NaN that the CPU passes over (then none may count).
  for (std::int64_t classes : {10, 50304}) {
    const std::int64_t rows = 64;
    INFO(classes << " classes");
    auto logits = test::random_matrix(rows * classes, DType::f32, 61).values;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<std::int64_t> other(rows, -1);  // a label the CPU's argmax must not be
    for (std::int64_t i = 0; i < rows; ++i) {
      float* row = &logits[i * classes];
      const std::int64_t a = (i * 7) % classes, b = classes - 1 - (i % 3);
      switch (i % 6) {
        case 0:  // a tie of the largest at two places: the first wins
          row[std::min(a, b)] = row[std::max(a, b)] = 2.0f;
          if (a != b) other[i] = std::max(a, b);
          break;
        case 1:  // NaN first: the CPU keeps 0
          row[0] = nan;
          row[b] = 3.0f;
          other[i] = b;
          break;
        case 2:  // a NaN past a larger value, then the largest
          row[a] = nan;
          row[b] = 5.0f;
          if (a != b) other[i] = a;
          break;
        case 3:  // all -inf: 0
          for (std::int64_t j = 0; j < classes; ++j) row[j] = -inf;
          other[i] = classes - 1;
          break;
        case 4:  // +inf twice
          row[std::min(a, b)] = row[std::max(a, b)] = inf;
          if (a != b) other[i] = std::max(a, b);
          break;
        default:
          break;
      }
    }
    // The CPU's rule, written out (header: first on ties), then held to the CPU kernel.
    std::vector<std::int64_t> argmax(rows, 0);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 1; j < classes; ++j)
        if (logits[i * classes + j] > logits[i * classes + argmax[i]]) argmax[i] = j;
    const kernels::ClassificationShape s{rows, classes};
    float cpu_hits = 0.0f;
    kernels::cpu::count_correct(s, logits.data(), argmax.data(), &cpu_hits);
    REQUIRE(cpu_hits == static_cast<float>(rows));
    const Tensor gl = Tensor::from_vector(logits, {rows * classes}, DType::f32, kGpu);
    Tensor ws = Tensor::empty({2 * rows}, DType::f32, kGpu);
    Tensor correct = Tensor::empty({1}, DType::f32, kGpu);
    auto count = [&](const std::vector<std::int64_t>& labels) {
      const Tensor g = Tensor::from_vector(labels, {rows}, DType::i64, kGpu);
      kernels::cuda::count_correct(s, gl.data_as<float>(), g.data(), correct.data_as<float>(),
                                   ws.data(), nullptr);
      return correct.to_vector<float>()[0];
    };
    CHECK(count(argmax) == static_cast<float>(rows));
    std::vector<std::int64_t> wrong(rows, s.ignore_index);
    std::int64_t counted = 0;
    for (std::int64_t i = 0; i < rows; ++i)
      if (other[i] >= 0 && other[i] != argmax[i]) {
        wrong[i] = other[i];
        ++counted;
      }
    CHECK(counted >= rows / 2);
    CHECK(count(wrong) == 0.0f);
  }
}

TEST_CASE("cuda head moves, bias add and cross-entropy backward equal the cpu's bits",
          "[gpu][attention][bias][classification]") {
  // gpt2's head shape at T = 256: 3 x 2 x 12 x 256 x 64 elements.
  const kernels::AttentionShape a{2, 256, 12, 64, 3, DType::f32};
  const std::int64_t n = a.parts * a.batch * a.heads * a.seq * a.head_dim;
  const auto rows = test::random_matrix(n, DType::f32, 62).values;
  std::vector<float> heads(n), back(n);
  kernels::cpu::split_heads(a, rows.data(), heads.data());
  const Tensor grows = Tensor::from_vector(rows, {n}, DType::f32, kGpu);
  Tensor gheads = Tensor::empty({n}, DType::f32, kGpu),
         gback = Tensor::empty({n}, DType::f32, kGpu);
  kernels::cuda::split_heads(a, grows.data(), gheads.data(), nullptr);
  CHECK(gheads.to_vector<float>() == heads);
  kernels::cuda::merge_heads(a, gheads.data(), gback.data(), nullptr);
  CHECK(gback.to_vector<float>() == rows);

  for (DType type : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(type));
    const std::int64_t r = 300, c = 77;
    const auto y = test::random_matrix(r * c, type, 63);
    const auto bias = test::random_matrix(c, DType::f32, 64).values;
    auto cpu = y.bytes;
    kernels::cpu::add_bias(cpu.data(), type, bias.data(), r, c);
    Tensor gy = Tensor::from_host(y.bytes.data(), {r * c}, type, kGpu);
    const Tensor gb = Tensor::from_vector(bias, {c}, DType::f32, kGpu);
    kernels::cuda::add_bias(gy.data(), type, gb.data_as<float>(), r, c, nullptr);
    std::vector<std::uint8_t> gpu(gy.nbytes());
    gy.copy_to_host(gpu.data());
    CHECK(gpu == cpu);
  }

  const std::int64_t r = 40, classes = 1000;
  const auto probs = test::random_matrix(r * classes, DType::f32, 65).values;
  std::vector<std::int64_t> labels = random_indices(r, classes, 66);
  labels[3] = -100;  // ignored: a zero row
  const kernels::ClassificationShape s{r, classes};
  const float count = 39.0f;
  std::vector<float> cpu(r * classes);
  kernels::cpu::softmax_xent_backward(s, probs.data(), labels.data(), &count, 0.5f, cpu.data());
  const Tensor gp = Tensor::from_vector(probs, {r * classes}, DType::f32, kGpu);
  const Tensor gl = Tensor::from_vector(labels, {r}, DType::i64, kGpu);
  const Tensor gc = Tensor::from_vector(std::vector<float>{count}, {1}, DType::f32, kGpu);
  Tensor gd = Tensor::empty({r * classes}, DType::f32, kGpu);
  kernels::cuda::softmax_xent_backward(s, gp.data_as<float>(), gl.data(), gc.data_as<float>(), 0.5f,
                                       gd.data_as<float>(), nullptr);
  CHECK(gd.to_vector<float>() == cpu);
}
