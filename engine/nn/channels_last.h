// ChannelsLast: runs an image model's spatial layers on channels-last (NHWC)
// activations while the model's input, output, parameters, buffers, names,
// state_dict and checkpoints stay as in NCHW (PyTorch's layouts). A
// transparent wrapper, as Checkpointed is: the inner module's children and
// parameters appear at this module's level, so conv1.weight stays itself.
//
// Note [channels-last layers]: core::Tensor has no layout tag, so the shape
// says the layout: between spatial layers a channels-last activation is a
// contiguous [batch, H, W, channels] tensor. The layout is a run-time setting
// of the layers (set_channels_last on Conv2d, BatchNorm2d, MaxPool2d,
// AvgPool2d and GlobalAvgPool2d), never saved; a layer refuses an input whose
// shape does not fit its layout, naming the layout it expected. Conv2d's
// weight and weight gradient keep [out, in/groups, kh, kw]; BatchNorm2d takes
// NHWC as BatchNormShape{N * H * W, C, 1}; GlobalAvgPool2d gives [batch,
// channels, 1, 1] in both modes (the same bytes as [batch, 1, 1, channels]),
// so what follows it (Flatten, Linear) runs unchanged. Residual's add and
// ReLUs are elementwise. On the CPU every op in NHWC gives the bits it gives
// in NCHW, transposed (the convolutions transpose around the NCHW path, the
// statistics sum in the same order), so a channels-last model trains to the
// NCHW model's values bit for bit; on CUDA cuDNN and the NHWC kernels choose
// other algorithms and summation orders (tests/engine/gpu/ states the
// tolerances).
#pragma once

#include <memory>

#include "engine/nn/module.h"

namespace lockstep::engine {

class ChannelsLast : public Module {
 public:
  // Sets every spatial layer inside to channels-last. Throws InvalidArgument
  // for a layer before the first GlobalAvgPool2d (in forward order) that
  // does not know the layout: anything but the spatial layers, pointwise
  // activations and the containers (Sequential, Residual, Checkpointed).
  // After a GlobalAvgPool2d any layer may follow.
  explicit ChannelsLast(std::unique_ptr<Module> inner);

  // x: an NCHW batch [batch, channels, H, W], transposed to NHWC on entry.
  // The output is the inner module's, transposed back to NCHW when it is
  // still an image (a model without a GlobalAvgPool2d).
  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  // dy as forward's output; dx (when input_grad()) NCHW as x.
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  void set_input_grad(bool on) override;
  // Read by the ONNX exporter (engine/export/), which exports the inner
  // module as NCHW: the layers' layout is not part of what they compute.
  Module& inner() { return *inner_; }

 private:
  Module* inner_;
  bool image_output_ = true;  // no GlobalAvgPool2d: a 4-D output is NHWC
  bool output_transposed_ = false;
};

}  // namespace lockstep::engine
