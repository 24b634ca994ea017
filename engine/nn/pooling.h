// Pooling layers with PyTorch's arguments and semantics: MaxPool2d,
// AvgPool2d (count_include_pad as PyTorch's default) and GlobalAvgPool2d
// (AdaptiveAvgPool2d(1): [N, C, H, W] -> [N, C, 1, 1]). They keep the dtype
// they are given, so under autocast they run in the low type between
// convolutions. Ties in max pooling: Note [max pool ties] in kernels/pooling.h
// (the first maximum in row-major window order gets the gradient).
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

 private:
  std::optional<PoolRecord> pending_;  // shape.kernel_* unused
};

}  // namespace lockstep::engine
