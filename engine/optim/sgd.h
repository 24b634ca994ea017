// SGD with momentum, dampening, Nesterov momentum and (coupled) weight decay,
// exactly as torch.optim.SGD documents it, over the ParameterStore's flat
// buffers in one kernel launch per step (kernels/optimizer.h).
#pragma once

#include "engine/optim/optimizer.h"

namespace lockstep::engine {

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0, as in PyTorch
};

// Per element, with g the gradient, p the parameter, at step t (1-based):
//   g <- g + weight_decay p                    (when weight_decay != 0)
//   b <- g on step 1, else momentum b + (1 - dampening) g   (when momentum != 0)
//   g <- g + momentum b if nesterov, else b                 (when momentum != 0)
//   p <- p - lr g
// The gradient buffer itself is left unchanged.
class SGD final : public Optimizer {
 public:
  SGD(ParameterStore& store, std::vector<ParamGroup> groups, SgdOptions options = {},
      const core::Stream& stream = {});
  const SgdOptions& options() const { return options_; }

 private:
  void launch(const core::Stream& stream) override;

  SgdOptions options_;  // with momentum, state 0 is "momentum_buffer"
};

}  // namespace lockstep::engine
