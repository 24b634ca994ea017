// ChunkBuffers (comm/chunk_buffers.h): Note [chunk buffers].
#include "comm/chunk_buffers.h"

#include <fmt/core.h>

#include "engine/core/ops.h"

namespace lockstep::comm {

ChunkBuffers::ChunkBuffers(std::vector<NamedBuffer> buffers, std::int64_t chunks_per_rank,
                           Communicator* comm, const core::Stream& stream)
    : buffers_(std::move(buffers)),
      chunks_(chunks_per_rank * (comm ? comm->size() : 1)),
      comm_(comm) {
  if (chunks_per_rank < 1)
    throw InvalidArgument(fmt::format(
        "ChunkBuffers: {} chunks per rank; there must be at least one", chunks_per_rank));
  for (const NamedBuffer& b : buffers_) {
    if (comm_ && !(b.tensor.device() == comm_->device()))
      throw InvalidArgument(fmt::format(
          "ChunkBuffers: buffer '{}' is on {} but communicator '{}' takes buffers on {} (move "
          "the model before building the step)",
          b.name, b.tensor.device().str(), comm_->label(), comm_->device().str()));
    start_.push_back(
        core::Tensor::empty(b.tensor.shape(), b.tensor.dtype(), b.tensor.device(), stream));
    offsets_.push_back(b.tensor.dtype() == DType::f32 ? f32_numel_ : -1);
    if (b.tensor.dtype() == DType::f32) f32_numel_ += b.tensor.numel();
  }
  if (f32_numel_ == 0) return;
  leaf_ = core::Tensor::empty({f32_numel_}, DType::f32, buffers_.front().tensor.device(), stream);
  tree_ = std::make_unique<ChunkTree>(leaf_, chunks_per_rank, stream);
  if (comm_ && comm_->size() > 1)
    across_ = std::make_unique<OrderedAllreduce>(*comm_, f32_numel_, stream);
}

void ChunkBuffers::begin_chunk(std::int64_t k, const core::Stream& stream) {
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (k == 0)
      start_[i].copy_from(buffers_[i].tensor, stream);
    else
      buffers_[i].tensor.copy_from(start_[i], stream);
  }
}

void ChunkBuffers::end_chunk(const core::Stream& stream) {
  if (!tree_) return;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (offsets_[i] < 0) continue;
    const core::Tensor& b = buffers_[i].tensor;
    core::Tensor difference = leaf_.view(offsets_[i], b.shape());
    difference.copy_from(b, stream);
    core::ops::axpy(-1.0f, start_[i], difference, stream);
  }
  tree_->add(stream);
}

void ChunkBuffers::finish(const core::Stream& stream) {
  if (!tree_) return;
  if (across_) across_->run(leaf_, stream);
  const float inverse = 1.0f / static_cast<float>(chunks_);
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (offsets_[i] < 0) continue;
    core::Tensor& b = buffers_[i].tensor;
    b.copy_from(start_[i], stream);
    core::ops::axpy(inverse, leaf_.view(offsets_[i], b.shape()), b, stream);
  }
}

}  // namespace lockstep::comm
