// CausalSelfAttention on the CPU: forward against a float64 loop written here
// from the formula (not from the layer's kernels), also under autocast,
// finite-difference gradients with and without dropout, the causal property,
// and the kernels' own checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/nn/attention.h"
#include "kernels/attention.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using lockstep::test::check_gradients;
using lockstep::test::random_f32;

namespace {

// y = c_proj(concat_h softmax_causal(q_h k_h^T / sqrt(D)) v_h), in float64.
std::vector<double> reference_attention(CausalSelfAttention& attn, const core::Tensor& x_t,
                                        std::int64_t heads) {
  const std::int64_t batch = x_t.dim(0), seq = x_t.dim(1), c = x_t.dim(2), d = c / heads;
  const auto x = x_t.to_vector<float>();
  const auto wa = attn.c_attn().weight().value.to_vector<float>();
  const auto ba = attn.c_attn().bias()->value.to_vector<float>();
  const auto wp = attn.c_proj().weight().value.to_vector<float>();
  const auto bp = attn.c_proj().bias()->value.to_vector<float>();
  std::vector<double> qkv(batch * seq * 3 * c), y(batch * seq * c), out(batch * seq * c);
  for (std::int64_t r = 0; r < batch * seq; ++r)
    for (std::int64_t o = 0; o < 3 * c; ++o) {
      double acc = ba[o];
      for (std::int64_t i = 0; i < c; ++i) acc += double{wa[o * c + i]} * x[r * c + i];
      qkv[r * 3 * c + o] = acc;
    }
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h, std::int64_t e) {
    return qkv[(b * seq + t) * 3 * c + part * c + h * d + e];
  };
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t t = 0; t < seq; ++t) {
        std::vector<double> w(t + 1);
        double max = -1e300, sum = 0.0;
        for (std::int64_t j = 0; j <= t; ++j) {
          double s = 0.0;
          for (std::int64_t e = 0; e < d; ++e) s += at(b, t, 0, h, e) * at(b, j, 1, h, e);
          w[j] = s / std::sqrt(static_cast<double>(d));
          max = std::max(max, w[j]);
        }
        for (double& v : w) sum += (v = std::exp(v - max));
        for (std::int64_t e = 0; e < d; ++e) {
          double acc = 0.0;
          for (std::int64_t j = 0; j <= t; ++j) acc += w[j] / sum * at(b, j, 2, h, e);
          y[(b * seq + t) * c + h * d + e] = acc;
        }
      }
  for (std::int64_t r = 0; r < batch * seq; ++r)
    for (std::int64_t o = 0; o < c; ++o) {
      double acc = bp[o];
      for (std::int64_t i = 0; i < c; ++i) acc += wp[o * c + i] * y[r * c + i];
      out[r * c + o] = acc;
    }
  return out;
}

}  // namespace

TEST_CASE("causal self-attention matches a float64 loop", "[engine][attention]") {
  // f32 with O(1) inputs. The longest sum is now the PV product's, over up
  // to T = 130 keys (the CPU's blocks run it over keys [0, end) of each
  // 64-row block, Note [blocked causal attention]): its worst-case error,
  // gamma_T sum_j p_j |v_j| <= 130 * 2^-24 max |v| = 7.7e-6 max |v| with
  // |v| < 1 here, is still inside 1e-5, and so are the shorter sums of the
  // other stages (C <= 16 terms). Measured: 2.5e-8 to 9.1e-8 over these
  // shapes (rounding grows like sqrt(T), not T). T = 64, 100 and 130 put
  // the query rows in one whole block, in a whole and a partial one, and in
  // three; any indexing or scaling mistake in a block is O(0.1).
  for (auto [batch, seq, c, heads] : {std::tuple{1, 1, 4, 1},
                                      {2, 5, 16, 4},
                                      {3, 9, 12, 3},
                                      {1, 33, 8, 2},
                                      {1, 64, 8, 2},
                                      {2, 100, 8, 2},
                                      {1, 130, 16, 4}}) {
    CausalSelfAttention attn(c, heads);
    initialize(attn, 11);
    Context ctx;
    const core::Tensor x = random_f32({batch, seq, c}, 2);
    const auto y = attn.forward(x, ctx).to_vector<float>();
    const auto ref = reference_attention(attn, x, heads);
    REQUIRE(y.size() == ref.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO("B=" << batch << " T=" << seq << " C=" << c << " H=" << heads << " element " << i);
      REQUIRE(std::fabs(y[i] - ref[i]) <= 1e-5 + 1e-5 * std::fabs(ref[i]));
    }
  }
}

TEST_CASE("causal self-attention gradients match finite differences", "[engine][attention]") {
  // T = 100 and 130 span two and three of the CPU's 64-row blocks (Note
  // [blocked causal attention]); a missing or misplaced block is an O(1)
  // error in dQ, dK or dV. Sums over 130 x 8 outputs add about 1e-4 of
  // rounding to the central difference (gradcheck.h's budget is 2e-3).
  for (auto [batch, seq, c, heads] :
       {std::tuple{1, 3, 4, 1}, {2, 5, 8, 2}, {2, 7, 12, 3}, {1, 100, 8, 2}, {1, 130, 8, 2}}) {
    CausalSelfAttention attn(c, heads);
    initialize(attn, 5);
    check_gradients(attn, random_f32({batch, seq, c}, 9));
  }
}

TEST_CASE("attention dropout keeps gradients exact for its fixed mask", "[engine][attention]") {
  // The mask is keyed by (seed, step, layer, sample), so the finite-difference
  // evaluations see the same mask as the analytic backward.
  // T = 6 inside one of the CPU's 64-row blocks, T = 130 across three.
  for (std::int64_t seq : {6, 130}) {
    CausalSelfAttention attn(8, 2, 0.25f);
    initialize(attn, 5);
    Context ctx;
    ctx.seed = 21;
    check_gradients(attn, random_f32({2, seq, 8}, 4), ctx);
  }
}

TEST_CASE("a position's output depends only on earlier positions", "[engine][attention]") {
  CausalSelfAttention attn(8, 2);
  initialize(attn, 3);
  Context ctx;
  core::Tensor x = random_f32({1, 6, 8}, 1);
  const auto before = attn.forward(x, ctx).to_vector<float>();
  x.data_as<float>()[4 * 8 + 3] += 1.0f;  // change position 4
  const auto after = attn.forward(x, ctx).to_vector<float>();
  for (std::size_t i = 0; i < 4 * 8; ++i) REQUIRE(after[i] == before[i]);
  bool changed = false;
  for (std::size_t i = 4 * 8; i < before.size(); ++i) changed = changed || after[i] != before[i];
  REQUIRE(changed);
}

TEST_CASE("the causal softmax is stable for large scores and zero above the diagonal",
          "[engine][attention]") {
  const std::vector<float> scores = {1e4f, -3e4f, 7.0f, 3e4f, 3e4f, 1.0f, -1e4f, 0.0f, 1e4f};
  std::vector<float> probs(9, -1.0f);
  kernels::cpu::causal_softmax_forward(1, 3, 1.0f, scores.data(), probs.data());
  const std::vector<float> expected = {1, 0, 0, 0.5f, 0.5f, 0, 0, 0, 1};
  for (int i = 0; i < 9; ++i) REQUIRE(probs[i] == Approx(expected[i]).margin(1e-6));
}

TEST_CASE("attention rejects bad shapes naming the layer", "[engine][attention]") {
  CHECK_THROWS_WITH(CausalSelfAttention(10, 3), Catch::Contains("multiple of heads"));
  CausalSelfAttention attn(8, 2);
  Context ctx;
  CHECK_THROWS_WITH(attn.forward(random_f32({2, 8}, 1), ctx),
                    Catch::Contains("CausalSelfAttention") && Catch::Contains("[batch, seq, 8]"));
  kernels::AttentionShape bad{1, 0, 1, 1, 1, DType::f32};
  CHECK_THROWS_WITH(kernels::validate_attention(bad), Catch::Contains("seq=0"));
}

TEST_CASE("the causal softmax passes a NaN score on as NaN", "[engine][attention]") {
  // The loss scaler finds overflow by the NaN it leaves in the loss.
  const std::vector<float> scores = {1.0f, 0.0f, NAN, 2.0f};
  std::vector<float> probs(4);
  kernels::cpu::causal_softmax_forward(1, 2, 1.0f, scores.data(), probs.data());
  REQUIRE(probs[0] == 1.0f);
  REQUIRE(std::isnan(probs[2]));
}

TEST_CASE("causal self-attention under autocast matches the float64 loop to 16-bit precision",
          "[engine][attention][autocast]") {
  // The CPU's head products widen 16-bit q, k, v and P through the GEMM's
  // leading dimensions (Note [heads in place]); T = 130 spans three 64-row
  // blocks. Tolerance 4 u of the low type (u = 2^-8 for bf16, 2^-11 for f16):
  // every stage rounds its output to it (qkv, P, O, y; |y| < 1 here), each
  // rounding within u relative; measured 2.1e-3 (bf16) and 2.5e-4 (f16),
  // about u/2, and a block's indexing mistake is O(0.1), above 4 u = 1.6e-2.
  for (DType low : {DType::bf16, DType::f16}) {
    const double u = low == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    CausalSelfAttention attn(16, 4);
    initialize(attn, 11);
    Context ctx;
    ctx.autocast = low;
    const core::Tensor x = random_f32({2, 130, 16}, 2);
    const core::Tensor out = attn.forward(x, ctx);
    const auto y = (out.dtype() == DType::f32 ? out : out.cast(DType::f32)).to_vector<float>();
    const auto ref = reference_attention(attn, x, 4);
    REQUIRE(y.size() == ref.size());
    for (std::size_t i = 0; i < y.size(); ++i) {
      INFO(dtype_name(low) << " element " << i << ": " << y[i] << " against " << ref[i]);
      REQUIRE(std::fabs(y[i] - ref[i]) <= 4 * u);
    }
  }
}
