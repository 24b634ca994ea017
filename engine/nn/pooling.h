// Pooling layers with PyTorch's arguments and semantics: MaxPool2d,
// AvgPool2d (count_include_pad as PyTorch's default) and GlobalAvgPool2d
// (AdaptiveAvgPool2d(1): [N, C, H, W] -> [N, C, 1, 1]). They keep the dtype
// they are given, so under autocast they run in the low type between
// convolutions. Ties in max pooling: Note [max pool ties] in kernels/pooling.h
// (the first maximum in row-major window order gets the gradient). In
// channels-last mode (Note [channels-last layers] in engine/nn/channels_last.h)
// they take [batch, H, W, channels]; MaxPool2d and AvgPool2d give the same
// layout, GlobalAvgPool2d gives [batch, channels, 1, 1] in both (the same
// bytes as [batch, 1, 1, channels], so Flatten and a Linear need nothing).
#pragma once

#include <cstdint>
#include <optional>

#include "engine/nn/conv.h"
#include "engine/nn/module.h"
#include "kernels/pooling.h"

namespace lockstep::engine {

// What a training-mode forward keeps for backward: sizes, not activations.
struct PoolRecord {
  kernels::Pool2dShape shape;  // with the input's batch, channels and size
  DType dtype;
  core::Device device;
};

class MaxPool2d : public Module {
 public:
  // stride defaults to the kernel size, as in PyTorch.
  explicit MaxPool2d(Size2 kernel_size) : MaxPool2d(kernel_size, kernel_size) {}
  MaxPool2d(Size2 kernel_size, Size2 stride, Size2 padding = 0);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  const kernels::Pool2dShape& config() const { return config_; }
  // Channels-last mode (Note [channels-last layers]): [batch, H, W, channels].
  void set_channels_last(bool on) { config_.channels_last = on; }
  bool channels_last() const { return config_.channels_last; }

 private:
  kernels::Pool2dShape config_;
  std::optional<PoolRecord> pending_;
  core::Tensor argmax_;  // the input element each output took (training only)
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Size2 kernel_size) : AvgPool2d(kernel_size, kernel_size) {}
  AvgPool2d(Size2 kernel_size, Size2 stride, Size2 padding = 0, bool count_include_pad = true);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  const kernels::Pool2dShape& config() const { return config_; }
  bool count_include_pad() const { return count_include_pad_; }
  // Channels-last mode (Note [channels-last layers]): [batch, H, W, channels].
  void set_channels_last(bool on) { config_.channels_last = on; }
  bool channels_last() const { return config_.channels_last; }

 private:
  kernels::Pool2dShape config_;
  bool count_include_pad_;
  std::optional<PoolRecord> pending_;
};

class GlobalAvgPool2d : public Module {
 public:
  GlobalAvgPool2d() : Module("GlobalAvgPool2d") {}

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Channels-last mode (Note [channels-last layers]): takes [batch, H, W,
  // channels], still gives [batch, channels, 1, 1].
  void set_channels_last(bool on) { channels_last_ = on; }
  bool channels_last() const { return channels_last_; }

 private:
  bool channels_last_ = false;
  std::optional<PoolRecord> pending_;  // shape.kernel_* unused
};

}  // namespace lockstep::engine
