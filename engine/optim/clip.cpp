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
// steps]). On CUDA the ranges' kernels share one workspace in stream order
// and write their totals side by side, for the caller to read in one copy.
void enqueue_sum_squares(const core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                         const core::Tensor& totals, const core::Tensor& workspace,
                         const core::Stream& stream) {
  require_f32("grad_norm", grads);
  const auto count = static_cast<std::int64_t>(ranges.size());
  if (totals.dtype() != DType::i64 || totals.numel() != count)
    throw InvalidArgument("enqueue_sum_squares: totals hold " + std::to_string(totals.numel()) +
                          " f64 slots for " + std::to_string(count) + " ranges");
  if (count == 0) return;
  for (std::int64_t i = 0; i < count; ++i)  // an empty range's total is 0; the rest are written
    if (ranges[i].numel == 0) totals.view(i, {1}).fill_(0.0, stream);
  auto* out = reinterpret_cast<double*>(totals.data_as<std::int64_t>());
  core::dispatch_stream(
      grads.device(), stream,
      [&] {
        for (std::int64_t i = 0; i < count; ++i)
          if (ranges[i].numel > 0)
            kernels::cpu::sum_squares(grads.view(ranges[i].offset, {ranges[i].numel}).data(),
                                      DType::f32, ranges[i].numel, out + i);
      },
      [&](const core::Stream& s) {
        if (workspace.nbytes() < kernels::cuda::kReduceWorkspaceBytes)
          throw InvalidArgument("enqueue_sum_squares: a workspace of " +
                                std::to_string(workspace.nbytes()) + " bytes, the kernel needs " +
                                std::to_string(kernels::cuda::kReduceWorkspaceBytes));
        for (std::int64_t i = 0; i < count; ++i)
          if (ranges[i].numel > 0)
            kernels::cuda::sum_squares(grads.view(ranges[i].offset, {ranges[i].numel}).data(),
                                       DType::f32, ranges[i].numel, out + i, workspace.data(),
                                       s.handle());
      });
}

double sum_in_order(const std::vector<double>& totals) {
  double total = 0.0;
  for (double t : totals) total += t;
  return total;
}

double grad_sum_squares(const core::Tensor& grads, const std::vector<comm::FlatRange>& ranges,
                        const core::Stream& stream) {
  core::MemoryKindScope kind(core::MemoryKind::workspace);  // Note [memory kinds]
  const auto count = static_cast<std::int64_t>(ranges.size());
  if (count == 0) return 0.0;
  const core::Device device = grads.device();
  const core::Tensor totals = core::Tensor::empty({count}, DType::i64, device, stream);
  const core::Tensor workspace =
      device.is_cuda()
          ? core::Tensor::empty({kernels::cuda::kReduceBlocks}, DType::i64, device, stream)
          : core::Tensor();
  enqueue_sum_squares(grads, ranges, totals, workspace, stream);
  std::vector<double> host(static_cast<std::size_t>(count));
  totals.copy_to_host(host.data(), stream);
  return sum_in_order(host);
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
