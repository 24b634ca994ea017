// BatchNorm2d with PyTorch's arguments, names and semantics: parameters weight
// (1) and bias (0), buffers running_mean (0), running_var (1) and the i64
// scalar num_batches_tracked. Training normalises with the batch statistics
// (biased variance) and moves the running ones towards them (unbiased
// variance, momentum as PyTorch's); eval uses the running statistics and
// keeps nothing. Normalisation stays in f32 under autocast: a 16-bit input is
// cast to f32 and the output is f32. DDP broadcasts the buffers from rank 0.
#pragma once

#include <cstdint>

#include "engine/nn/module.h"

namespace lockstep::engine {

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(std::int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  double eps() const { return eps_; }
  std::int64_t num_features() const { return num_features_; }
  // Weight 1, bias 0 and fresh running statistics, as PyTorch's reset_parameters.
  void reset_parameters(core::Generator& rng) override;

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

  std::int64_t num_features_;
  double eps_, momentum_;
  Parameter* weight_ = nullptr;
  Parameter* bias_ = nullptr;
  Buffer* running_mean_ = nullptr;
  Buffer* running_var_ = nullptr;
  Buffer* num_batches_tracked_ = nullptr;
  core::Tensor ones_, zeros_;  // stand-ins for weight and bias without affine
  // Kept by a training-mode forward: the f32 input and the batch statistics.
  core::Tensor input_, save_mean_, save_rstd_;
  DType input_dtype_ = DType::f32;
};

}  // namespace lockstep::engine
