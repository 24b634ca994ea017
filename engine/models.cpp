// Model presets (engine/models.h). Child names are the PyTorch names, so a
// state_dict maps onto parameters one to one (docs/models.md).
#include "engine/models.h"

#include <fmt/core.h>

#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/checkpointed.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/linear.h"
#include "engine/nn/pooling.h"

namespace lockstep::engine {
namespace {

// An inner width of preset `name` divided by make_model's width_divisor.
class Narrower {
 public:
  Narrower(const std::string& name, std::int64_t divisor) : name_(name), divisor_(divisor) {
    if (divisor < 1)
      throw InvalidArgument(fmt::format(
          "make_model('{}'): width_divisor is {}; it must be at least 1 (1: the preset itself)",
          name, divisor));
  }
  std::int64_t operator()(std::int64_t width, const char* what) const {
    if (width % divisor_ != 0)
      throw InvalidArgument(fmt::format(
          "make_model('{}'): width_divisor {} does not divide its {} of {} (use a power of two "
          "that does)",
          name_, divisor_, what, width));
    return width / divisor_;
  }

 private:
  const std::string& name_;
  std::int64_t divisor_;
};

std::unique_ptr<Module> mlp(const Narrower& narrow) {
  const std::int64_t hidden = narrow(512, "hidden features");
  auto net = std::make_unique<Sequential>();
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc1", 784, hidden);
  net->emplace<ReLU>("relu1");
  net->emplace<Linear>("fc2", hidden, hidden);
  net->emplace<ReLU>("relu2");
  net->emplace<Linear>("fc3", hidden, 10);
  return net;
}

std::unique_ptr<Module> cnn(const Narrower& narrow) {
  const std::int64_t c1 = narrow(32, "conv1 channels"), c2 = narrow(64, "conv2 channels");
  const std::int64_t hidden = narrow(128, "fc1 features");
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv1", 1, c1, 3, 1, 1);
  net->emplace<ReLU>("relu1");
  net->emplace<MaxPool2d>("pool1", 2);
  net->emplace<Conv2d>("conv2", c1, c2, 3, 1, 1);
  net->emplace<ReLU>("relu2");
  net->emplace<MaxPool2d>("pool2", 2);
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc1", c2 * 7 * 7, hidden);  // 28 x 28 pooled twice
  net->emplace<ReLU>("relu3");
  net->emplace<Linear>("fc2", hidden, 10);
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
std::unique_ptr<Module> resnet(bool activation_checkpointing, const Narrower& narrow) {
  const std::int64_t stem = narrow(64, "stem channels");
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv1", 3, stem, 3, 1, 1, 1, 1, false);
  net->emplace<BatchNorm2d>("bn1", stem);
  net->emplace<ReLU>("relu");
  std::int64_t channels = stem;
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t out = stem << stage;
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
  net->emplace<Linear>("fc", channels, 10);
  return net;
}

std::unique_ptr<Module> mlp_large(const Narrower& narrow) {
  const std::int64_t hidden = narrow(4096, "hidden features");
  auto net = std::make_unique<Sequential>();
  for (int i = 1; i <= 3; ++i) {
    net->emplace<Linear>("fc" + std::to_string(i), i == 1 ? 4096 : hidden, hidden);
    net->emplace<GELU>("gelu" + std::to_string(i), true);
  }
  net->emplace<Linear>("fc4", hidden, 1000);
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
                                   bool activation_checkpointing, std::int64_t width_divisor) {
  const ModelPreset& preset = model_preset(name);  // validates the name
  const Narrower narrow(name, width_divisor);
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
    config.embed_dim = narrow(config.embed_dim, "embedding width");
    if (config.embed_dim % config.heads != 0)
      throw InvalidArgument(fmt::format(
          "make_model('{}'): width_divisor {} leaves an embedding width of {}, which its {} heads "
          "do not divide (use a smaller divisor)",
          name, width_divisor, config.embed_dim, config.heads));
    model = std::make_unique<GPT>(config);
  } else if (name == "mlp")
    model = mlp(narrow);
  else if (name == "cnn")
    model = cnn(narrow);
  else if (name == "resnet")
    model = resnet(activation_checkpointing, narrow);
  else
    model = mlp_large(narrow);
  model->assign_names();
  model->set_input_grad(false);  // the input is data
  return model;
}

}  // namespace lockstep::engine
