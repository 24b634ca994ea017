// AdamW (decoupled weight decay, bias-corrected moments) exactly as
// torch.optim.AdamW documents it, without amsgrad, over the ParameterStore's
// flat buffers in one kernel launch per step (kernels/optimizer.h).
#pragma once

#include "engine/optim/optimizer.h"

namespace lockstep::engine {

struct AdamwOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Per element, with g the gradient, p the parameter, at step t (1-based):
//   p <- p (1 - lr weight_decay)
//   m <- beta1 m + (1 - beta1) g           v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// which is the documented p - lr m_hat / (sqrt(v_hat) + eps), arranged as
// PyTorch computes it. The scalars of t are computed in f64, the rest in f32.
class AdamW final : public Optimizer {
 public:
  AdamW(ParameterStore& store, std::vector<ParamGroup> groups, AdamwOptions options = {},
        const core::Stream& stream = {});
  const AdamwOptions& options() const { return options_; }

 private:
  void launch(const core::Stream& stream) override;

  AdamwOptions options_;  // state 0 is "exp_avg", 1 "exp_avg_sq"
};

}  // namespace lockstep::engine
