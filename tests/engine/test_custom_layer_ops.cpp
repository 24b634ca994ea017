// Custom layers written only with the ops of engine/core/tensor_ops.h, as a
// user writes them (examples/custom's SiLU is one), held to finite
// differences (tests/support/gradcheck.h): the ops compose into forward and
// backward passes, broadcasting, reductions with keepdim, slices, concat and
// where included.
#include <catch2/catch.hpp>

#include <vector>

#include "engine/core/tensor_ops.h"
#include "engine/nn/module.h"
#include "support/gradcheck.h"

using namespace lockstep;
namespace ops = lockstep::core::ops;

namespace {

// y = x * softmax(x) along the last dim; dx = p (dy + g - sum(g p)), g = dy x.
class SoftmaxGate : public engine::Module {
 public:
  SoftmaxGate() : Module("SoftmaxGate") {}
  core::Tensor forward(const core::Tensor& x, engine::Context& ctx) override {
    input_ = x;
    probs_ = ops::softmax(x, -1, ctx.stream);
    return ops::mul(x, probs_, ctx.stream);
  }
  core::Tensor backward(const core::Tensor& dy, engine::Context& ctx) override {
    const core::Stream& s = ctx.stream;
    const core::Tensor g = ops::mul(dy, input_, s);
    const core::Tensor weighted = ops::sum(ops::mul(g, probs_, s), -1, /*keepdim=*/true, s);
    return ops::mul(probs_, ops::sub(ops::add(dy, g, s), weighted, s), s);
  }

 private:
  core::Tensor input_, probs_;
};

// The last dim split at `split`: tanh of the first part, sigmoid of the rest.
class SplitActivation : public engine::Module {
 public:
  explicit SplitActivation(std::int64_t split) : Module("SplitActivation"), split_(split) {}
  core::Tensor forward(const core::Tensor& x, engine::Context& ctx) override {
    const core::Stream& s = ctx.stream;
    const std::int64_t n = x.shape().back();
    tanh_ = ops::tanh(ops::slice(x, -1, 0, split_, s), s);
    sigmoid_ = ops::sigmoid(ops::slice(x, -1, split_, n, s), s);
    return ops::concat({tanh_, sigmoid_}, -1, s);
  }
  core::Tensor backward(const core::Tensor& dy, engine::Context& ctx) override {
    const core::Stream& s = ctx.stream;
    const std::int64_t n = dy.shape().back();
    const core::Tensor da =
        ops::mul(ops::slice(dy, -1, 0, split_, s), ops::sub(1.0, ops::mul(tanh_, tanh_, s), s), s);
    const core::Tensor db = ops::mul(ops::slice(dy, -1, split_, n, s),
                                     ops::mul(sigmoid_, ops::sub(1.0, sigmoid_, s), s), s);
    return ops::concat({da, db}, -1, s);
  }

 private:
  std::int64_t split_;
  core::Tensor tanh_, sigmoid_;
};

// Leaky ReLU as maximum(x, 0.1 x); backward selects with where on relu(x).
class LeakyMax : public engine::Module {
 public:
  LeakyMax() : Module("LeakyMax") {}
  core::Tensor forward(const core::Tensor& x, engine::Context& ctx) override {
    input_ = x;
    return ops::maximum(x, ops::mul(x, 0.1, ctx.stream), ctx.stream);
  }
  core::Tensor backward(const core::Tensor& dy, engine::Context& ctx) override {
    const core::Stream& s = ctx.stream;
    return ops::where(ops::relu(input_, s), dy, ops::mul(dy, 0.1, s), s);
  }

 private:
  core::Tensor input_;
};

}  // namespace

TEST_CASE("layers written with core ops pass the finite-difference gradient check",
          "[engine][ops]") {
  SoftmaxGate gate;
  test::check_gradients(gate, test::random_f32({4, 6}, 1));
  SplitActivation split(3);
  test::check_gradients(split, test::random_f32({4, 2, 7}, 2, 2.0f));
  // Values at least 0.1 from the kink at 0, beyond the difference's step.
  std::vector<float> v(40);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = (i % 3 ? -1.0f : 1.0f) * (0.1f + 0.037f * static_cast<float>(i));
  LeakyMax leaky;
  test::check_gradients(leaky, core::Tensor::from_vector(v, {5, 8}, DType::f32));
}
