// Gradient norm and clipping (engine/optim/clip.h).
#include "engine/optim/clip.h"

#include <cmath>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/ops.h"
#include "kernels/reduce.h"

namespace lockstep::engine {
namespace {

void require_f32(const char* who, const core::Tensor& grads) {
  if (grads.dtype() != DType::f32)
    throw InvalidArgument(std::string(who) + ": gradients are " + dtype_name(grads.dtype()) +
                          ", expected the f32 flat gradient buffer");
}

std::vector<comm::FlatRange> whole(const core::Tensor& grads) { return {{0, grads.numel()}}; }

// The f64 sum of squares of `x`, never rounded to f32 (Note [non-finite steps]).
double sum_squares_f64(const core::Tensor& x, const core::Stream& stream) {
  double total = 0.0;
  core::dispatch_stream(
      x.device(), stream,
      [&] { kernels::cpu::sum_squares(x.data(), x.dtype(), x.numel(), &total); },
      [&](const core::Stream& s) {
        // The per-block partials, then the total: f64s in an i64 tensor.
        constexpr std::int64_t blocks = kernels::cuda::kReduceBlocks;
        core::Tensor scratch = core::Tensor::empty({blocks + 1}, DType::i64, x.device(), s);
        auto* partials = scratch.data_as<std::int64_t>();
        kernels::cuda::sum_squares(x.data(), x.dtype(), x.numel(),
                                   reinterpret_cast<double*>(partials + blocks), partials,
                                   s.handle());
        scratch.view(blocks, {1}).copy_to_host(&total, s);
      });
  return total;
}

}  // namespace

double grad_sum_squares(const core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                        const core::Stream& stream) {
  require_f32("grad_norm", grads);
  double total = 0.0;
  for (const comm::FlatRange& r : ranges)
    if (r.numel > 0) total += sum_squares_f64(grads.view(r.offset, {r.numel}), stream);
  return total;
}

double grad_norm(const core::Tensor& grads, const core::Stream& stream) {
  return std::sqrt(grad_sum_squares(grads, whole(grads), stream));
}

void clip_to_norm(core::Tensor& grads, const std::vector<comm::FlatRange>& ranges, double norm,
                  double max_norm, const core::Stream& stream) {
  if (!(max_norm > 0.0))
    throw InvalidArgument("clip_grad_norm: max_norm " + std::to_string(max_norm) + " must be > 0");
  const double clip_coef = max_norm / (norm + 1e-6);
  if (!std::isfinite(norm) || clip_coef >= 1.0) return;
  for (const comm::FlatRange& r : ranges) {
    if (r.numel == 0) continue;
    core::Tensor slice = grads.view(r.offset, {r.numel});
    core::ops::scale(slice, static_cast<float>(clip_coef), stream);
  }
}

double clip_grad_norm(core::Tensor& grads, double max_norm, const core::Stream& stream) {
  const double norm = grad_norm(grads, stream);
  clip_to_norm(grads, whole(grads), norm, max_norm, stream);
  return norm;
}

}  // namespace lockstep::engine
