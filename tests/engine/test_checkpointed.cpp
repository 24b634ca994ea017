// Activation checkpointing (engine/nn/checkpointed.h): a model with its blocks
// checkpointed gives the plain model's loss, gradients, grad-ready order and
// BatchNorm running statistics bit for bit, in f32 and under bf16 autocast,
// with dropout on, and keeps the plain model's names; the presets without
// blocks refuse the option.
#include <catch2/catch.hpp>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/memory.h"
#include "engine/models.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/loss.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// One training forward and backward: what a checkpoint must not change.
struct Outcome {
  std::vector<std::uint8_t> loss;  // bytes: compared bit for bit
  std::vector<std::string> ready;  // parameters as on_grad_ready saw them
  std::vector<std::string> parameter_names, buffer_names;
  std::vector<std::vector<std::uint8_t>> grads, buffers;
};

std::vector<std::uint8_t> bytes(const core::Tensor& t) {
  std::vector<std::uint8_t> out(t.nbytes());
  std::memcpy(out.data(), t.data(), out.size());
  return out;
}

core::Tensor inputs(const ModelPreset& preset, std::int64_t batch, std::int64_t seq) {
  if (preset.language_model) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(batch * seq));
    for (std::size_t i = 0; i < t.size(); ++i)
      t[i] = static_cast<std::int32_t>((i * 7 + 3) % preset.classes);
    return core::Tensor::from_vector(t, {batch, seq}, DType::i32);
  }
  core::Shape shape{batch};
  shape.insert(shape.end(), preset.sample_shape.begin(), preset.sample_shape.end());
  core::Tensor x = core::Tensor::empty(shape, DType::f32, core::Device::cpu());
  core::Generator(2).normal(x, 0.0f, 1.0f);
  return x;
}

core::Tensor targets(const ModelPreset& preset, std::int64_t batch, std::int64_t seq) {
  const std::int64_t n = preset.language_model ? batch * seq : batch;
  std::vector<std::int64_t> y(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = static_cast<std::int64_t>((i * 5 + 1) % preset.classes);
  return preset.language_model ? core::Tensor::from_vector(y, {batch, seq}, DType::i64)
                               : core::Tensor::from_vector(y, {batch}, DType::i64);
}

// Two micro-batches (the second at first_sample 2, as accumulation numbers
// rows), so that a second forward sees the first one's running statistics.
Outcome train_once(Module& model, const ModelPreset& preset, std::optional<DType> autocast) {
  const std::int64_t batch = 2, seq = preset.language_model ? 16 : 0;
  Outcome out;
  model.train();
  for (int k = 0; k < 2; ++k) {
    Context ctx;
    ctx.autocast = autocast;
    ctx.seed = 11;
    ctx.step = 3;
    ctx.first_sample = k * batch;
    ctx.on_grad_ready = [&](Parameter& p) { out.ready.push_back(p.name); };
    CrossEntropyLoss loss;
    const core::Tensor l = loss.forward(model.forward(inputs(preset, batch, seq), ctx),
                                        targets(preset, batch, seq), ctx);
    const std::vector<std::uint8_t> lb = bytes(l);
    out.loss.insert(out.loss.end(), lb.begin(), lb.end());
    model.backward(loss.backward(1.0f, ctx), ctx);
    model.report_ready(ctx);
  }
  for (Parameter* p : model.parameters()) {
    out.parameter_names.push_back(p->name);
    out.grads.push_back(bytes(p->grad));
  }
  for (Buffer* b : model.buffers()) {
    out.buffer_names.push_back(b->name);
    out.buffers.push_back(bytes(b->value));
  }
  return out;
}

void require_same(const Outcome& plain, const Outcome& checkpointed) {
  CHECK(checkpointed.parameter_names == plain.parameter_names);
  CHECK(checkpointed.buffer_names == plain.buffer_names);
  CHECK(checkpointed.ready == plain.ready);
  CHECK(checkpointed.loss == plain.loss);
  REQUIRE(checkpointed.grads.size() == plain.grads.size());
  for (std::size_t i = 0; i < plain.grads.size(); ++i) {
    INFO(plain.parameter_names[i]);
    CHECK(checkpointed.grads[i] == plain.grads[i]);
  }
  for (std::size_t i = 0; i < plain.buffers.size(); ++i) {
    INFO(plain.buffer_names[i]);  // BatchNorm's running statistics moved once, not twice
    CHECK(checkpointed.buffers[i] == plain.buffers[i]);
  }
}

}  // namespace

TEST_CASE("checkpointed gpt-tiny and resnet give the plain model's gradients bit for bit",
          "[engine][checkpointed]") {
  // Bit for bit, no tolerance: the recompute runs the same kernels on the
  // same inputs with the same dropout keys (Note [activation checkpointing]).
  for (const std::string name : {"gpt-tiny", "resnet"}) {
    for (const std::optional<DType> autocast :
         {std::optional<DType>(), std::optional(DType::bf16)}) {
      INFO(name << (autocast ? " bf16" : " f32"));
      const ModelPreset& preset = model_preset(name);
      const float dropout = preset.language_model ? 0.2f : 0.0f;  // resnet has none
      auto plain = make_model(name, ModelOptions{.dropout = dropout});
      auto checkpointed =
          make_model(name, ModelOptions{.dropout = dropout, .activation_checkpointing = true});
      initialize(*plain, 5);
      initialize(*checkpointed, 5);  // the same draws: the wrapper has no parameters
      require_same(train_once(*plain, preset, autocast),
                   train_once(*checkpointed, preset, autocast));
    }
  }
}

TEST_CASE("a Checkpointed around a whole mlp or cnn gives its gradients bit for bit",
          "[engine][checkpointed]") {
  for (const std::string name : {"mlp", "cnn"}) {
    INFO(name);
    const ModelPreset& preset = model_preset(name);
    auto plain = make_model(name);
    auto checkpointed = std::make_unique<Checkpointed>(make_model(name));
    checkpointed->assign_names();
    checkpointed->set_input_grad(false);
    initialize(*plain, 6);
    initialize(*checkpointed, 6);
    require_same(train_once(*plain, preset, std::nullopt),
                 train_once(*checkpointed, preset, std::nullopt));
  }
}

TEST_CASE("backward of a checkpointed block without a forward names the block",
          "[engine][checkpointed]") {
  auto model = make_model("gpt-tiny", ModelOptions{.activation_checkpointing = true});
  Module& block = *model->children()[3]->children()[0];  // transformer.h.0
  CHECK(block.type_name() == "Checkpointed");
  Context ctx;
  const core::Tensor dy = core::Tensor::zeros({1, 4, 128}, DType::f32, core::Device::cpu());
  CHECK_THROWS_WITH(block.backward(dy, ctx),
                    Catch::Contains("Checkpointed 'transformer.h.0'") &&
                        Catch::Contains("without a training-mode forward"));
}

TEST_CASE("presets without blocks refuse activation checkpointing, naming the ones that have them",
          "[engine][checkpointed]") {
  for (const std::string name : {"mlp", "cnn", "mlp-large"})
    CHECK_THROWS_WITH(make_model(name, ModelOptions{.activation_checkpointing = true}),
                      Catch::Contains("'" + name + "' has no blocks to checkpoint") &&
                          Catch::Contains("gpt-tiny, gpt2, resnet and resnet50"));
}

TEST_CASE("a checkpointed gpt-tiny keeps a fraction of the plain model's activations",
          "[engine][checkpointed]") {
  // Bytes a training forward leaves allocated (what it keeps for backward,
  // the logits included). Plain, each block keeps a dozen tensors of [B, T, C]
  // or more (attention's probabilities and weights are [B, H, T, T]);
  // checkpointed, one [B, T, C] input per block, and what is outside the
  // blocks (the logits, 0.26 MB here) is left. Measured 13.9 MB against
  // 1.09 MB; more than eightfold leaves room for a layer keeping a tensor
  // more or less, and fails when any block keeps its inside.
  const ModelPreset& preset = model_preset("gpt-tiny");
  auto kept_bytes = [&](bool checkpointing) {
    auto model = make_model(
        "gpt-tiny", ModelOptions{.dropout = 0.1f, .activation_checkpointing = checkpointing});
    initialize(*model, 5);
    model->train();
    const core::Tensor x = inputs(preset, 2, 128);
    Context ctx;
    const std::size_t before = core::memory_stats(core::Device::cpu()).current_bytes;
    const core::Tensor logits = model->forward(x, ctx);
    return core::memory_stats(core::Device::cpu()).current_bytes - before;
  };
  const std::size_t plain = kept_bytes(false), checkpointed = kept_bytes(true);
  INFO("plain " << plain << " bytes, checkpointed " << checkpointed);
  CHECK(checkpointed * 8 < plain);
}
