// Conv2d: 2-D convolution over NCHW inputs (or NHWC ones in channels-last
// mode, Note [channels-last layers] in engine/nn/channels_last.h) with
// PyTorch's arguments, layout (weight [out, in/groups, kh, kw] in either
// mode) and initialisation. Under autocast it
// computes in f16/bf16 with f32 accumulation on a low-precision copy of the
// weight made once per weight version, as Linear does; the weight gradient
// ends in the f32 gradient (CUDA: cast-added from cuDNN's 16-bit result, Note
// [16-bit weight gradient] in kernels/cuda/conv.cu).
// Also Size2, the (h, w) pair the spatial layers take.
#pragma once

#include <cstdint>

#include "engine/nn/module.h"
#include "kernels/conv.h"

namespace lockstep::engine {

// A 2-D size; one integer means the same in both directions, as in PyTorch.
struct Size2 {
  std::int64_t h, w;
  Size2(std::int64_t both) : h(both), w(both) {}  // implicit: Conv2d(1, 32, 3)
  Size2(std::int64_t height, std::int64_t width) : h(height), w(width) {}
};

class Conv2d : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, Size2 stride = 1,
         Size2 padding = 0, Size2 dilation = 1, std::int64_t groups = 1, bool bias = true);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  const kernels::Conv2dShape& config() const { return config_; }
  void reset_parameters(core::Generator& rng) override;
  // Channels-last mode (Note [channels-last layers]): input and output are
  // [batch, H, W, channels]; the weight and its gradient keep their layout.
  void set_channels_last(bool on) { config_.channels_last = on; }
  bool channels_last() const { return config_.channels_last; }

  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }

 private:
  kernels::Conv2dShape shape_for(const core::Tensor& x) const;
  core::Shape output_shape(const kernels::Conv2dShape& s) const;

  kernels::Conv2dShape config_;  // everything but the input's batch and size
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  core::Tensor input_;  // in the compute type, kept for backward (training only)
  DType input_dtype_ = DType::f32;
  AutocastWeight low_weight_;  // Note [autocast weight copy]
};

}  // namespace lockstep::engine
