// Model presets (engine/models.h). Child names are the PyTorch names, so a
// state_dict maps onto parameters one to one (docs/models.md).
#include "engine/models.h"

#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/linear.h"
#include "engine/nn/pooling.h"

namespace lockstep::engine {
namespace {

std::unique_ptr<Module> mlp() {
  auto net = std::make_unique<Sequential>();
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc1", 784, 512);
  net->emplace<ReLU>("relu1");
  net->emplace<Linear>("fc2", 512, 512);
  net->emplace<ReLU>("relu2");
  net->emplace<Linear>("fc3", 512, 10);
  return net;
}

std::unique_ptr<Module> cnn() {
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv1", 1, 32, 3, 1, 1);
  net->emplace<ReLU>("relu1");
  net->emplace<MaxPool2d>("pool1", 2);
  net->emplace<Conv2d>("conv2", 32, 64, 3, 1, 1);
  net->emplace<ReLU>("relu2");
  net->emplace<MaxPool2d>("pool2", 2);
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc1", 3136, 128);
  net->emplace<ReLU>("relu3");
  net->emplace<Linear>("fc2", 128, 10);
  return net;
}

// torchvision's BasicBlock: conv3x3-bn-relu-conv3x3-bn, plus the shortcut
// (a 1x1 conv and bn, "downsample", when the shape changes), then relu.
std::unique_ptr<Module> basic_block(std::int64_t in, std::int64_t out, std::int64_t stride) {
  auto inner = std::make_unique<Sequential>();
  inner->emplace<Conv2d>("conv1", in, out, 3, stride, 1, 1, 1, false);
  inner->emplace<BatchNorm2d>("bn1", out);
  inner->emplace<ReLU>("relu");
  inner->emplace<Conv2d>("conv2", out, out, 3, 1, 1, 1, 1, false);
  inner->emplace<BatchNorm2d>("bn2", out);
  std::unique_ptr<Sequential> downsample;
  if (stride != 1 || in != out) {
    downsample = std::make_unique<Sequential>();
    downsample->emplace<Conv2d>("0", in, out, 1, stride, 0, 1, 1, false);
    downsample->emplace<BatchNorm2d>("1", out);
  }
  return std::make_unique<Residual>(std::move(inner), std::move(downsample), "downsample", true);
}

// resnet18 with the CIFAR stem (3x3 conv1, stride 1, no max-pool), 10 classes.
std::unique_ptr<Module> resnet(bool activation_checkpointing) {
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv1", 3, 64, 3, 1, 1, 1, 1, false);
  net->emplace<BatchNorm2d>("bn1", 64);
  net->emplace<ReLU>("relu");
  std::int64_t channels = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t out = 64 << stage;
    auto layer = std::make_unique<Sequential>();
    layer->add("0", basic_block(channels, out, stage == 0 ? 1 : 2));
    layer->add("1", basic_block(out, out, 1));
    net->add("layer" + std::to_string(stage + 1),
             activation_checkpointing ? std::make_unique<Checkpointed>(std::move(layer))
                                      : std::unique_ptr<Module>(std::move(layer)));
    channels = out;
  }
  net->emplace<GlobalAvgPool2d>("avgpool");
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc", 512, 10);
  return net;
}

std::unique_ptr<Module> mlp_large() {
  auto net = std::make_unique<Sequential>();
  for (int i = 1; i <= 3; ++i) {
    net->emplace<Linear>("fc" + std::to_string(i), 4096, 4096);
    net->emplace<GELU>("gelu" + std::to_string(i), true);
  }
  net->emplace<Linear>("fc4", 4096, 1000);
  return net;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"mlp", {1, 28, 28}, 10},    {"cnn", {1, 28, 28}, 10},       {"resnet", {3, 32, 32}, 10},
      {"mlp-large", {4096}, 1000}, {"gpt-tiny", {128}, 256, true}, {"gpt2", {1024}, 50304, true},
  };
  return presets;
}

const ModelPreset& model_preset(const std::string& name) {
  std::string known;
  for (const ModelPreset& p : model_presets()) {
    if (p.name == name) return p;
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw InvalidArgument("unknown model '" + name + "' (choose one of " + known + ")");
}

GptConfig gpt_config(const std::string& name, float dropout) {
  if (name == "gpt-tiny") return {4, 4, 128, 128, 256, dropout, false};
  if (name == "gpt2") return {12, 12, 768, 1024, 50304, dropout, false};
  throw InvalidArgument("'" + name + "' is not a GPT preset (choose gpt-tiny or gpt2)");
}

std::unique_ptr<Module> make_model(const std::string& name, float dropout,
                                   bool activation_checkpointing) {
  const ModelPreset& preset = model_preset(name);  // validates the name
  if (dropout != 0.0f && !preset.language_model)
    throw InvalidArgument("model '" + name + "' has no dropout to set (only gpt-tiny and gpt2 do)");
  if (activation_checkpointing && !preset.language_model && name != "resnet")
    throw InvalidArgument("model '" + name +
                          "' has no blocks to checkpoint (gpt-tiny, gpt2 and resnet do; its "
                          "activations are few: train it without activation checkpointing)");
  std::unique_ptr<Module> model;
  if (preset.language_model) {
    GptConfig config = gpt_config(name, dropout);
    config.activation_checkpointing = activation_checkpointing;
    model = std::make_unique<GPT>(config);
  } else if (name == "mlp")
    model = mlp();
  else if (name == "cnn")
    model = cnn();
  else if (name == "resnet")
    model = resnet(activation_checkpointing);
  else
    model = mlp_large();
  model->assign_names();
  model->set_input_grad(false);  // the input is data
  return model;
}

}  // namespace lockstep::engine
