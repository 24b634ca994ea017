// ZeRO-1's step checks (engine/zero.h).
#include "engine/zero.h"

#include <cmath>

#include "engine/optim/clip.h"

namespace lockstep::engine {

ShardedCheck check_sharded_gradients(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                                     LossScaler& scaler, double max_grad_norm,
                                     comm::Communicator& host, const core::Stream& stream) {
  scaler.unscale(grads, owned, stream);
  const bool found = scaler.found_nonfinite(stream);
  const double squares = grad_sum_squares(grads, owned, stream);
  float global[2] = {found ? 1.0f : 0.0f, static_cast<float>(squares)};  // no allocation per step
  host.allreduce(global, 2, DType::f32, comm::ReduceOp::sum);
  ShardedCheck check;
  check.clean = scaler.update_with(global[0] > 0.0f);
  check.grad_norm = check.clean ? std::sqrt(static_cast<double>(global[1])) : NAN;
  if (check.clean && max_grad_norm > 0)
    clip_to_norm(grads, owned, check.grad_norm, max_grad_norm, stream);
  return check;
}

}  // namespace lockstep::engine
