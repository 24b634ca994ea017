// Parameter-free layers: ReLU, GELU (exact or tanh), Dropout and Flatten.
// Each keeps the dtype it is given, so under autocast they run in the low
// type between two GEMM layers, as PyTorch's autocast does.
#pragma once

#include <cstdint>

#include "engine/nn/module.h"
#include "kernels/activation.h"

namespace lockstep::engine {

// y = kind(x) on x's device, elementwise in x's dtype; y may be x itself (the
// ReLU that ends a BatchNorm or a residual block runs in place). The one
// dispatch of the activation family for layers.
void activation_forward(kernels::Activation kind, const core::Tensor& x, core::Tensor& y,
                        const core::Stream& stream);

// Shared by ReLU and GELU: y = act(x), dx = dy act'(x).
class Activation : public Module {
 public:
  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  kernels::Activation kind() const { return kind_; }

 protected:
  Activation(std::string type_name, kernels::Activation kind)
      : Module(std::move(type_name)), kind_(kind) {}

 private:
  kernels::Activation kind_;
  core::Tensor input_;
};

class ReLU : public Activation {
 public:
  ReLU() : Activation("ReLU", kernels::Activation::relu) {}
};

class GELU : public Activation {
 public:
  // approximate = true is PyTorch's GELU(approximate='tanh').
  explicit GELU(bool approximate = false)
      : Activation(approximate ? "GELU(tanh)" : "GELU",
                   approximate ? kernels::Activation::gelu_tanh : kernels::Activation::gelu_exact) {
  }
};

// Zeroes each element with probability p and scales the rest by 1 / (1 - p)
// in training; the identity in eval. Note [dropout keys]: the mask of global
// sample s is Philox stream (ctx.seed, hash(ctx.step, this layer's path)) at
// offset s * features, so a sample gets the same mask on any number of ranks
// and on CPU and CUDA alike.
class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f);
  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;

 private:
  float p_;
  core::Tensor mask_;  // u8, 1 keeps
};

// [N, d1, d2, ...] -> [N, d1 * d2 * ...]; a view, no copy.
class Flatten : public Module {
 public:
  Flatten() : Module("Flatten") {}
  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;

 private:
  core::Shape input_shape_;
};

}  // namespace lockstep::engine
