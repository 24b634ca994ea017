// StepReadback (engine/step_readback.h).
#include "engine/step_readback.h"

#include <cstring>

#include "kernels/reduce.h"

namespace lockstep::engine {
namespace {

std::size_t round_up(std::size_t bytes, std::size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

StepReadback::StepReadback(std::int64_t ranges, std::int64_t chunks, core::Device device,
                           const core::Stream& stream) {
  // [loss f32][rows f32][flag i32][pad][sums f64 x ranges][chunks f32 x chunks] | workspace
  constexpr std::size_t sums_at = 16;
  const std::size_t chunks_at = sums_at + static_cast<std::size_t>(ranges) * sizeof(double);
  read_bytes_ = round_up(chunks_at + static_cast<std::size_t>(chunks) * sizeof(float), 8);
  const std::size_t workspace_bytes = kernels::cuda::kReduceWorkspaceBytes;
  buffer_ = core::Tensor::empty({static_cast<std::int64_t>(read_bytes_ + workspace_bytes)},
                                DType::u8, device, stream);
  loss_total_ = buffer_.view_bytes(0, {1}, DType::f32);
  rows_total_ = buffer_.view_bytes(4, {1}, DType::f32);
  nonfinite_ = buffer_.view_bytes(8, {1}, DType::i32);
  sum_squares_ = buffer_.view_bytes(sums_at, {ranges}, DType::i64);
  chunk_losses_ = buffer_.view_bytes(chunks_at, {chunks}, DType::f32);
  workspace_ = buffer_.view_bytes(read_bytes_, {kernels::cuda::kReduceBlocks}, DType::i64);
  host_.resize(read_bytes_);
  values_.sum_squares.resize(static_cast<std::size_t>(ranges));
  values_.chunk_losses.resize(static_cast<std::size_t>(chunks));
}

void StepReadback::clear(const core::Stream& stream) {
  buffer_.view(0, {static_cast<std::int64_t>(read_bytes_)}).fill_(0.0, stream);
}

const StepReadback::Values& StepReadback::read(const core::Stream& stream) {
  buffer_.view(0, {static_cast<std::int64_t>(read_bytes_)}).copy_to_host(host_.data(), stream);
  float loss = 0.0f, rows = 0.0f;
  std::int32_t flag = 0;
  std::memcpy(&loss, host_.data(), sizeof loss);
  std::memcpy(&rows, host_.data() + 4, sizeof rows);
  std::memcpy(&flag, host_.data() + 8, sizeof flag);
  values_.loss_total = loss;
  values_.rows_total = static_cast<std::int64_t>(rows);
  values_.nonfinite = flag != 0;
  // An empty slot's vector has no storage: memcpy may not be given its null.
  const std::size_t sums_bytes = values_.sum_squares.size() * sizeof(double);
  if (sums_bytes > 0) std::memcpy(values_.sum_squares.data(), host_.data() + 16, sums_bytes);
  if (!values_.chunk_losses.empty())
    std::memcpy(values_.chunk_losses.data(), host_.data() + 16 + sums_bytes,
                values_.chunk_losses.size() * sizeof(float));
  return values_;
}

}  // namespace lockstep::engine
