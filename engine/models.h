// Model presets used by the examples and benchmarks. Names and layouts are
// exactly as listed in docs/models.md, so that weights move to and from PyTorch
// by name (mlp: fc1.weight ...; resnet: torchvision's resnet18 names; resnet50:
// torchvision's resnet50 names; gpt-tiny and gpt2: nanoGPT's names).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/gpt.h"
#include "engine/nn/module.h"

namespace lockstep::engine {

struct ModelPreset {
  std::string name;
  core::Shape sample_shape;  // one input sample, e.g. {1, 28, 28}; {T} tokens for a language model
  std::int64_t classes;      // the vocabulary for a language model
  bool language_model = false;  // inputs are tokens and targets one per position
};

// The presets' names and input shapes: mlp, cnn, resnet, resnet50, mlp-large,
// gpt-tiny, gpt2.
const std::vector<ModelPreset>& model_presets();
const ModelPreset& model_preset(const std::string& name);  // throws, listing the names
// The GPT presets' sizes: gpt-tiny (L=4, H=4, C=128, T=128, V=256: bytes) and
// gpt2 (L=12, H=12, C=768, T=1024, V=50304: 50257 padded to a multiple of 128,
// as llm.c pads it). Throws for a name that is not a GPT preset.
GptConfig gpt_config(const std::string& name, float dropout = 0.0f);
// How make_model builds a preset; every field's default is the preset itself.
struct ModelOptions {
  // The GPT presets' dropout (nanoGPT's, 0 by default); the others have none.
  float dropout = 0.0f;
  // Makes each transformer block of the GPT presets and each stage
  // (layer1..layer4) of resnet and resnet50 a Checkpointed: the same names,
  // initial values and gradients (Note [activation checkpointing]); mlp, cnn
  // and mlp-large have no blocks to checkpoint and refuse it.
  bool activation_checkpointing = false;
  // Divides every inner width by that much (the hidden features of mlp and
  // mlp-large, the channels and fc1 of cnn, the channels of resnet and
  // resnet50, the embedding width of the GPT presets): the same tree, names,
  // depth and input and output shapes at a fraction of the parameters, for
  // tests that loop over every preset in seconds; 1 is the preset itself.
  // make_model throws InvalidArgument when it does not divide a width.
  std::int64_t width_divisor = 1;
  // resnet and resnet50 only (torchvision's option of that name): starts the
  // last BatchNorm weight of every residual block at 0 (Note [zero-init
  // residual] in models.cpp), also through engine::initialize.
  bool zero_init_residual = false;
  // The image presets' output classes (the last Linear's outputs); 0 keeps
  // the preset's (ModelPreset::classes). A GPT preset's vocabulary is fixed:
  // it accepts only 0 or its own.
  std::int64_t classes = 0;
  // resnet and resnet50 only: the model is a ChannelsLast (Note [channels-last
  // layers], engine/nn/channels_last.h): NCHW input and output, NHWC
  // activations inside; the same names, state_dict and checkpoints, and on
  // the CPU the same values bit for bit.
  bool channels_last = false;
};

// A new, uninitialised model (call engine::initialize with a seed).
std::unique_ptr<Module> make_model(const std::string& name, const ModelOptions& options = {});
// The positional form of release 0.1; dropout has no default here, so that
// make_model(name) is the form above.
[[deprecated("use make_model(name, ModelOptions{...})")]] std::unique_ptr<Module> make_model(
    const std::string& name, float dropout, bool activation_checkpointing = false,
    std::int64_t width_divisor = 1, bool zero_init_residual = false, std::int64_t classes = 0);

}  // namespace lockstep::engine
