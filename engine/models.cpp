// Model presets (engine/models.h). Child names are the PyTorch names, so a
// state_dict maps onto parameters one to one (docs/models.md): resnet and
// resnet50 are torchvision's BasicBlock and Bottleneck trees.
#include "engine/models.h"

#include <fmt/core.h>

#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/channels_last.h"
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

std::unique_ptr<Module> mlp(std::int64_t classes, const Narrower& narrow) {
  const std::int64_t hidden = narrow(512, "hidden features");
  auto net = std::make_unique<Sequential>();
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc1", 784, hidden);
  net->emplace<ReLU>("relu1");
  net->emplace<Linear>("fc2", hidden, hidden);
  net->emplace<ReLU>("relu2");
  net->emplace<Linear>("fc3", hidden, classes);
  return net;
}

std::unique_ptr<Module> cnn(std::int64_t classes, const Narrower& narrow) {
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
  net->emplace<Linear>("fc2", hidden, classes);
  return net;
}

// BatchNorm2d whose weight (the scale) starts at 0 rather than 1: the last
// BatchNorm of a residual block under torchvision's zero_init_residual, so
// that each block starts as its shortcut (Note [zero-init residual]). Its
// type name, parameters and buffers are BatchNorm2d's.
class ZeroScaleBatchNorm2d final : public BatchNorm2d {
 public:
  explicit ZeroScaleBatchNorm2d(std::int64_t num_features) : BatchNorm2d(num_features) {
    initialize_when_built();  // BatchNorm2d's constructor ran its own reset, not this one
  }
  void reset_parameters(core::Generator& rng) override {
    BatchNorm2d::reset_parameters(rng);
    weight()->value.fill_(0.0);
  }
};

// Note [zero-init residual]: make_model's zero_init_residual starts the last
// BatchNorm weight of every residual block (bn2 of a BasicBlock, bn3 of a
// Bottleneck) at 0, as torchvision's resnet(zero_init_residual=True) and the
// large-batch recipes (Goyal et al. 2017) do: each block then starts as its
// shortcut. The layer keeps its value through engine::initialize, which
// calls reset_parameters.
BatchNorm2d& last_batchnorm(Sequential& inner, const std::string& name, std::int64_t channels,
                            bool zero_init_residual) {
  if (zero_init_residual) return inner.emplace<ZeroScaleBatchNorm2d>(name, channels);
  return inner.emplace<BatchNorm2d>(name, channels);
}

// BatchNorm2d then ReLU as one layer (fused on CUDA, Note [batchnorm paths] in
// engine/nn/batchnorm.cpp): torchvision's bn and relu, the same state_dict.
void batchnorm_relu(Sequential& seq, const std::string& name, std::int64_t channels) {
  seq.emplace<BatchNorm2d>(name, channels, 1e-5, 0.1, true, true, BatchNormActivation::relu);
}

// The shortcut of a block whose shape changes: torchvision's "downsample", a
// 1x1 conv with the block's stride and a BatchNorm. Null (identity) otherwise.
std::unique_ptr<Sequential> downsample(std::int64_t in, std::int64_t out, std::int64_t stride) {
  if (stride == 1 && in == out) return nullptr;
  auto shortcut = std::make_unique<Sequential>();
  shortcut->emplace<Conv2d>("0", in, out, 1, stride, 0, 1, 1, false);
  shortcut->emplace<BatchNorm2d>("1", out);
  return shortcut;
}

// torchvision's BasicBlock: conv3x3-bn-relu-conv3x3-bn, plus the shortcut
// (a 1x1 conv and bn, "downsample", when the shape changes), then relu. bn1
// carries its relu; on CUDA bn2, the add and the relu run as one (Note
// [fused block end] in engine/nn/containers.cpp).
std::unique_ptr<Module> basic_block(std::int64_t in, std::int64_t out, std::int64_t stride,
                                    bool zero_init_residual) {
  auto inner = std::make_unique<Sequential>();
  inner->emplace<Conv2d>("conv1", in, out, 3, stride, 1, 1, 1, false);
  batchnorm_relu(*inner, "bn1", out);
  inner->emplace<Conv2d>("conv2", out, out, 3, 1, 1, 1, 1, false);
  last_batchnorm(*inner, "bn2", out, zero_init_residual);
  return std::make_unique<Residual>(std::move(inner), downsample(in, out, stride), "downsample",
                                    true);
}

// torchvision's Bottleneck as of v1.5 (the stride on the 3x3 conv, not the
// first 1x1): conv1x1-bn-relu-conv3x3(stride)-bn-relu-conv1x1 to 4x width-bn,
// plus the shortcut when the shape changes, then relu. bn1 and bn2 carry their
// relus; on CUDA bn3, the add and the relu run as one (Note [fused block end]).
std::unique_ptr<Module> bottleneck(std::int64_t in, std::int64_t width, std::int64_t stride,
                                   bool zero_init_residual) {
  const std::int64_t out = 4 * width;
  auto inner = std::make_unique<Sequential>();
  inner->emplace<Conv2d>("conv1", in, width, 1, 1, 0, 1, 1, false);
  batchnorm_relu(*inner, "bn1", width);
  inner->emplace<Conv2d>("conv2", width, width, 3, stride, 1, 1, 1, false);
  batchnorm_relu(*inner, "bn2", width);
  inner->emplace<Conv2d>("conv3", width, out, 1, 1, 0, 1, 1, false);
  last_batchnorm(*inner, "bn3", out, zero_init_residual);
  return std::make_unique<Residual>(std::move(inner), downsample(in, out, stride), "downsample",
                                    true);
}

// A stage (layer1..layer4), wrapped in a Checkpointed when asked: the same
// names, one recompute per stage in backward.
std::unique_ptr<Module> stage(std::unique_ptr<Sequential> layer, bool activation_checkpointing) {
  if (activation_checkpointing) return std::make_unique<Checkpointed>(std::move(layer));
  return layer;
}

// resnet18 with the CIFAR stem (3x3 conv1, stride 1, no max-pool), 10 classes.
std::unique_ptr<Module> resnet(bool activation_checkpointing, bool zero_init_residual,
                               std::int64_t classes, const Narrower& narrow) {
  const std::int64_t stem = narrow(64, "stem channels");
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv1", 3, stem, 3, 1, 1, 1, 1, false);
  batchnorm_relu(*net, "bn1", stem);
  std::int64_t channels = stem;
  for (int s = 0; s < 4; ++s) {
    const std::int64_t out = stem << s;
    auto layer = std::make_unique<Sequential>();
    layer->add("0", basic_block(channels, out, s == 0 ? 1 : 2, zero_init_residual));
    layer->add("1", basic_block(out, out, 1, zero_init_residual));
    net->add("layer" + std::to_string(s + 1), stage(std::move(layer), activation_checkpointing));
    channels = out;
  }
  net->emplace<GlobalAvgPool2d>("avgpool");
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc", channels, classes);
  return net;
}

// torchvision's resnet50 (v1.5): the ImageNet stem (7x7 conv1, stride 2, and
// a 3x3 stride-2 max-pool), Bottleneck stages of 3, 4, 6 and 3 blocks of
// widths 64 to 512 (outputs 4x that), 1000 classes.
std::unique_ptr<Module> resnet50(bool activation_checkpointing, bool zero_init_residual,
                                 std::int64_t classes, const Narrower& narrow) {
  const std::int64_t stem = narrow(64, "stem channels");
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv1", 3, stem, 7, 2, 3, 1, 1, false);
  batchnorm_relu(*net, "bn1", stem);
  net->emplace<MaxPool2d>("maxpool", 3, 2, 1);
  const int blocks[] = {3, 4, 6, 3};
  std::int64_t channels = stem;
  for (int s = 0; s < 4; ++s) {
    const std::int64_t width = stem << s;
    auto layer = std::make_unique<Sequential>();
    for (int b = 0; b < blocks[s]; ++b)
      layer->add(std::to_string(b), bottleneck(b == 0 ? channels : 4 * width, width,
                                               s > 0 && b == 0 ? 2 : 1, zero_init_residual));
    net->add("layer" + std::to_string(s + 1), stage(std::move(layer), activation_checkpointing));
    channels = 4 * width;
  }
  net->emplace<GlobalAvgPool2d>("avgpool");
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc", channels, classes);
  return net;
}

std::unique_ptr<Module> mlp_large(std::int64_t classes, const Narrower& narrow) {
  const std::int64_t hidden = narrow(4096, "hidden features");
  auto net = std::make_unique<Sequential>();
  for (int i = 1; i <= 3; ++i) {
    net->emplace<Linear>("fc" + std::to_string(i), i == 1 ? 4096 : hidden, hidden);
    net->emplace<GELU>("gelu" + std::to_string(i), true);
  }
  net->emplace<Linear>("fc4", hidden, classes);
  return net;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      {"mlp", {1, 28, 28}, 10},      {"cnn", {1, 28, 28}, 10},
      {"resnet", {3, 32, 32}, 10},   {"resnet50", {3, 224, 224}, 1000},
      {"mlp-large", {4096}, 1000},   {"gpt-tiny", {128}, 256, true},
      {"gpt2", {1024}, 50304, true},
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
                                   bool activation_checkpointing, std::int64_t width_divisor,
                                   bool zero_init_residual, std::int64_t classes) {
  return make_model(name, ModelOptions{.dropout = dropout,
                                       .activation_checkpointing = activation_checkpointing,
                                       .width_divisor = width_divisor,
                                       .zero_init_residual = zero_init_residual,
                                       .classes = classes});
}

std::unique_ptr<Module> make_model(const std::string& name, const ModelOptions& options) {
  const float dropout = options.dropout;
  const bool activation_checkpointing = options.activation_checkpointing;
  const std::int64_t width_divisor = options.width_divisor;
  const bool zero_init_residual = options.zero_init_residual;
  std::int64_t classes = options.classes;
  const ModelPreset& preset = model_preset(name);  // validates the name
  const Narrower narrow(name, width_divisor);
  if (dropout != 0.0f && !preset.language_model)
    throw InvalidArgument("model '" + name + "' has no dropout to set (only gpt-tiny and gpt2 do)");
  const bool is_resnet = name == "resnet" || name == "resnet50";
  if (activation_checkpointing && !preset.language_model && !is_resnet)
    throw InvalidArgument("model '" + name +
                          "' has no blocks to checkpoint (gpt-tiny, gpt2, resnet and resnet50 do; "
                          "its activations are few: train it without activation checkpointing)");
  if (zero_init_residual && !is_resnet)
    throw InvalidArgument("model '" + name +
                          "' has no residual blocks to zero-initialise (resnet and resnet50 do: "
                          "build it without zero_init_residual)");
  if (options.channels_last && !is_resnet)
    throw InvalidArgument("model '" + name +
                          "' has no channels-last form (resnet and resnet50 do: build it without "
                          "channels_last, lockstep-train without --channels-last)");
  if (classes < 0 || (preset.language_model && classes != 0 && classes != preset.classes))
    throw InvalidArgument(fmt::format(
        "make_model('{}'): classes is {}; pass 0 for the preset's {}{}", name, classes,
        preset.classes,
        preset.language_model ? " (a GPT preset's vocabulary is fixed)" : ", or a positive count"));
  if (classes == 0) classes = preset.classes;
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
    model = mlp(classes, narrow);
  else if (name == "cnn")
    model = cnn(classes, narrow);
  else if (name == "resnet")
    model = resnet(activation_checkpointing, zero_init_residual, classes, narrow);
  else if (name == "resnet50")
    model = resnet50(activation_checkpointing, zero_init_residual, classes, narrow);
  else
    model = mlp_large(classes, narrow);
  if (options.channels_last) model = std::make_unique<ChannelsLast>(std::move(model));
  model->assign_names();
  model->set_input_grad(false);  // the input is data
  return model;
}

}  // namespace lockstep::engine
