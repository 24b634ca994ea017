// ZeRO-1's step checks (engine/zero.h).
#include "engine/zero.h"

#include <cmath>

#include "engine/optim/clip.h"

namespace lockstep::engine {

ShardPayload measure_shard(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                           LossScaler& scaler, const core::Stream& stream) {
  scaler.unscale(grads, owned, stream);
  const bool found = scaler.found_nonfinite(stream);
  return {found ? 1.0 : 0.0, grad_sum_squares(grads, owned, stream)};
}

ShardedCheck decide_sharded(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                            LossScaler& scaler, double max_grad_norm, const ShardPayload& global,
                            const core::Stream& stream) {
  ShardedCheck check;
  check.clean = scaler.update_with(global[0] > 0.0);
  check.grad_norm = check.clean ? std::sqrt(global[1]) : NAN;
  if (check.clean && max_grad_norm > 0)
    clip_to_norm(grads, owned, check.grad_norm, max_grad_norm, stream);
  return check;
}

}  // namespace lockstep::engine
