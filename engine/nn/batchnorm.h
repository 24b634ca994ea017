// BatchNorm2d with PyTorch's arguments, names and semantics: parameters weight
// (1) and bias (0), buffers running_mean (0), running_var (1) and the i64
// scalar num_batches_tracked. Training normalises with the batch statistics
// (biased variance) and moves the running ones towards them (unbiased
// variance, momentum as PyTorch's); eval uses the running statistics and
// keeps nothing. Under autocast a 16-bit input is normalised with f32
// statistics: on the CPU it is cast to f32 and the output is f32; on CUDA the
// output keeps the input's type, as PyTorch AMP's (Note [batchnorm paths]).
// With activation relu the layer is BatchNorm2d followed by ReLU, fused on
// CUDA; its state_dict is BatchNorm2d's. DDP broadcasts the buffers from rank 0.
// In channels-last mode (Note [channels-last layers] in
// engine/nn/channels_last.h) it takes and gives [batch, H, W, channels].
#pragma once

#include <cstdint>

#include "engine/nn/module.h"
#include "kernels/batchnorm.h"

namespace lockstep::engine {

// What follows the normalisation inside a BatchNorm2d.
enum class BatchNormActivation { none, relu };

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(std::int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true,
                       BatchNormActivation activation = BatchNormActivation::none);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // The end of a residual block: relu(bn(x) + identity), the identity of x's
  // shape and type (Residual's fused path, Note [fused block end] in
  // engine/nn/containers.cpp). Needs activation none. Backward returns dx and
  // sets d_identity (the gradient the shortcut receives).
  core::Tensor forward_add_relu(const core::Tensor& x, const core::Tensor& identity, Context& ctx);
  core::Tensor backward_add_relu(const core::Tensor& dy, Context& ctx, core::Tensor& d_identity);
  // Read by the ONNX exporter (engine/export/).
  BatchNormActivation activation() const { return activation_; }
  double eps() const { return eps_; }
  std::int64_t num_features() const { return num_features_; }
  // Weight 1, bias 0 and fresh running statistics, as PyTorch's reset_parameters.
  void reset_parameters(core::Generator& rng) override;
  // Channels-last mode (Note [channels-last layers]): input and output are
  // [batch, H, W, channels]; parameters and buffers are unchanged.
  void set_channels_last(bool on) { channels_last_ = on; }
  bool channels_last() const { return channels_last_; }

  Parameter* weight() { return weight_; }  // null without affine
  Parameter* bias() { return bias_; }
  Buffer* running_mean() { return running_mean_; }  // null without track_running_stats
  Buffer* running_var() { return running_var_; }
  Buffer* num_batches_tracked() { return num_batches_tracked_; }

 private:
  // weight or bias, or (without affine) the constant `fill` on x's device.
  const core::Tensor& affine_or(Parameter* p, core::Tensor& constant, double fill,
                                const core::Tensor& x, const core::Stream& stream);
  void check_devices(const core::Tensor& x) const;
  // The kernels' shape of x in this layer's layout, after checking it.
  kernels::BatchNormShape shape_of(const core::Tensor& x) const;
  core::Tensor run_forward(const core::Tensor& x, const core::Tensor* identity, Context& ctx);
  core::Tensor run_backward(const core::Tensor& dy, Context& ctx, core::Tensor* d_identity);
  // The unfused paths' epilogue after their f32 normalisation: Residual's add
  // and the ReLU module, in their order and types (Note [batchnorm paths]).
  core::Tensor unfused_epilogue(core::Tensor y, const core::Tensor* identity, Context& ctx);

  std::int64_t num_features_;
  double eps_, momentum_;
  BatchNormActivation activation_;
  bool channels_last_ = false;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  Buffer* running_mean_ = nullptr;
  Buffer* running_var_ = nullptr;
  Buffer* num_batches_tracked_ = nullptr;
  core::Tensor ones_, zeros_;  // stand-ins for weight and bias without affine
  // Kept by a training-mode forward: the input (f32 unless fused), the batch
  // statistics, the output after a ReLU (its mask), how it ran.
  core::Tensor input_, save_mean_, save_rstd_, output_;
  DType input_dtype_ = DType::f32;
  kernels::BatchNormEpilogue epilogue_ = kernels::BatchNormEpilogue::none;
  bool fused_ = false;  // the fused kernels ran (Note [batchnorm paths])
};

}  // namespace lockstep::engine
