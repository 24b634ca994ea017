// BatchNorm with a ReLU or a residual add + ReLU (Note [fused batchnorm] in
// kernels/batchnorm.h) on the CPU: the twin against a float64 loop of
// PyTorch's batch_norm (biased variance to normalise, unbiased for the running
// variance, momentum 0.1) with relu / add + relu, forward and backward, at an
// odd shape; and the engine's fused layers against the unfused modules bit for
// bit (BatchNorm2d with activation relu, forward_add_relu, resnet's blocks).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/core/ops.h"
#include "engine/models.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "kernels/batchnorm.h"
#include "kernels/elementwise.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using kernels::BatchNormEpilogue;
using lockstep::test::random_f32;

namespace {

constexpr std::int64_t kN = 3, kC = 5, kH = 7, kW = 3, kS = kH * kW, kCount = kN * kS;
const core::Shape kShape{kN, kC, kH, kW};

std::int64_t at(std::int64_t n, std::int64_t c, std::int64_t i) { return (n * kC + c) * kS + i; }

// PyTorch's training-mode batch_norm, then the epilogue, in float64.
struct Reference {
  std::vector<double> y, pre, mean, var, running_mean, running_var;
};

Reference reference_forward(const std::vector<double>& x, const std::vector<double>& identity,
                            const std::vector<double>& w, const std::vector<double>& b,
                            BatchNormEpilogue epi) {
  Reference r{std::vector<double>(x.size()), std::vector<double>(x.size()),
              std::vector<double>(kC),       std::vector<double>(kC),
              std::vector<double>(kC),       std::vector<double>(kC)};
  for (std::int64_t c = 0; c < kC; ++c) {
    double sum = 0, sq = 0;
    for (std::int64_t n = 0; n < kN; ++n)
      for (std::int64_t i = 0; i < kS; ++i) sum += x[at(n, c, i)];
    r.mean[c] = sum / kCount;
    for (std::int64_t n = 0; n < kN; ++n)
      for (std::int64_t i = 0; i < kS; ++i)
        sq += (x[at(n, c, i)] - r.mean[c]) * (x[at(n, c, i)] - r.mean[c]);
    r.var[c] = sq / kCount;
    r.running_mean[c] = 0.9 * 0.0 + 0.1 * r.mean[c];
    r.running_var[c] = 0.9 * 1.0 + 0.1 * sq / (kCount - 1);
    for (std::int64_t n = 0; n < kN; ++n)
      for (std::int64_t i = 0; i < kS; ++i) {
        const std::int64_t j = at(n, c, i);
        double v = (x[j] - r.mean[c]) / std::sqrt(r.var[c] + 1e-5) * w[c] + b[c];
        if (epi == BatchNormEpilogue::add_relu) v += identity[j];
        r.pre[j] = v;
        r.y[j] = epi == BatchNormEpilogue::none ? v : std::max(v, 0.0);
      }
  }
  return r;
}

struct Grads {
  std::vector<double> dx, d_identity, dweight, dbias;
};

// dy masked by relu (pre > 0), then PyTorch's batch_norm backward:
// dx = w rstd (g - mean(g) - xhat mean(g xhat)), dw = sum(g xhat), db = sum(g).
Grads reference_backward(const std::vector<double>& x, const Reference& r,
                         const std::vector<double>& dy, const std::vector<double>& w,
                         BatchNormEpilogue epi) {
  Grads out{std::vector<double>(x.size()), std::vector<double>(x.size()), std::vector<double>(kC),
            std::vector<double>(kC)};
  std::vector<double> g(dy);
  if (epi != BatchNormEpilogue::none)
    for (std::size_t j = 0; j < g.size(); ++j) g[j] = r.pre[j] > 0 ? dy[j] : 0.0;
  out.d_identity = g;
  for (std::int64_t c = 0; c < kC; ++c) {
    const double rstd = 1.0 / std::sqrt(r.var[c] + 1e-5);
    double sum_g = 0, sum_gxhat = 0;
    for (std::int64_t n = 0; n < kN; ++n)
      for (std::int64_t i = 0; i < kS; ++i) {
        const std::int64_t j = at(n, c, i);
        sum_g += g[j];
        sum_gxhat += g[j] * (x[j] - r.mean[c]) * rstd;
      }
    out.dweight[c] = sum_gxhat;
    out.dbias[c] = sum_g;
    for (std::int64_t n = 0; n < kN; ++n)
      for (std::int64_t i = 0; i < kS; ++i) {
        const std::int64_t j = at(n, c, i);
        const double xhat = (x[j] - r.mean[c]) * rstd;
        out.dx[j] = w[c] * rstd * (g[j] - sum_g / kCount - xhat * sum_gxhat / kCount);
      }
  }
  return out;
}

std::vector<double> as_f64(const core::Tensor& t) {
  const auto v = t.cast(DType::f32).to_vector<float>();
  return {v.begin(), v.end()};
}

// |got - want| <= rel |want| + abs, per element.
void require_near(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  double abs, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + abs) continue;
    INFO(what << " element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]) + abs);
  }
}

// One ulp of the type, relative: the twin rounds its f32 result once to it.
double ulp(DType type) {
  return type == DType::f16 ? 1.0 / 1024 : type == DType::bf16 ? 1.0 / 128 : 0.0;
}

}  // namespace

TEST_CASE("the fused batchnorm twin follows PyTorch's batch_norm, relu and add in float64",
          "[engine][batchnorm]") {
  const kernels::BatchNormShape s{kN, kC, kS, 1e-5};
  const std::vector<float> w{0.5f, 1.5f, -0.75f, 1.0f, 2.0f}, b{0.1f, -0.2f, 0.3f, 0.0f, -1.0f};
  const std::vector<double> w64(w.begin(), w.end()), b64(b.begin(), b.end());
  for (DType type : {DType::f32, DType::f16, DType::bf16})
    for (BatchNormEpilogue epi :
         {BatchNormEpilogue::none, BatchNormEpilogue::relu, BatchNormEpilogue::add_relu}) {
      INFO(dtype_name(type) << " epilogue " << static_cast<int>(epi));
      // Inputs rounded to the type first: the reference sees the same values.
      const core::Tensor x = random_f32(kShape, 21, 2.0f).cast(type);
      const core::Tensor id = random_f32(kShape, 22).cast(type);
      const core::Tensor dy = random_f32(kShape, 23).cast(type);
      const bool add = epi == BatchNormEpilogue::add_relu;
      core::Tensor y = core::Tensor::empty(kShape, type);
      std::vector<float> mean(kC), rstd(kC), running_mean(kC, 0.0f), running_var(kC, 1.0f);
      kernels::cpu::batchnorm_fused_forward_training(
          s, type, epi, x.data(), add ? id.data() : nullptr, w.data(), b.data(), y.data(),
          mean.data(), rstd.data(), 0.1, running_mean.data(), running_var.data());
      const Reference r = reference_forward(as_f64(x), as_f64(id), w64, b64, epi);
      // f32: the twin normalises in f64 and rounds to f32, then adds in f32: a
      // few f32 ulps of O(10) values. 16-bit: one ulp of the type besides.
      require_near(as_f64(y), r.y, ulp(type) + 1e-6, 1e-5, "y");
      require_near({mean.begin(), mean.end()}, r.mean, 1e-6, 1e-6, "save_mean");
      std::vector<double> want_rstd(kC);
      for (std::int64_t c = 0; c < kC; ++c) want_rstd[c] = 1.0 / std::sqrt(r.var[c] + 1e-5);
      require_near({rstd.begin(), rstd.end()}, want_rstd, 1e-6, 0, "save_rstd");
      require_near({running_mean.begin(), running_mean.end()}, r.running_mean, 1e-6, 1e-7,
                   "running_mean");
      require_near({running_var.begin(), running_var.end()}, r.running_var, 1e-6, 0, "running_var");

      core::Tensor dx = core::Tensor::empty(kShape, type);
      core::Tensor d_id = core::Tensor::empty(kShape, type);
      std::vector<float> dw(kC, 0.0f), db(kC, 0.0f);
      kernels::cpu::batchnorm_fused_backward(s, type, epi, x.data(), y.data(), dy.data(), w.data(),
                                             mean.data(), rstd.data(), dx.data(),
                                             add ? d_id.data() : nullptr, dw.data(), db.data());
      const Grads g = reference_backward(as_f64(x), r, as_f64(dy), w64, epi);
      // dx: f32 arithmetic on terms of O(w rstd |dy|) ~ 3, then one rounding
      // to the type. The sums: f64, rounded once to f32.
      require_near(as_f64(dx), g.dx, ulp(type) + 1e-5, 1e-5, "dx");
      require_near({dw.begin(), dw.end()}, g.dweight, 1e-6, 1e-5, "dweight");
      require_near({db.begin(), db.end()}, g.dbias, 1e-6, 1e-5, "dbias");
      if (add) require_near(as_f64(d_id), g.d_identity, 0, 0, "d_identity");  // dy or 0: exact
    }
}

TEST_CASE("BatchNorm2d with its relu gives BatchNorm2d then ReLU bit for bit on the cpu",
          "[engine][batchnorm]") {
  for (DType type : {DType::f32, DType::f16}) {
    INFO(dtype_name(type));
    BatchNorm2d fused(kC, 1e-5, 0.1, true, true, BatchNormActivation::relu);
    Sequential plain;
    plain.emplace<BatchNorm2d>("bn", kC);
    plain.emplace<ReLU>("relu");
    Context ctx;
    for (int step = 0; step < 2; ++step) {
      const core::Tensor x = random_f32(kShape, 30 + step, 2.0f).cast(type);
      const core::Tensor y = fused.forward(x, ctx), y_plain = plain.forward(x, ctx);
      CHECK(y.dtype() == DType::f32);  // the CPU normalises in f32 (Note [batchnorm paths])
      CHECK(y.to_vector<float>() == y_plain.to_vector<float>());
      const core::Tensor dy = random_f32(kShape, 40 + step);
      const core::Tensor dx = fused.backward(dy, ctx), dx_plain = plain.backward(dy, ctx);
      CHECK(dx.dtype() == type);
      CHECK(dx.cast(DType::f32).to_vector<float>() == dx_plain.cast(DType::f32).to_vector<float>());
    }
    const auto params = plain.parameters();
    CHECK(fused.weight()->grad.to_vector<float>() == params[0]->grad.to_vector<float>());
    CHECK(fused.bias()->grad.to_vector<float>() == params[1]->grad.to_vector<float>());
    const auto buffers = plain.buffers();
    CHECK(fused.running_mean()->value.to_vector<float>() == buffers[0]->value.to_vector<float>());
    CHECK(fused.running_var()->value.to_vector<float>() == buffers[1]->value.to_vector<float>());
    fused.eval();
    plain.eval();
    const core::Tensor x = random_f32(kShape, 50, 2.0f).cast(type);
    CHECK(fused.forward(x, ctx).to_vector<float>() == plain.forward(x, ctx).to_vector<float>());
  }
}

TEST_CASE("forward_add_relu gives Residual's add and relu bit for bit on the cpu",
          "[engine][batchnorm]") {
  BatchNorm2d fused(kC);
  auto inner = std::make_unique<Sequential>();
  inner->emplace<BatchNorm2d>("bn", kC);
  Residual block(std::move(inner), nullptr, "downsample", true);
  block.set_input_grad(true);
  Context ctx;
  const core::Tensor x = random_f32(kShape, 60, 2.0f);
  // The block's identity is its input: relu(bn(x) + x).
  const core::Tensor y = fused.forward_add_relu(x, x, ctx), y_block = block.forward(x, ctx);
  CHECK(y.to_vector<float>() == y_block.to_vector<float>());
  const core::Tensor dy = random_f32(kShape, 61);
  core::Tensor d_identity;
  const core::Tensor dh = fused.backward_add_relu(dy, ctx, d_identity);
  core::Tensor dx = core::Tensor::empty(kShape, DType::f32);
  core::ops::add(dh, d_identity, dx);
  CHECK(dx.to_vector<float>() == block.backward(dy, ctx).to_vector<float>());
  const auto params = block.parameters();
  CHECK(fused.weight()->grad.to_vector<float>() == params[0]->grad.to_vector<float>());
  CHECK(fused.bias()->grad.to_vector<float>() == params[1]->grad.to_vector<float>());
}

TEST_CASE("the fused batchnorm calls refuse a mismatched epilogue, naming the call to use",
          "[engine][batchnorm]") {
  BatchNorm2d with_relu(kC, 1e-5, 0.1, true, true, BatchNormActivation::relu);
  Context ctx;
  const core::Tensor x = random_f32(kShape, 70);
  CHECK_THROWS_WITH(with_relu.forward_add_relu(x, x, ctx),
                    Catch::Contains("BatchNormActivation::none"));
  BatchNorm2d plain(kC);
  CHECK_THROWS_WITH(plain.forward_add_relu(x, random_f32({kN, kC, kH, 2}, 71), ctx),
                    Catch::Contains("the identity is [3, 5, 7, 2]"));
  plain.forward_add_relu(x, x, ctx);
  CHECK_THROWS_WITH(plain.backward(x, ctx), Catch::Contains("backward_add_relu"));
  plain.forward(x, ctx);
  core::Tensor d_identity;
  CHECK_THROWS_WITH(plain.backward_add_relu(x, ctx, d_identity),
                    Catch::Contains("needs a forward_add_relu"));
}

TEST_CASE("resnet and resnet50 keep torchvision's state_dict names with the fused layers",
          "[engine][batchnorm]") {
  auto net = make_model("resnet50", ModelOptions{.width_divisor = 16});
  std::vector<std::string> names;
  for (Parameter* p : net->parameters()) names.push_back(p->name);
  for (Buffer* b : net->buffers()) names.push_back(b->name);
  // torchvision's resnet50 has 161 parameters and 159 buffers (53 BatchNorms x 3).
  CHECK(net->parameters().size() == 161);
  CHECK(net->buffers().size() == 159);
  for (const char* name : {"bn1.weight", "layer1.0.bn1.running_var", "layer1.0.bn2.bias",
                           "layer1.0.bn3.num_batches_tracked", "layer1.0.downsample.1.weight",
                           "layer4.2.bn3.running_mean"})
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  auto small = make_model("resnet");
  CHECK(small->parameters().size() == 62);  // torchvision's resnet18 less its 7x7 stem: same count
}
