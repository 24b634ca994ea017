// CrossEntropyLoss's fused path on CUDA (Note [cross-entropy paths]): taken
// for f16/bf16 logits after expect_backward, in place only when the caller's
// tensor is the logits' only holder, refused a backward with another dloss,
// not taken for f32 logits, without an announcement, or for two terms of a
// WeightedLosses reading one output; and the data-parallel step takes it in
// place, with the loss and the parameters of the unfused path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/world.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "engine/nn/loss.h"
#include "engine/optim/sgd.h"
#include "kernels/classification.h"
#include "kernels/half.h"
#include "support/world_of_one.h"
#include "support/xent_cases.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

// CrossEntropyLoss with the announcement dropped: the unfused path in the step.
class Unannounced final : public Loss {
 public:
  std::string describe() const override { return inner_.describe(); }
  core::Tensor forward(const core::Tensor& o, const core::Tensor& t, Context& ctx) override {
    return inner_.forward(o, t, ctx);
  }
  core::Tensor backward(float dloss, Context& ctx) override { return inner_.backward(dloss, ctx); }
  const core::Tensor& counted_rows() const override { return inner_.counted_rows(); }
  const char* path() const { return inner_.path(); }

 private:
  CrossEntropyLoss inner_;
};

}  // namespace

TEST_CASE("cross-entropy takes its fused path only when announced, 16-bit and on cuda",
          "[gpu][engine][loss]") {
  // Logits [3, 5, 1001] (a language model's [batch, seq, vocab]) in bf16.
  const std::int64_t rows = 15, classes = 1001;
  const test::XentCase c = test::make_xent_case(rows, classes, DType::bf16, DType::i64, -100, 31);
  const float dloss = 0.75f;
  // The twin (Note [fused cross-entropy]); tolerances as in
  // tests/gpu/test_gpu_fused_xent.cpp: one bf16 ulp, 2^-7 relative.
  const kernels::ClassificationShape s{rows, classes, -100, DType::i64, 0.0f};
  std::vector<std::uint16_t> twin(c.bits.size());
  float loss = 0, count = 0, correct = 0;
  kernels::cpu::softmax_xent_fused(s, DType::bf16, c.bits.data(), c.labels.data(), dloss,
                                   twin.data(), &loss, &count, &correct);
  const core::Tensor labels =
      core::Tensor::from_vector(c.labels, {3, 5}, DType::i64, core::Device::cpu()).to(kGpu);
  auto require_twin = [&](const core::Tensor& dlogits) {
    REQUIRE(dlogits.shape() == core::Shape{3, 5, classes});
    REQUIRE(dlogits.dtype() == DType::bf16);
    const auto got = dlogits.to_vector<std::uint16_t>();
    for (std::size_t k = 0; k < got.size(); ++k) {
      const double g = kernels::bf16_bits_to_f32(got[k]), want = kernels::bf16_bits_to_f32(twin[k]);
      INFO("element " << k << ": cuda " << g << ", twin " << want);
      const double target = test::xent_target(c.labels, classes, -100, 0.0, k);
      const double big = std::max(std::fabs(g), std::fabs(want));
      REQUIRE(std::fabs(g - want) <= 0x1p-7 * big + 0x1p-19 * (big + 2 * target * dloss / count));
    }
  };
  Context ctx;
  {
    CrossEntropyLoss ce;
    core::Tensor logits =
        core::Tensor::from_host(c.bits.data(), {3, 5, classes}, DType::bf16, kGpu);
    const void* memory = logits.data();
    ce.expect_backward(dloss);
    CHECK(ce.forward(logits, labels, ctx).to_vector<float>()[0] == Approx(loss).epsilon(1e-5));
    CHECK(std::string(ce.path()) == "fused in place");
    CHECK(ce.counted_rows().to_vector<float>()[0] == count);
    CHECK(ce.fused_correct().to_vector<float>()[0] == correct);
    CHECK_THROWS_WITH(ce.backward(1.0f, ctx),
                      Catch::Contains("dloss=1") && Catch::Contains("dloss=0.75"));
    const core::Tensor d = ce.backward(dloss, ctx);
    CHECK(d.data() == memory);
    require_twin(d);
  }
  {
    CrossEntropyLoss ce;
    const core::Tensor logits =
        core::Tensor::from_host(c.bits.data(), {3, 5, classes}, DType::bf16, kGpu);
    const core::Tensor kept = logits;  // a second holder: the logits must survive
    ce.expect_backward(dloss);
    ce.forward(logits, labels, ctx);
    CHECK(std::string(ce.path()) == "fused");
    require_twin(ce.backward(dloss, ctx));
    CHECK(kept.to_vector<std::uint16_t>() == c.bits);
  }
  {
    CrossEntropyLoss ce;
    const core::Tensor logits =
        core::Tensor::from_host(c.bits.data(), {3, 5, classes}, DType::bf16, kGpu);
    ce.forward(logits, labels, ctx);  // evaluation: nothing announced
    CHECK(std::string(ce.path()) == "f32");
    ce.expect_backward(dloss);
    ce.forward(logits.cast(DType::f32), labels, ctx);
    CHECK(std::string(ce.path()) == "f32");
    ce.backward(dloss, ctx);
  }
  {
    auto first = std::make_shared<CrossEntropyLoss>(),
         second = std::make_shared<CrossEntropyLoss>();
    WeightedLosses both({{first, "output", "targets", 1.0f}, {second, "output", "targets", 0.5f}});
    const core::NamedTensors outputs{
        {"output", core::Tensor::from_host(c.bits.data(), {3, 5, classes}, DType::bf16, kGpu)}};
    const core::NamedTensors batch{{"targets", labels}};
    both.expect_backward(dloss);
    both.forward_named(outputs, batch, ctx);
    CHECK(std::string(first->path()) == "f32");
    CHECK(std::string(second->path()) == "f32");
    both.backward_named(dloss, ctx);
  }
}

TEST_CASE("the data-parallel step takes the fused cross-entropy in place, as the unfused path",
          "[gpu][engine][loss]") {
  // Tolerances: the loss to 1e-5 relative (the kernels' f32 exponentials, f64
  // sums); the parameters after one SGD step (lr 0.1) to 1e-3: dlogits differ
  // by at most one bf16/f16 ulp (2^-7 relative), and each weight's gradient
  // sums 16 rows of |dlogits x| <= about 1.
  for (const DType autocast : {DType::bf16, DType::f16}) {
    INFO(dtype_name(autocast));
    auto run = [&](std::shared_ptr<Loss> loss, double& mean_loss) {
      comm::World& world = test::gpu_world_of_one();
      core::Stream stream = core::Stream::create(kGpu);
      Sequential model;
      model.emplace<Linear>("fc1", 24, 40);
      model.emplace<GELU>("act");
      model.emplace<Linear>("fc2", 40, 1001);
      model.set_input_grad(false);
      initialize(model, 11);
      ParameterStore store(model, kGpu, stream);
      SGD sgd(store, decay_groups(store, 0.1, 0.0), SgdOptions{}, stream);
      LossScaler scaler(
          LossScalerOptions{.enabled = autocast == DType::f16, .init_scale = 65536.0f});
      StepOptions o;
      o.autocast = autocast;
      o.loss = std::move(loss);
      DataParallelStep step(model, store, sgd, make_scheduler("constant", {}), scaler, &world, o,
                            stream);
      std::vector<float> x(16 * 24);
      std::vector<std::int64_t> y(16);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
      for (std::size_t i = 0; i < y.size(); ++i)
        y[i] = i % 4 == 3 ? -100 : static_cast<std::int64_t>((i * 131) % 1001);
      const MicroBatch batch{core::Tensor::from_vector(x, {16, 24}, DType::f32, kGpu, stream),
                             core::Tensor::from_vector(y, {16}, DType::i64, kGpu, stream)};
      const StepResult r = step.run(std::vector<MicroBatch>{batch});
      mean_loss = r.loss;
      std::vector<float> values;
      for (const ParameterStore::Slot& s : store.slots()) {
        const std::vector<float> v = s.parameter->value.to_vector<float>(stream);
        values.insert(values.end(), v.begin(), v.end());
      }
      return values;
    };
    auto fused = std::make_shared<CrossEntropyLoss>();
    auto unfused = std::make_shared<Unannounced>();
    double fused_loss = 0, unfused_loss = 0;
    const std::vector<float> a = run(fused, fused_loss), b = run(unfused, unfused_loss);
    CHECK(std::string(fused->path()) == "fused in place");
    CHECK(std::string(unfused->path()) == "f32");
    CHECK(fused_loss == Approx(unfused_loss).epsilon(1e-5));
    REQUIRE(a.size() == b.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      INFO("parameter element " << k);
      REQUIRE(std::fabs(a[k] - b[k]) <= 1e-3);
    }
  }
}
