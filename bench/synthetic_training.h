// What bench_step and bench_scaling time: a model preset (seed 1), its
// ParameterStore and optimizer (SGD, lr 0.01, momentum 0.9; or AdamW, lr
// 0.01, torch's other defaults) on a device, and one batch of normal random
// inputs with labels cycling through the classes (language models: tokens
// [B, T] and targets [B, T] cycling through the vocabulary).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/random.h"
#include "engine/models.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"
#include "engine/zero3.h"
#include "kernels/error.h"

namespace lockstep::bench {

struct SyntheticOptions {
  bool activation_checkpointing = false;  // engine::make_model's (the same initial values)
  bool channels_last = false;             // engine::make_model's (resnet, resnet50)
  std::string optimizer = "sgd";          // or "adamw"
  // The store's layout for a ZeRO stage over `world_size` ranks, as
  // lockstep-train lays it out: stage 2 and up without the flat gradient
  // buffer (Note [transient gradients]), stage 3 in default units (Note
  // [parameter units]).
  int zero_stage = 0;
  int world_size = 1;
};

// The benchmarks' optimizer of `name` over `store` (a ZeRO-1 step shards one
// of its own).
inline std::unique_ptr<engine::Optimizer> make_optimizer(const std::string& name,
                                                         engine::ParameterStore& store,
                                                         const core::Stream& stream) {
  if (name == "sgd")
    return std::make_unique<engine::SGD>(store, engine::single_group(store, 0.01, 0.0),
                                         engine::SgdOptions{.momentum = 0.9}, stream);
  if (name == "adamw")
    return std::make_unique<engine::AdamW>(store, engine::single_group(store, 0.01, 0.0),
                                           engine::AdamwOptions{}, stream);
  throw InvalidArgument("optimizer '" + name + "' is not sgd or adamw");
}

struct SyntheticTraining {
  SyntheticTraining(const std::string& model_name, std::int64_t batch, core::Device device,
                    const SyntheticOptions& options = {})
      : stream(core::Stream::create(device)),
        model(engine::make_model(
            model_name,
            engine::ModelOptions{.activation_checkpointing = options.activation_checkpointing,
                                 .channels_last = options.channels_last})) {
    engine::initialize(*model, 1);
    store = std::make_unique<engine::ParameterStore>(
        *model, device, stream,
        options.zero_stage >= 2 ? engine::ParameterStore::Gradients::groups
                                : engine::ParameterStore::Gradients::flat,
        options.zero_stage == 3
            ? engine::ParameterUnits{engine::default_units(*model), options.world_size}
            : engine::ParameterUnits{});
    optimizer = make_optimizer(options.optimizer, *store, stream);
    const engine::ModelPreset& preset = engine::model_preset(model_name);
    if (preset.language_model) {
      const std::int64_t seq = preset.sample_shape[0];
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq));
      std::vector<std::int64_t> targets(tokens.size());
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 7919) % preset.classes);
        targets[i] = static_cast<std::int64_t>((i * 104729 + 1) % preset.classes);
      }
      x = core::Tensor::from_vector(tokens, {batch, seq}, DType::i32, device, stream);
      y = core::Tensor::from_vector(targets, {batch, seq}, DType::i64, device, stream);
      return;
    }
    core::Shape shape{batch};
    shape.insert(shape.end(), preset.sample_shape.begin(), preset.sample_shape.end());
    x = core::Tensor::empty(shape, DType::f32, device, stream);
    core::Generator(2).normal(x, 0.0f, 1.0f, stream);
    std::vector<std::int64_t> labels(static_cast<std::size_t>(batch));
    for (std::int64_t i = 0; i < batch; ++i) labels[i] = i % preset.classes;
    y = core::Tensor::from_vector(labels, {batch}, DType::i64, device, stream);
  }

  core::Stream stream;
  std::unique_ptr<engine::Module> model;
  std::unique_ptr<engine::ParameterStore> store;
  std::unique_ptr<engine::Optimizer> optimizer;
  core::Tensor x, y;
};

}  // namespace lockstep::bench
