// Channels-last models and layers on the CPU (Note [channels-last layers] in
// engine/nn/channels_last.h): resnet and resnet50 in channels-last train as
// the NCHW models do, bit for bit (forward output, loss, every gradient,
// three SGD-momentum steps in f32 and under bf16 autocast, and a checkpoint
// taken from one continuing in the other); the wrapper keeps names and
// refuses what it cannot run; every spatial layer refuses an input of the
// other layout, naming the layout it expected. The reference is the NCHW
// model itself, and a plain loop for the layouts' definition.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/data_parallel_step.h"
#include "engine/models.h"
#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/channels_last.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/loss.h"
#include "engine/nn/pooling.h"
#include "engine/optim/lr_scheduler.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "support/gradcheck.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

std::vector<std::uint8_t> bytes(const core::Tensor& t) {
  std::vector<std::uint8_t> out(t.nbytes());
  std::memcpy(out.data(), t.data(), out.size());
  return out;
}

// The layouts' definition, as a loop: y[n, h, w, c] = x[n, c, h, w].
core::Tensor to_nhwc(const core::Tensor& x) {
  const std::int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  const std::vector<float> in = x.to_vector<float>();
  std::vector<float> out(in.size());
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t k = 0; k < c; ++k)
      for (std::int64_t i = 0; i < h * w; ++i)
        out[static_cast<std::size_t>((b * h * w + i) * c + k)] =
            in[static_cast<std::size_t>((b * c + k) * h * w + i)];
  return core::Tensor::from_vector(out, {n, h, w, c}, DType::f32);
}

// The image size each preset is tested at, and its widths: small enough to
// train three steps of both models in both precisions in seconds, large
// enough that every stage has more than one position (resnet50 at 64x64:
// 32, 16, 16, 8, 4, 2 down the stages; resnet at 32x32: 32 to 4).
constexpr std::int64_t kWidthDivisor = 16, kClasses = 10, kBatch = 4;

core::Tensor images(const std::string& name) {
  const std::int64_t size = name == "resnet50" ? 64 : 32;
  core::Tensor x = core::Tensor::empty({kBatch, 3, size, size}, DType::f32, core::Device::cpu());
  core::Generator(5).normal(x, 0.0f, 1.0f);
  return x;
}

core::Tensor labels() {
  return core::Tensor::from_vector<std::int64_t>({3, 7, 0, 9}, {kBatch}, DType::i64);
}

std::unique_ptr<Module> build(const std::string& name, bool channels_last) {
  auto model = make_model(name, ModelOptions{.width_divisor = kWidthDivisor,
                                             .classes = kClasses,
                                             .channels_last = channels_last});
  initialize(*model, 7);
  return model;
}

// A model with its store, SGD with momentum and weight decay, and the step.
struct Training {
  Training(const std::string& name, bool channels_last, std::optional<DType> autocast)
      : model(build(name, channels_last)),
        store(*model, core::Device::cpu()),
        sgd(store, single_group(store, 0.05, 1e-4), SgdOptions{.momentum = 0.9}),
        scaler(LossScaler::for_autocast(autocast)),
        step(*model, store, sgd, make_scheduler("constant", {}), scaler, &test::world_of_one(),
             options(autocast), {}) {}
  static StepOptions options(std::optional<DType> autocast) {
    StepOptions o;
    o.autocast = autocast;
    return o;
  }
  std::unique_ptr<Module> model;
  ParameterStore store;
  SGD sgd;
  LossScaler scaler;
  DataParallelStep step;
};

// Every parameter's value and gradient and every buffer, bit for bit.
void require_same_state(Module& nchw, Module& nhwc, const std::string& when) {
  const auto a = nchw.parameters(), b = nhwc.parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(when << ": " << a[i]->name);
    REQUIRE(b[i]->name == a[i]->name);
    CHECK(bytes(b[i]->value) == bytes(a[i]->value));
    CHECK(bytes(b[i]->grad) == bytes(a[i]->grad));
  }
  const auto ba = nchw.buffers(), bb = nhwc.buffers();
  REQUIRE(ba.size() == bb.size());
  for (std::size_t i = 0; i < ba.size(); ++i) {
    INFO(when << ": " << ba[i]->name);
    CHECK(bytes(bb[i]->value) == bytes(ba[i]->value));
  }
}

// One training forward and backward outside the step: the output (the
// logits), the loss and the order in which gradients are reported ready.
struct Pass {
  std::vector<std::uint8_t> output, loss;
  std::vector<std::string> ready;
};

Pass forward_backward(Module& model, std::optional<DType> autocast, const core::Tensor& x) {
  Pass out;
  Context ctx;
  ctx.autocast = autocast;
  ctx.on_grad_ready = [&](Parameter& p) { out.ready.push_back(p.name); };
  CrossEntropyLoss loss;
  const core::Tensor y = model.forward(x, ctx);
  out.output = bytes(y);
  out.loss = bytes(loss.forward(y, labels(), ctx));
  model.backward(loss.backward(1.0f, ctx), ctx);
  model.report_ready(ctx);
  return out;
}

std::string label(const std::string& name, std::optional<DType> autocast) {
  return name + (autocast ? " bf16 autocast" : " f32");
}

}  // namespace

TEST_CASE("channels-last resnet and resnet50 train as the NCHW models bit for bit on the cpu",
          "[engine][channels_last][resnet50]") {
  // No tolerance: on the CPU every NHWC op computes the NCHW op's values in
  // the same order (Note [channels-last layers]).
  for (const std::string name : {"resnet", "resnet50"})
    for (const std::optional<DType> autocast :
         {std::optional<DType>(), std::optional<DType>(DType::bf16)}) {
      const std::string what = label(name, autocast);
      INFO(what);
      const core::Tensor x = images(name);
      {
        auto nchw = build(name, false), nhwc = build(name, true);
        ParameterStore nchw_store(*nchw, core::Device::cpu());
        ParameterStore nhwc_store(*nhwc, core::Device::cpu());
        const Pass a = forward_backward(*nchw, autocast, x);
        const Pass b = forward_backward(*nhwc, autocast, x);
        CHECK(b.output == a.output);
        CHECK(b.loss == a.loss);
        CHECK(b.ready == a.ready);
        require_same_state(*nchw, *nhwc, what + ", one forward and backward");
      }
      Training nchw(name, false, autocast), nhwc(name, true, autocast);
      const MicroBatch batch{x, labels()};
      for (int s = 1; s <= 3; ++s) {
        const StepResult a = nchw.step.run({&batch, 1});
        const StepResult b = nhwc.step.run({&batch, 1});
        CHECK_FALSE(a.skipped);
        CHECK(b.loss == a.loss);
        CHECK(b.grad_norm == a.grad_norm);
        require_same_state(*nchw.model, *nhwc.model, what + ", step " + std::to_string(s));
      }
      // A checkpoint of either layout continues in the other: the same step 4.
      TrainingState state;
      state.step = 3;
      const CheckpointContents from_nhwc =
          capture_checkpoint(*nhwc.model, nhwc.sgd, state, core::Stream{});
      const CheckpointContents from_nchw =
          capture_checkpoint(*nchw.model, nchw.sgd, state, core::Stream{});
      Training nchw_resumed(name, false, autocast), nhwc_resumed(name, true, autocast);
      restore_checkpoint(from_nhwc, "the channels-last run's", *nchw_resumed.model,
                         nchw_resumed.sgd, {}, {}, core::Stream{});
      restore_checkpoint(from_nchw, "the NCHW run's", *nhwc_resumed.model, nhwc_resumed.sgd, {}, {},
                         core::Stream{});
      nchw_resumed.step.set_steps(3);
      nhwc_resumed.step.set_steps(3);
      const double loss = nchw.step.run({&batch, 1}).loss;
      CHECK(nhwc.step.run({&batch, 1}).loss == loss);
      CHECK(nchw_resumed.step.run({&batch, 1}).loss == loss);
      CHECK(nhwc_resumed.step.run({&batch, 1}).loss == loss);
      require_same_state(*nchw.model, *nchw_resumed.model,
                         what + ", step 4 from NHWC's checkpoint");
      require_same_state(*nchw.model, *nhwc_resumed.model,
                         what + ", step 4 from NCHW's checkpoint");
      require_same_state(*nchw.model, *nhwc.model, what + ", step 4");
      // Eval: BatchNorm normalises with the running statistics instead.
      for (Module* m : {nchw.model.get(), nhwc.model.get()}) m->eval();
      Context eval;
      eval.autocast = autocast;
      CHECK(bytes(nhwc.model->forward(x, eval)) == bytes(nchw.model->forward(x, eval)));
    }
}

TEST_CASE("channels-last with activation checkpointing gives the NCHW model's gradients",
          "[engine][channels_last]") {
  // Checkpointed stages inside the ChannelsLast: recomputed in NHWC, the same bits.
  auto nchw = build("resnet", false);
  auto both = make_model("resnet", ModelOptions{.activation_checkpointing = true,
                                                .width_divisor = kWidthDivisor,
                                                .classes = kClasses,
                                                .channels_last = true});
  initialize(*both, 7);
  ParameterStore a_store(*nchw, core::Device::cpu()), b_store(*both, core::Device::cpu());
  const core::Tensor x = images("resnet");
  const Pass a = forward_backward(*nchw, std::nullopt, x);
  const Pass b = forward_backward(*both, std::nullopt, x);
  CHECK(b.loss == a.loss);
  CHECK(b.ready == a.ready);
  require_same_state(*nchw, *both, "resnet, checkpointed stages in channels-last");
}

TEST_CASE("make_model's positional form still builds the same model", "[engine][channels_last]") {
  // Deprecated for one release (CHANGELOG.md): it must keep compiling and building.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  auto old = make_model("resnet50", 0.0f, true, kWidthDivisor, true, kClasses);
#pragma GCC diagnostic pop
  auto now = make_model("resnet50", ModelOptions{.activation_checkpointing = true,
                                                 .width_divisor = kWidthDivisor,
                                                 .zero_init_residual = true,
                                                 .classes = kClasses});
  initialize(*old, 1);
  initialize(*now, 1);
  const auto a = old->parameters(), b = now->parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i]->name);
    CHECK(b[i]->name == a[i]->name);
    CHECK(bytes(b[i]->value) == bytes(a[i]->value));
  }
}

TEST_CASE("ChannelsLast keeps the wrapped model's names, order and layers' settings",
          "[engine][channels_last]") {
  auto nchw = build("resnet50", false), nhwc = build("resnet50", true);
  REQUIRE(nhwc->type_name() == "ChannelsLast");
  std::vector<std::string> a, b;
  for (Parameter* p : nchw->ready_order()) a.push_back(p->name);
  for (Parameter* p : nhwc->ready_order()) b.push_back(p->name);
  CHECK(b == a);
  CHECK(b.front() == "fc.weight");  // Note [grad-ready order]: the last layer first
  a.clear();
  b.clear();
  for (Buffer* p : nchw->buffers()) a.push_back(p->name);
  for (Buffer* p : nhwc->buffers()) b.push_back(p->name);
  CHECK(b == a);
  CHECK(b.front() == "bn1.running_mean");
  // Every spatial layer runs channels-last, and none of the plain model's does.
  int spatial = 0;
  std::vector<Module*> stack{nhwc.get()};
  while (!stack.empty()) {
    Module* m = stack.back();
    stack.pop_back();
    for (Module* c : m->children()) stack.push_back(c);
    std::optional<bool> layout;
    if (auto* conv = dynamic_cast<Conv2d*>(m)) layout = conv->channels_last();
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) layout = bn->channels_last();
    if (auto* pool = dynamic_cast<MaxPool2d*>(m)) layout = pool->channels_last();
    if (auto* pool = dynamic_cast<GlobalAvgPool2d*>(m)) layout = pool->channels_last();
    if (!layout) continue;
    INFO(m->describe());
    CHECK(*layout);
    ++spatial;
  }
  CHECK(spatial == 53 + 53 + 2);  // convolutions, BatchNorms, the two pools
  // The plain model's Conv2d keeps NCHW.
  CHECK_FALSE(dynamic_cast<Conv2d*>(nchw->children().front())->channels_last());
}

TEST_CASE("ChannelsLast refuses models whose layers before the global pool need NCHW",
          "[engine][channels_last]") {
  // cnn flattens its 7x7 maps: in NHWC their features would come in another order.
  auto cnn = make_model("cnn", ModelOptions{.width_divisor = 16});
  CHECK_THROWS_WITH(ChannelsLast(std::move(cnn)),
                    Catch::Contains("Flatten 'flatten' comes before any GlobalAvgPool2d") &&
                        Catch::Contains("build this model without channels-last"));
  CHECK_THROWS_WITH(make_model("cnn", ModelOptions{.channels_last = true}),
                    Catch::Contains("model 'cnn' has no channels-last form"));
  CHECK_THROWS_WITH(ChannelsLast(std::make_unique<ChannelsLast>(std::make_unique<Sequential>())),
                    Catch::Contains("is a ChannelsLast already"));
  auto net = build("resnet", true);
  Context ctx;
  CHECK_THROWS_WITH(net->forward(core::Tensor::zeros({2, 3, 32}, DType::f32), ctx),
                    Catch::Contains("expects an NCHW image batch [batch, channels, H, W]"));
}

TEST_CASE("a channels-last model without a global pool gives and takes NCHW at its edges",
          "[engine][channels_last]") {
  // Conv (with a bias, groups and dilation), BatchNorm with its ReLU, both
  // pools: the output stays an image, which ChannelsLast returns as NCHW.
  auto make = [] {
    auto seq = std::make_unique<Sequential>();
    seq->emplace<Conv2d>("conv", 4, 6, 3, 1, 2, 2, 2, true);
    seq->emplace<BatchNorm2d>("bn", 6, 1e-5, 0.1, true, true, BatchNormActivation::relu);
    seq->emplace<MaxPool2d>("max", 3, 2, 1);
    seq->emplace<AvgPool2d>("avg", 2);
    seq->emplace<ReLU>("relu");
    return seq;
  };
  std::unique_ptr<Module> nchw = make();
  std::unique_ptr<Module> nhwc = std::make_unique<ChannelsLast>(make());
  for (Module* m : {nchw.get(), nhwc.get()}) {
    m->assign_names();
    initialize(*m, 3);
  }
  ParameterStore a_store(*nchw, core::Device::cpu()), b_store(*nhwc, core::Device::cpu());
  const core::Tensor x = test::random_f32({3, 4, 11, 9}, 8);
  Context ctx;
  const core::Tensor ya = nchw->forward(x, ctx), yb = nhwc->forward(x, ctx);
  REQUIRE(yb.shape() == ya.shape());
  CHECK(bytes(yb) == bytes(ya));
  const core::Tensor dy = test::random_f32(ya.shape(), 9);
  const core::Tensor dxa = nchw->backward(dy, ctx), dxb = nhwc->backward(dy, ctx);
  REQUIRE(dxb.shape() == x.shape());
  CHECK(bytes(dxb) == bytes(dxa));
  require_same_state(*nchw, *nhwc, "conv with bias, BatchNorm, pools");
}

TEST_CASE("spatial layers in channels-last take NHWC and refuse NCHW, naming the layout",
          "[engine][channels_last]") {
  const core::Tensor x = test::random_f32({2, 8, 5, 6}, 4);  // NCHW, 8 channels
  const core::Tensor x_nhwc = to_nhwc(x);
  Context ctx;
  Conv2d conv(8, 4, 3, 1, 1);
  BatchNorm2d bn(8);
  MaxPool2d max_pool(2);
  AvgPool2d avg_pool(2);
  GlobalAvgPool2d global_pool;
  // NCHW layers refuse NHWC, saying NCHW.
  CHECK_THROWS_WITH(conv.forward(x_nhwc, ctx),
                    Catch::Contains("Conv2d") && Catch::Contains("expects NCHW [batch, 8, H, W]"));
  CHECK_THROWS_WITH(bn.forward(x_nhwc, ctx), Catch::Contains("BatchNorm2d") &&
                                                 Catch::Contains("expects NCHW [batch, 8, H, W]"));
  // Channels-last layers refuse NCHW, saying channels-last.
  conv.set_channels_last(true);
  bn.set_channels_last(true);
  CHECK_THROWS_WITH(conv.forward(x, ctx),
                    Catch::Contains("Conv2d") &&
                        Catch::Contains("input has shape [2, 8, 5, 6], expects channels-last "
                                        "(NHWC) [batch, H, W, 8]"));
  CHECK_THROWS_WITH(bn.forward(x, ctx),
                    Catch::Contains("BatchNorm2d") &&
                        Catch::Contains("expects channels-last (NHWC) [batch, H, W, 8]"));
  max_pool.set_channels_last(true);
  avg_pool.set_channels_last(true);
  global_pool.set_channels_last(true);
  const core::Tensor small = test::random_f32({2, 1, 1, 8}, 5);  // NHWC 1x1: too small for 2x2
  CHECK_THROWS_WITH(max_pool.forward(small, ctx),
                    Catch::Contains("MaxPool2d") &&
                        Catch::Contains("expects channels-last (NHWC) [batch, H, W, channels]"));
  CHECK_THROWS_WITH(avg_pool.forward(small, ctx),
                    Catch::Contains("AvgPool2d") &&
                        Catch::Contains("expects channels-last (NHWC) [batch, H, W, channels]"));
  CHECK_THROWS_WITH(global_pool.forward(core::Tensor::zeros({2, 8}, DType::f32), ctx),
                    Catch::Contains("GlobalAvgPool2d") &&
                        Catch::Contains("expects channels-last (NHWC) [batch, H, W, channels]"));
  // And take NHWC: the NCHW result transposed (the loop above), bit for bit.
  Conv2d plain_conv(8, 4, 3, 1, 1);
  initialize(plain_conv, 2);
  initialize(conv, 2);
  CHECK(bytes(conv.forward(x_nhwc, ctx)) == bytes(to_nhwc(plain_conv.forward(x, ctx))));
  MaxPool2d plain_max(2);
  CHECK(bytes(max_pool.forward(x_nhwc, ctx)) == bytes(to_nhwc(plain_max.forward(x, ctx))));
  GlobalAvgPool2d plain_global;
  const core::Tensor g = global_pool.forward(x_nhwc, ctx);
  CHECK(g.shape() == core::Shape{2, 8, 1, 1});
  CHECK(bytes(g) == bytes(plain_global.forward(x, ctx)));
}
