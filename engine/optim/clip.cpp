// Gradient norm and clipping (engine/optim/clip.h).
#include "engine/optim/clip.h"

#include <cmath>
#include <string>

#include "engine/core/dispatch.h"
#include "engine/core/memory.h"
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

}  // namespace

// Per range an f64 sum of squares, never rounded to f32 (Note [non-finite
// steps]), then their sum in range order. On CUDA the ranges' kernels share
// one workspace in stream order and write their totals side by side, read
// back in one copy: one synchronisation however many ranges (ZeRO-1 passes
// one per owned bucket).
double grad_sum_squares(const core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                        const core::Stream& stream) {
  require_f32("grad_norm", grads);
  core::MemoryKindScope kind(core::MemoryKind::workspace);  // Note [memory kinds]
  std::vector<comm::FlatRange> nonempty;
  for (const comm::FlatRange& r : ranges)
    if (r.numel > 0) nonempty.push_back(r);
  const auto count = static_cast<std::int64_t>(nonempty.size());
  std::vector<double> totals(nonempty.size(), 0.0);
  if (count == 0) return 0.0;
  core::dispatch_stream(
      grads.device(), stream,
      [&] {
        for (std::int64_t i = 0; i < count; ++i)
          kernels::cpu::sum_squares(grads.view(nonempty[i].offset, {nonempty[i].numel}).data(),
                                    DType::f32, nonempty[i].numel, &totals[i]);
      },
      [&](const core::Stream& s) {
        // The per-block partials, then one total per range: f64s in an i64 tensor.
        constexpr std::int64_t blocks = kernels::cuda::kReduceBlocks;
        core::Tensor scratch = core::Tensor::empty({blocks + count}, DType::i64, grads.device(), s);
        auto* partials = scratch.data_as<std::int64_t>();
        for (std::int64_t i = 0; i < count; ++i)
          kernels::cuda::sum_squares(grads.view(nonempty[i].offset, {nonempty[i].numel}).data(),
                                     DType::f32, nonempty[i].numel,
                                     reinterpret_cast<double*>(partials + blocks + i), partials,
                                     s.handle());
        scratch.view(blocks, {count}).copy_to_host(totals.data(), s);
      });
  double total = 0.0;
  for (double t : totals) total += t;
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
