// What bench_step and bench_scaling time: a model preset (seed 1), its
// ParameterStore and SGD (lr 0.01, momentum 0.9) on a device, and one batch
// of normal random inputs with labels cycling through the classes (language
// models: tokens [B, T] and targets [B, T] cycling through the vocabulary).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/random.h"
#include "engine/models.h"
#include "engine/optim/sgd.h"
#include "engine/parameter_store.h"

namespace lockstep::bench {

struct SyntheticTraining {
  // `activation_checkpointing`: engine::make_model's (the same initial values).
  SyntheticTraining(const std::string& model_name, std::int64_t batch, core::Device device,
                    bool activation_checkpointing = false)
      : stream(core::Stream::create(device)),
        model(engine::make_model(model_name, 0.0f, activation_checkpointing)) {
    engine::initialize(*model, 1);
    store = std::make_unique<engine::ParameterStore>(*model, device, stream);
    sgd = std::make_unique<engine::SGD>(*store, engine::single_group(*store, 0.01, 0.0),
                                        engine::SgdOptions{.momentum = 0.9}, stream);
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
  std::unique_ptr<engine::SGD> sgd;
  core::Tensor x, y;
};

}  // namespace lockstep::bench
