// The rank-invariant reduction (comm/ordered_reduce.h): Note [chunk tree],
// Note [invariant world sizes], Note [ordered allreduce].
#include "comm/ordered_reduce.h"

#include <fmt/core.h>

#include <bit>

#include "comm/host_buffer.h"
#include "engine/core/ops.h"
#include "kernels/error.h"

namespace lockstep::comm {
namespace {

core::Tensor scratch(std::int64_t numel, core::Device device, const core::Stream& stream) {
  return device.is_cuda() ? core::Tensor::empty({numel}, DType::f32, device, stream)
                          : empty_host_buffer({numel}, DType::f32);
}

// The tree over `n` slices of `numel` elements laid side by side in `slices`,
// in place: each partial sum lives in the slot of its first slice, and the
// total ends in slot 0.
void tree_sum_slices(core::Tensor& slices, int n, std::int64_t numel, const core::Stream& stream) {
  if (numel == 0) return;
  tree_sum<int>(
      n, [](std::int64_t i) { return static_cast<int>(i); },
      [&](int left, int right) {
        core::Tensor a = slices.view(left * numel, {numel});
        const core::Tensor b = slices.view(right * numel, {numel});
        core::ops::add(a, b, a, stream);
        return left;
      });
}

}  // namespace

bool invariant_world_size(std::int64_t chunks, int world_size) {
  if (chunks < 1 || world_size < 1 || chunks % world_size != 0) return false;
  return world_size == 1 || std::has_single_bit(static_cast<std::uint64_t>(chunks / world_size));
}

std::vector<int> invariant_world_sizes(std::int64_t chunks) {
  std::vector<int> sizes;
  for (std::int64_t w = 1; w <= chunks; ++w)
    if (invariant_world_size(chunks, static_cast<int>(w))) sizes.push_back(static_cast<int>(w));
  return sizes;
}

std::string world_sizes_text(const std::vector<int>& sizes) {
  std::string text;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    text += fmt::format("{}{}", i == 0 ? "" : i + 1 == sizes.size() ? " or " : ", ", sizes[i]);
  return text;
}

ChunkTree::ChunkTree(core::Tensor leaf, std::int64_t leaves, const core::Stream& stream)
    : leaf_(std::move(leaf)), leaves_(leaves) {
  if (!leaf_.defined() || leaf_.dtype() != DType::f32 || leaves_ < 1)
    throw InvalidArgument(fmt::format(
        "ChunkTree: needs a defined f32 buffer and at least one leaf, got {} leaves", leaves_));
  const int levels = std::bit_width(static_cast<std::uint64_t>(leaves_ - 1));
  for (int l = 0; l < levels; ++l)
    partials_.push_back(scratch(leaf_.numel(), leaf_.device(), stream));
  full_.assign(partials_.size(), 0);
}

// Note [chunk tree] in binary-counter form: partials_[l] holds a complete
// block of 2^l chunks; the new leaf carries upwards through the full levels.
void ChunkTree::add(const core::Stream& stream) {
  ++seen_;
  std::size_t level = 0;
  for (; level < full_.size() && full_[level]; ++level) {
    core::ops::add(partials_[level], leaf_, leaf_, stream);
    full_[level] = 0;
  }
  if (seen_ < leaves_) {
    partials_[level].copy_from(leaf_, stream);
    full_[level] = 1;
    return;
  }
  // The last leaf: the earlier (larger) blocks, smallest first.
  for (; level < full_.size(); ++level)
    if (full_[level]) {
      core::ops::add(partials_[level], leaf_, leaf_, stream);
      full_[level] = 0;
    }
  seen_ = 0;
}

OrderedAllreduce::OrderedAllreduce(Communicator& comm, std::int64_t numel,
                                   const core::Stream& stream)
    : comm_(comm), numel_(numel), shard_(numel / comm.size()), tail_(numel % comm.size()) {
  if (comm_.size() == 1) return;
  received_ = scratch(comm_.size() * shard_, comm_.device(), stream);
  if (tail_ > 0) tail_received_ = scratch(comm_.size() * tail_, comm_.device(), stream);
}

void OrderedAllreduce::run(core::Tensor& data, const core::Stream& stream) {
  if (!data.defined() || data.dtype() != DType::f32 || data.numel() != numel_ ||
      !(data.device() == comm_.device()))
    throw InvalidArgument(
        fmt::format("OrderedAllreduce on '{}': the buffer must be {} f32 elements on {}",
                    comm_.label(), numel_, comm_.device().str()));
  const int size = comm_.size(), rank = comm_.rank();
  if (size == 1) return;
  float* base = data.data_as<float>();
  if (shard_ > 0) {
    comm_.alltoall(base, received_.data(), shard_, DType::f32, stream);
    tree_sum_slices(received_, size, shard_, stream);
    data.view(rank * shard_, {shard_}).copy_from(received_.view(0, {shard_}), stream);
    comm_.allgather(base + rank * shard_, base, shard_, DType::f32, stream);
  }
  if (tail_ > 0) {
    const std::int64_t at = size * shard_;
    comm_.allgather(base + at, tail_received_.data(), tail_, DType::f32, stream);
    tree_sum_slices(tail_received_, size, tail_, stream);
    data.view(at, {tail_}).copy_from(tail_received_.view(0, {tail_}), stream);
  }
}

}  // namespace lockstep::comm
