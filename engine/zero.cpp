// ZeRO-1's step checks (engine/zero.h).
#include "engine/zero.h"

#include <fmt/core.h>

#include <cmath>

#include "engine/optim/clip.h"
#include "kernels/error.h"

namespace lockstep::engine {

ShardedCheck check_sharded_gradients(core::Tensor& grads, const std::vector<comm::FlatRange>& owned,
                                     LossScaler& scaler, double max_grad_norm,
                                     comm::Communicator& host, const core::Stream& stream) {
  if (host.device().is_cuda())
    throw InvalidArgument(fmt::format(
        "check_sharded_gradients: `host` is a communicator of {}; pass the world's host one "
        "(comm::World::host()): the finding and the sum of squares are read on the host",
        host.device().str()));
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
