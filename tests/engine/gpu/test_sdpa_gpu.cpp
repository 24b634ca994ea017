// cuDNN's fused attention (kernels/sdpa.h, Note [fused attention] in
// engine/nn/attention.cpp) on a GPU: the kernels' O, log-sum-exp and dQKV
// against a float64 loop written here from the formula, on inputs already
// rounded to the low type; CausalSelfAttention's fused path against its
// unfused CUDA path (kernels::set_fused_kernels(false)) on the same
// weights and inputs at gpt2's shape, and against the CPU at smaller ones;
// the deterministic backward twice, bit for bit. bf16 and f16, at gpt2-like
// shapes and at odd ones (T = 67, not a multiple of cuDNN's 64-row tiles).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/nn/attention.h"
#include "engine/parameter_store.h"
#include "kernels/fusion.h"
#include "kernels/sdpa.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using kernels::SdpaPass;
using kernels::SdpaShape;

namespace {

const core::Device kGpu = core::Device::cuda(0);

// Restores the process-wide switch whatever a test does.
struct FusedSwitch {
  explicit FusedSwitch(bool on) { kernels::set_fused_kernels(on); }
  ~FusedSwitch() { kernels::set_fused_kernels(true); }
};

std::vector<float> host(const core::Tensor& t, const core::Stream& stream = {}) {
  return t.cast(DType::f32, stream).to_vector<float>(stream);
}

// Tolerances, in units of the low type's unit roundoff u (2^-8 bf16, 2^-11
// f16). Each output element carries the rounding of the output itself (u
// relative) and of the low-type P (or dS) in its sum, at most u times the
// sum of |terms|, which is bounded by the tensor's largest magnitude. So an
// element may be off by u |ref| + u max|ref|; 4u each leaves room for the
// f32 accumulation and the backward's row term taken from the rounded O.
// A wrong layout, scale or mask is off by O(1), far outside.
double unit_roundoff(DType t) { return t == DType::bf16 ? 1.0 / 256 : 1.0 / 2048; }

void require_close(const std::vector<float>& got, const std::vector<double>& want, double u,
                   const std::string& what) {
  REQUIRE(got.size() == want.size());
  double max_ref = 0.0;
  for (double w : want) max_ref = std::max(max_ref, std::fabs(w));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    if (err <= 4 * u * (std::fabs(want[i]) + max_ref)) continue;
    INFO(what << " element " << i << ": got " << got[i] << ", want " << want[i] << ", largest "
              << max_ref);
    REQUIRE(err <= 4 * u * (std::fabs(want[i]) + max_ref));
  }
}

// Two approximations of the same attention (fused and unfused, or fused
// and the CPU's) each within a few u of the exact values: compared in norm,
// ||a - b|| <= 8u ||b||, and element by element within 16u of the largest.
void require_agree(const std::vector<float>& a, const std::vector<float>& b, double u,
                   const std::string& what) {
  REQUIRE(a.size() == b.size());
  double diff = 0.0, norm = 0.0, max_b = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
    max_b = std::max(max_b, std::fabs(double{b[i]}));
  }
  INFO(what << ": ||a - b|| / ||b|| = " << std::sqrt(diff / norm) << ", u = " << u);
  REQUIRE(std::sqrt(diff) <= 8 * u * std::sqrt(norm));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i] - b[i]) <= 16 * u * max_b) continue;
    INFO(what << " element " << i << ": " << a[i] << " against " << b[i]);
    REQUIRE(std::fabs(a[i] - b[i]) <= 16 * u * max_b);
  }
}

// The float64 attention of rows qkv [B, T, 3C] (Note [sdpa layouts]): O
// [B, T, C], the log-sum-exp [B, H, T], and for dO [B, T, C] the gradient
// dqkv [B, T, 3C].
struct Reference {
  std::vector<double> out, lse, dqkv;
};

Reference reference(const SdpaShape& s, const std::vector<float>& qkv,
                    const std::vector<float>& dout) {
  const std::int64_t c = s.width(), d = s.head_dim, seq = s.seq;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Reference r;
  r.out.assign(s.batch * seq * c, 0.0);
  r.lse.assign(s.batch * s.heads * seq, 0.0);
  r.dqkv.assign(s.batch * seq * 3 * c, 0.0);
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h) {
    return (b * seq + t) * 3 * c + part * c + h * d;
  };
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads; ++h)
      for (std::int64_t t = 0; t < seq; ++t) {
        std::vector<double> p(t + 1), dp(t + 1);
        double max = -1e300, sum = 0.0;
        for (std::int64_t j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += double{qkv[at(b, t, 0, h) + e]} * qkv[at(b, j, 1, h) + e];
          p[j] = dot * scale;
          max = std::max(max, p[j]);
        }
        for (double& v : p) sum += (v = std::exp(v - max));
        for (double& v : p) v /= sum;
        r.lse[(b * s.heads + h) * seq + t] = max + std::log(sum);
        const std::int64_t row = (b * seq + t) * c + h * d;
        for (std::int64_t e = 0; e < d; ++e)
          for (std::int64_t j = 0; j <= t; ++j) r.out[row + e] += p[j] * qkv[at(b, j, 2, h) + e];
        // Backward: dV_j += p_j dO, dP_j = dO . v_j, dS_j = p_j (dP_j - sum p dP),
        // dQ = scale sum dS_j k_j, dK_j += scale dS_j q.
        double row_term = 0.0;
        for (std::int64_t j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (std::int64_t e = 0; e < d; ++e)
            dot += double{dout[row + e]} * qkv[at(b, j, 2, h) + e];
          dp[j] = dot;
          row_term += p[j] * dot;
        }
        for (std::int64_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[j] - row_term) * scale;
          for (std::int64_t e = 0; e < d; ++e) {
            r.dqkv[at(b, j, 2, h) + e] += p[j] * dout[row + e];
            r.dqkv[at(b, t, 0, h) + e] += ds * qkv[at(b, j, 1, h) + e];
            r.dqkv[at(b, j, 1, h) + e] += ds * qkv[at(b, t, 0, h) + e];
          }
        }
      }
  return r;
}

// The fused kernels run once: O, the log-sum-exp and dqkv, on the host.
struct Fused {
  std::vector<float> out, stats, dqkv;
};

Fused run_kernels(const SdpaShape& s, const core::Tensor& qkv, const core::Tensor& dout,
                  bool deterministic, const core::Stream& stream) {
  core::set_current_device(kGpu);
  std::string why;
  INFO("shape " << kernels::sdpa_plan_key(0, s, SdpaPass::backward, deterministic).str());
  REQUIRE(kernels::cuda::sdpa_supported(s, SdpaPass::forward, false, &why));
  INFO("backward: " << why);
  REQUIRE(kernels::cuda::sdpa_supported(s, SdpaPass::backward, deterministic, &why));
  const core::Tensor out = core::Tensor::empty({s.batch, s.seq, s.width()}, s.type, kGpu, stream);
  const core::Tensor stats =
      core::Tensor::empty({s.batch, s.heads, s.seq}, DType::f32, kGpu, stream);
  const core::Tensor dqkv =
      core::Tensor::empty({s.batch, s.seq, 3 * s.width()}, s.type, kGpu, stream);
  const std::size_t forward_bytes =
      kernels::cuda::sdpa_workspace_bytes(s, SdpaPass::forward, false);
  const std::size_t backward_bytes =
      kernels::cuda::sdpa_workspace_bytes(s, SdpaPass::backward, deterministic);
  const core::Tensor workspace =
      core::Tensor::empty({static_cast<std::int64_t>(std::max(forward_bytes, backward_bytes))},
                          DType::u8, kGpu, stream);
  kernels::cuda::sdpa_forward(s, qkv.data(), out.data(), stats.data_as<float>(), workspace.data(),
                              forward_bytes, stream.handle());
  kernels::cuda::sdpa_backward(s, deterministic, qkv.data(), out.data(), dout.data(),
                               stats.data_as<float>(), dqkv.data(), workspace.data(),
                               backward_bytes, stream.handle());
  return {host(out, stream), host(stats, stream), host(dqkv, stream)};
}

// Random rows in the low type, on the GPU, and their exact values.
std::pair<core::Tensor, std::vector<float>> random_rows(const core::Shape& shape, DType type,
                                                        std::uint32_t seed,
                                                        const core::Stream& stream) {
  const core::Tensor low = test::random_f32(shape, seed).cast(type);
  return {low.to(kGpu, stream), host(low)};
}

struct LayerRun {
  std::vector<float> y, dx, grads;
};

// CausalSelfAttention(C, H) without dropout, from seed 17, on `device` under
// `autocast`: its output, input gradient and flat parameter gradients.
LayerRun run_layer(core::Device device, std::int64_t batch, std::int64_t seq, std::int64_t c,
                   std::int64_t heads, DType autocast) {
  CausalSelfAttention layer(c, heads, 0.0f);
  initialize(layer, 17);
  const core::Stream stream = device.is_cuda() ? core::Stream::create(device) : core::Stream();
  ParameterStore store(layer, device, stream);
  Context ctx;
  ctx.autocast = autocast;
  ctx.stream = stream;
  const core::Tensor x = test::random_f32({batch, seq, c}, 5).to(device, stream);
  const core::Tensor y = layer.forward(x, ctx);
  const core::Tensor dy = test::random_f32(y.shape(), 6).to(device, stream);
  const core::Tensor dx = layer.backward(dy, ctx);
  return {host(y, stream), host(dx, stream), host(store.grads(), stream)};
}

}  // namespace

TEST_CASE("cuDNN's fused attention matches a float64 loop, forward and backward",
          "[gpu][attention]") {
  if (!kernels::sdpa_built()) return;  // nothing to test in a build without the frontend
  const core::Stream stream = core::Stream::create(kGpu);
  // Odd sizes: T = 67 and 130 leave partial 64-row tiles, H = 3, D = 64 and
  // 128 (gpt2's and the largest allowed), B = 2.
  for (DType type : {DType::bf16, DType::f16})
    for (auto [seq, heads, d] : {std::tuple{67, 3, 64}, std::tuple{130, 2, 128}}) {
      const SdpaShape s{2, heads, seq, d, type};
      INFO(dtype_name(type) << " T " << seq << " H " << heads << " D " << d);
      auto [qkv, qkv_host] = random_rows({s.batch, s.seq, 3 * s.width()}, type, 1, stream);
      auto [dout, dout_host] = random_rows({s.batch, s.seq, s.width()}, type, 2, stream);
      const Reference want = reference(s, qkv_host, dout_host);
      for (bool deterministic : {false, true}) {
        const Fused got = run_kernels(s, qkv, dout, deterministic, stream);
        const double u = unit_roundoff(type);
        require_close(got.out, want.out, u, "O");
        // The log-sum-exp is f32 from exact inputs: only f32 rounding.
        for (std::size_t i = 0; i < want.lse.size(); ++i)
          REQUIRE(std::fabs(got.stats[i] - want.lse[i]) <= 1e-4 * (1.0 + std::fabs(want.lse[i])));
        require_close(got.dqkv, want.dqkv, u, "dqkv");
      }
    }
}

TEST_CASE("the deterministic fused backward gives the same bits twice", "[gpu][attention]") {
  if (!kernels::sdpa_built()) return;
  const core::Stream stream = core::Stream::create(kGpu);
  for (DType type : {DType::bf16, DType::f16})
    for (const SdpaShape& s : {SdpaShape{8, 12, 1024, 64, type}, SdpaShape{2, 3, 67, 64, type}}) {
      INFO(kernels::sdpa_plan_key(0, s, SdpaPass::backward, true).str());
      auto [qkv, qkv_host] = random_rows({s.batch, s.seq, 3 * s.width()}, type, 3, stream);
      auto [dout, dout_host] = random_rows({s.batch, s.seq, s.width()}, type, 4, stream);
      const Fused first = run_kernels(s, qkv, dout, true, stream);
      const Fused second = run_kernels(s, qkv, dout, true, stream);
      REQUIRE(std::memcmp(first.dqkv.data(), second.dqkv.data(),
                          first.dqkv.size() * sizeof(float)) == 0);
      REQUIRE(std::memcmp(first.out.data(), second.out.data(), first.out.size() * sizeof(float)) ==
              0);
    }
}

TEST_CASE("CausalSelfAttention's fused path matches its unfused CUDA path at gpt2's shape",
          "[gpu][attention]") {
  if (!kernels::sdpa_built()) return;
  // gpt2: B 8, T 1024, C 768, H 12 (D 64); and an odd one: T 67, C 192, H 3.
  for (DType type : {DType::bf16, DType::f16})
    for (auto [batch, seq, c, heads] : {std::tuple{8, 1024, 768, 12}, std::tuple{2, 67, 192, 3}}) {
      INFO(dtype_name(type) << " B " << batch << " T " << seq << " C " << c << " H " << heads);
      const SdpaShape s{batch, heads, seq, c / heads, type};
      core::set_current_device(kGpu);
      REQUIRE(kernels::cuda::sdpa_supported(s, SdpaPass::forward, false));
      LayerRun unfused, fused;
      {
        FusedSwitch off(false);
        unfused = run_layer(kGpu, batch, seq, c, heads, type);
      }
      fused = run_layer(kGpu, batch, seq, c, heads, type);
      // The fused run built (or found) its plans: the cache says so.
      const auto plans = kernels::cuda::sdpa_cached_plans();
      const std::string key = kernels::sdpa_plan_key(0, s, SdpaPass::forward, false).str();
      REQUIRE(std::any_of(plans.begin(), plans.end(), [&](const std::string& line) {
        return line.rfind(key + ": workspace", 0) == 0;
      }));
      const double u = unit_roundoff(type);
      require_agree(fused.y, unfused.y, u, "y");
      require_agree(fused.dx, unfused.dx, u, "dx");
      require_agree(fused.grads, unfused.grads, u, "parameter gradients");
    }
}

TEST_CASE("CausalSelfAttention's fused path matches the cpu under autocast", "[gpu][attention]") {
  if (!kernels::sdpa_built()) return;
  for (DType type : {DType::bf16, DType::f16})
    for (auto [batch, seq, c, heads] : {std::tuple{2, 256, 768, 12}, std::tuple{2, 67, 192, 3}}) {
      INFO(dtype_name(type) << " B " << batch << " T " << seq << " C " << c << " H " << heads);
      const LayerRun cpu = run_layer(core::Device::cpu(), batch, seq, c, heads, type);
      const LayerRun gpu = run_layer(kGpu, batch, seq, c, heads, type);
      const double u = unit_roundoff(type);
      require_agree(gpu.y, cpu.y, u, "y");
      require_agree(gpu.dx, cpu.dx, u, "dx");
      require_agree(gpu.grads, cpu.grads, u, "parameter gradients");
    }
}
