// Model presets used by the examples and benchmarks. Names and layouts are
// exactly as listed in docs/models.md, so that weights move to and from PyTorch
// by name (mlp: fc1.weight ...; resnet: torchvision's resnet18 names).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"

namespace lockstep::engine {

struct ModelPreset {
  std::string name;
  core::Shape sample_shape;  // one input sample, e.g. {1, 28, 28}
  std::int64_t classes;
};

// The presets' names and input shapes: mlp, cnn, resnet, mlp-large.
const std::vector<ModelPreset>& model_presets();
const ModelPreset& model_preset(const std::string& name);  // throws, listing the names
// A new, uninitialised model (call engine::initialize with a seed).
std::unique_ptr<Module> make_model(const std::string& name);

}  // namespace lockstep::engine
