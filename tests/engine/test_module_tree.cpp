// The module tree: dotted names, the grad-ready order and signal, Residual,
// ParameterStore's layout, initialisation, and a layer written outside the
// library.
#include <catch2/catch.hpp>

#include <cmath>

#include "engine/core/ops.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/parameter_store.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// A user's own layer: y = x * s for a learned per-feature scale s. Nothing
// in the library knows about it.
class FeatureScale : public Module {
 public:
  explicit FeatureScale(std::int64_t features) : Module("FeatureScale"), features_(features) {
    scale_ = &add_parameter("scale", {features}, ParamRole::weight);
  }
  void reset_parameters(core::Generator& /*rng*/) override { scale_->value.fill_(1.5); }
  core::Tensor forward(const core::Tensor& x, Context& /*ctx*/) override {
    if (x.shape().size() != 2 || x.dim(1) != features_) shape_error(x, "expects [batch, features]");
    input_ = x;
    core::Tensor y = core::Tensor::empty(x.shape(), DType::f32);
    const float *in = x.data_as<float>(), *s = scale_->value.data_as<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) y.data_as<float>()[i] = in[i] * s[i % features_];
    return y;
  }
  core::Tensor backward(const core::Tensor& dy, Context& /*ctx*/) override {
    core::Tensor dx = core::Tensor::empty(dy.shape(), DType::f32);
    const float *g = dy.data_as<float>(), *in = input_.data_as<float>(),
                *s = scale_->value.data_as<float>();
    float* ds = scale_->grad.data_as<float>();
    for (std::int64_t i = 0; i < dy.numel(); ++i) {
      dx.data_as<float>()[i] = g[i] * s[i % features_];
      ds[i % features_] += g[i] * in[i];
    }
    return dx;
  }

 private:
  std::int64_t features_;
  Parameter* scale_;
  core::Tensor input_;
};

std::unique_ptr<Sequential> small_net() {
  auto net = std::make_unique<Sequential>();
  net->emplace<Linear>("fc1", 6, 5);
  net->emplace<ReLU>("act");
  net->emplace<FeatureScale>("scale", 5);
  net->emplace<Linear>("fc2", 5, 3);
  return net;
}

std::vector<std::string> names(const std::vector<Parameter*>& ps) {
  std::vector<std::string> out;
  for (const Parameter* p : ps) out.push_back(p->name);
  return out;
}

}  // namespace

TEST_CASE("parameters have dotted names and a fixed ready order", "[engine][module]") {
  Sequential root;
  root.add("features", small_net());
  auto inner = std::make_unique<Sequential>();
  inner->emplace<Linear>("conv1", 3, 3);
  inner->emplace<Linear>("conv2", 3, 3);
  auto shortcut = std::make_unique<Sequential>();
  shortcut->emplace<Linear>("0", 3, 3, false);
  root.add("block", std::make_unique<Residual>(std::move(inner), std::move(shortcut)));
  root.assign_names();
  CHECK(names(root.parameters()) ==
        std::vector<std::string>{"features.fc1.weight", "features.fc1.bias", "features.scale.scale",
                                 "features.fc2.weight", "features.fc2.bias", "block.conv1.weight",
                                 "block.conv1.bias", "block.conv2.weight", "block.conv2.bias",
                                 "block.downsample.0.weight"});
  // Backward order: the block first (inner branch last to first, then the
  // shortcut), then features from fc2 back to fc1.
  CHECK(names(root.ready_order()) ==
        std::vector<std::string>{"block.conv2.weight", "block.conv2.bias", "block.conv1.weight",
                                 "block.conv1.bias", "block.downsample.0.weight",
                                 "features.fc2.weight", "features.fc2.bias", "features.scale.scale",
                                 "features.fc1.weight", "features.fc1.bias"});
}

TEST_CASE("backward reports each parameter once, in ready order", "[engine][module]") {
  auto net = small_net();
  net->emplace<Residual>(
      "res",
      [] {
        auto inner = std::make_unique<Sequential>();
        inner->emplace<Linear>("fc", 3, 3);
        return inner;
      }(),
      nullptr, "downsample", true);
  initialize(*net, 1);
  ParameterStore store(*net, core::Device::cpu());
  std::vector<std::string> reported;
  Context ctx;
  ctx.on_grad_ready = [&](Parameter& p) { reported.push_back(p.name); };
  const core::Tensor y = net->forward(test::random_f32({4, 6}, 2), ctx);
  net->backward(test::random_f32(y.shape(), 3), ctx);
  CHECK(reported == names(net->ready_order()));
  CHECK(reported.size() == store.slots().size());
}

TEST_CASE("Residual adds the shortcut and differentiates through both", "[engine][module]") {
  auto inner = std::make_unique<Sequential>();
  inner->emplace<Linear>("fc1", 4, 4);
  inner->emplace<GELU>("act");
  inner->emplace<Linear>("fc2", 4, 4);
  Residual block(std::move(inner), nullptr, "downsample", true);
  initialize(block, 4);
  test::check_gradients(block, test::random_f32({3, 4}, 5));
}

TEST_CASE("ParameterStore lays parameters out aligned, in ready order", "[engine][store]") {
  auto net = small_net();
  initialize(*net, 3);
  const auto before = net->parameters()[0]->value.to_vector<float>();
  ParameterStore store(*net, core::Device::cpu());
  std::int64_t expected_offset = 0;
  for (const auto& slot : store.slots()) {
    CHECK(slot.offset == expected_offset);
    CHECK(slot.offset % ParameterStore::kAlignElements == 0);
    CHECK(slot.parameter->value.storage() == store.values().storage());
    CHECK(slot.parameter->grad.storage() == store.grads().storage());
    CHECK(reinterpret_cast<std::uintptr_t>(slot.parameter->value.data()) % 256 == 0);
    expected_offset += (slot.numel + 63) / 64 * 64;
  }
  CHECK(store.size() == expected_offset);
  CHECK(net->parameters()[0]->value.to_vector<float>() == before);  // values copied in
  store.grads().fill_(1.0);
  store.zero_grad();
  CHECK(core::ops::sum(store.grads()).to_vector<float>()[0] == 0.0f);
  CHECK(store.index_of(*net->ready_order()[2]) == 2);
}

TEST_CASE("frozen parameters stay out of the gradient buffer", "[engine][store]") {
  auto net = small_net();
  for (Parameter* p : net->parameters())
    if (p->name.rfind("fc1.", 0) == 0) p->requires_grad = false;
  ParameterStore store(*net, core::Device::cpu());
  CHECK(store.slots().size() == 3);  // scale, fc2.weight, fc2.bias
  for (Parameter* p : net->parameters())
    if (!p->requires_grad) CHECK_FALSE(p->grad.defined());
  CHECK_THROWS_WITH(store.index_of(*net->parameters()[0]), Catch::Contains("fc1.weight"));
  Context ctx;
  net->backward(test::random_f32(net->forward(test::random_f32({2, 6}, 1), ctx).shape(), 2), ctx);
}

TEST_CASE("initialisation follows PyTorch's bounds and a seed reproduces it", "[engine][init]") {
  auto a = small_net(), b = small_net(), c = small_net();
  initialize(*a, 42);
  initialize(*b, 42);
  initialize(*c, 43);
  const auto wa = a->parameters()[0]->value.to_vector<float>();
  CHECK(wa == b->parameters()[0]->value.to_vector<float>());
  CHECK(wa != c->parameters()[0]->value.to_vector<float>());
  const float bound = 1.0f / std::sqrt(6.0f);  // fc1: fan_in 6
  float largest = 0;
  for (float w : wa) {
    REQUIRE(std::fabs(w) <= bound);
    largest = std::max(largest, std::fabs(w));
  }
  CHECK(largest > 0.8f * bound);  // 30 draws spread over the range
  CHECK(a->parameters()[2]->value.to_vector<float>() == std::vector<float>(5, 1.5f));
}

TEST_CASE("a layer written outside the library trains like a built-in one", "[engine][module]") {
  FeatureScale layer(4);
  initialize(layer, 1);
  test::check_gradients(layer, test::random_f32({3, 4}, 7));
}
