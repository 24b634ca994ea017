// BatchNorm2d on the CPU: training and eval outputs and the running
// statistics after two steps against PyTorch's formulas in float64, finite-
// difference gradients, autocast, buffers and names, and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using lockstep::test::check_gradients;
using lockstep::test::random_f32;

namespace {

// Per-channel mean and biased variance of an [N, C, H, W] batch, in float64.
struct Moments {
  std::vector<double> mean, var;
  double count;
};

Moments moments(const std::vector<float>& x, const core::Shape& shape) {
  const std::int64_t n_ = shape[0], c_ = shape[1], hw = shape[2] * shape[3];
  Moments m{std::vector<double>(c_, 0.0), std::vector<double>(c_, 0.0),
            static_cast<double>(n_ * hw)};
  for (std::int64_t n = 0; n < n_; ++n)
    for (std::int64_t c = 0; c < c_; ++c)
      for (std::int64_t i = 0; i < hw; ++i) m.mean[c] += x[(n * c_ + c) * hw + i] / m.count;
  for (std::int64_t n = 0; n < n_; ++n)
    for (std::int64_t c = 0; c < c_; ++c)
      for (std::int64_t i = 0; i < hw; ++i) {
        const double d = x[(n * c_ + c) * hw + i] - m.mean[c];
        m.var[c] += d * d / m.count;
      }
  return m;
}

void require_near(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])));
  }
}

}  // namespace

TEST_CASE("BatchNorm2d trains on batch statistics and tracks PyTorch's running statistics",
          "[engine][batchnorm]") {
  BatchNorm2d bn(2);
  Context ctx;
  const core::Shape shape{2, 2, 1, 2};
  // Channel 0 holds 1, 2, 3, 4 then 2, 4, 6, 8: by hand, running_mean =
  // 0.9 (0.1 * 2.5) + 0.1 * 5 = 0.725 and running_var = 0.9 (0.9 + 0.1 * 5/3)
  // + 0.1 * 20/3 = 1.626667 (the unbiased variances 5/3 and 20/3).
  const std::vector<std::vector<float>> batches = {{1, 2, -1, 0.5f, 3, 4, 2, -3},
                                                   {2, 4, 7, 7, 6, 8, 7, 9}};
  std::vector<double> running_mean{0, 0}, running_var{1, 1};
  for (const auto& values : batches) {
    const auto y = bn.forward(core::Tensor::from_vector(values, shape, DType::f32), ctx);
    const Moments m = moments(values, shape);
    std::vector<double> want(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::size_t c = i / 2 % 2;
      want[i] = (values[i] - m.mean[c]) / std::sqrt(m.var[c] + 1e-5);
    }
    require_near(y.to_vector<float>(), want, 1e-6);  // f32 rounding of O(1) values
    for (std::size_t c = 0; c < 2; ++c) {            // PyTorch: unbiased variance, momentum 0.1
      running_mean[c] = 0.9 * running_mean[c] + 0.1 * m.mean[c];
      running_var[c] = 0.9 * running_var[c] + 0.1 * m.var[c] * m.count / (m.count - 1);
    }
  }
  require_near(bn.running_mean()->value.to_vector<float>(), running_mean, 1e-6);
  require_near(bn.running_var()->value.to_vector<float>(), running_var, 1e-6);
  CHECK(std::fabs(bn.running_mean()->value.to_vector<float>()[0] - 0.725) < 1e-6);
  CHECK(std::fabs(bn.running_var()->value.to_vector<float>()[0] - 1.6266667) < 1e-6);
  CHECK(bn.num_batches_tracked()->value.to_vector<std::int64_t>() == std::vector<std::int64_t>{2});

  // Eval: the running statistics, the affine parameters, nothing updated.
  bn.eval();
  bn.weight()->value.copy_from(core::Tensor::from_vector<float>({2, -1}, {2}, DType::f32));
  bn.bias()->value.copy_from(core::Tensor::from_vector<float>({1, 0.5f}, {2}, DType::f32));
  const std::vector<float> values = {0, 1, 2, 3, 4, 5, 6, 7};
  const auto y = bn.forward(core::Tensor::from_vector(values, shape, DType::f32), ctx);
  const double weight[] = {2, -1}, bias[] = {1, 0.5};
  std::vector<double> want(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::size_t c = i / 2 % 2;
    want[i] =
        (values[i] - running_mean[c]) / std::sqrt(running_var[c] + 1e-5) * weight[c] + bias[c];
  }
  require_near(y.to_vector<float>(), want, 1e-6);
  require_near(bn.running_mean()->value.to_vector<float>(), running_mean, 1e-6);
  CHECK(bn.num_batches_tracked()->value.to_vector<std::int64_t>() == std::vector<std::int64_t>{2});
  CHECK_THROWS_WITH(bn.backward(y, ctx), Catch::Contains("without a training-mode forward"));
}

TEST_CASE("BatchNorm2d gradients match finite differences", "[engine][batchnorm]") {
  struct Case {
    core::Shape shape;
    bool affine, track;
  };
  for (const Case& c : {Case{{3, 4, 2, 3}, true, true}, Case{{5, 3, 1, 1}, true, false},
                        Case{{2, 2, 3, 1}, false, true}}) {
    BatchNorm2d bn(c.shape[1], 1e-5, 0.1, c.affine, c.track);
    if (c.affine) {  // away from the initial 1 and 0, so that both gradients matter
      bn.weight()->value.copy_from(random_f32({c.shape[1]}, 1, 2.0f));
      bn.bias()->value.copy_from(random_f32({c.shape[1]}, 2));
    }
    check_gradients(bn, random_f32(c.shape, 3));
  }
}

TEST_CASE("BatchNorm2d normalises in f32 under autocast", "[engine][batchnorm][autocast]") {
  BatchNorm2d bn(3);
  Context low;
  low.autocast = DType::f16;
  const core::Tensor x = random_f32({4, 3, 2, 2}, 4).cast(DType::f16);
  const core::Tensor y = bn.forward(x, low);
  REQUIRE(y.dtype() == DType::f32);
  const core::Tensor dx = bn.backward(random_f32(y.shape(), 5), low);
  CHECK(dx.dtype() == DType::f16);
  BatchNorm2d reference(3);
  Context f32;
  CHECK(reference.forward(x.cast(DType::f32), f32).to_vector<float>() == y.to_vector<float>());
}

TEST_CASE("BatchNorm2d has PyTorch's names, roles and buffers", "[engine][batchnorm]") {
  Sequential net;
  auto& bn = net.emplace<BatchNorm2d>("bn1", 4);
  net.assign_names();
  REQUIRE(net.parameters().size() == 2);
  CHECK(net.parameters()[0]->name == "bn1.weight");
  CHECK(net.parameters()[1]->name == "bn1.bias");
  CHECK(net.parameters()[0]->role == ParamRole::norm);
  CHECK(bn.weight()->value.to_vector<float>() == std::vector<float>(4, 1.0f));
  const auto buffers = net.buffers();
  REQUIRE(buffers.size() == 3);
  CHECK(buffers[0]->name == "bn1.running_mean");
  CHECK(buffers[1]->name == "bn1.running_var");
  CHECK(buffers[2]->name == "bn1.num_batches_tracked");
  CHECK(buffers[2]->value.shape().empty());
  CHECK(buffers[2]->value.dtype() == DType::i64);
  CHECK(buffers[1]->value.to_vector<float>() == std::vector<float>(4, 1.0f));
  BatchNorm2d plain(4, 1e-5, 0.1, false, false);
  CHECK(plain.parameters().empty());
  CHECK(plain.buffers().empty());
}

TEST_CASE("BatchNorm2d gives frozen parameters no gradient", "[engine][batchnorm]") {
  BatchNorm2d bn(2);
  bn.weight()->requires_grad = false;
  Context ctx;
  const core::Tensor y = bn.forward(random_f32({3, 2, 2, 2}, 6), ctx);
  bn.backward(random_f32(y.shape(), 7), ctx);
  CHECK(bn.weight()->grad.to_vector<float>() == std::vector<float>{0, 0});
  CHECK(bn.bias()->grad.to_vector<float>() != std::vector<float>{0, 0});
}

TEST_CASE("a shape that does not fit BatchNorm2d names the layer and both shapes",
          "[engine][batchnorm]") {
  Sequential net;
  net.emplace<BatchNorm2d>("bn1", 3);
  net.assign_names();
  Context ctx;
  CHECK_THROWS_WITH(net.forward(random_f32({2, 4, 3, 3}, 1), ctx),
                    Catch::Contains("BatchNorm2d 'bn1'") && Catch::Contains("[2, 4, 3, 3]") &&
                        Catch::Contains("[batch, 3, H, W]"));
  CHECK_THROWS_WITH(net.forward(random_f32({1, 3, 1, 1}, 1), ctx),
                    Catch::Contains("BatchNorm2d 'bn1'") && Catch::Contains("[1, 3, 1, 1]") &&
                        Catch::Contains("more than one value per channel"));
  net.eval();  // running statistics: one value per channel is fine
  CHECK(net.forward(random_f32({1, 3, 1, 1}, 1), ctx).shape() == core::Shape{1, 3, 1, 1});
}
