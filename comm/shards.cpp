// The ZeRO-1 shard layout and the gather of shards (comm/shards.h).
#include "comm/shards.h"

#include <fmt/core.h>

#include <algorithm>

#include "kernels/error.h"

namespace lockstep::comm {
namespace {

constexpr std::int64_t kChunkAlignElements = 64;  // 256 bytes of f32

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

std::int64_t ShardLayout::padded_numel() const {
  return round_up(buffer_numel, kChunkAlignElements * ranks);
}

FlatRange ShardLayout::chunk(std::size_t bucket, int owner) const {
  const std::int64_t size = chunk_numel(bucket);
  const std::int64_t start = buckets[bucket].offset + owner * size;
  return {start, std::clamp<std::int64_t>(buffer_numel - start, 0, size)};
}

std::vector<FlatRange> ShardLayout::owned() const {
  std::vector<FlatRange> ranges;
  for (std::size_t b = 0; b < buckets.size(); ++b) ranges.push_back(chunk(b, rank));
  return ranges;
}

std::vector<FlatRange> ShardLayout::owned_packed() const {
  std::vector<FlatRange> ranges;
  std::int64_t position = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    ranges.push_back({position, chunk(b, rank).numel});
    position += chunk_numel(b);
  }
  return ranges;
}

ShardLayout plan_shards(const std::vector<GradientSegment>& segments, std::int64_t buffer_numel,
                        int ranks, int rank, std::size_t first_bucket_cap_bytes,
                        std::size_t bucket_cap_bytes, const std::vector<std::int64_t>& cuts) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw InvalidArgument(
        fmt::format("plan_shards: rank {} of {} ranks (need 0 <= rank < ranks)", rank, ranks));
  ShardLayout layout{ranks, rank, buffer_numel, {}};
  const std::int64_t unit = kChunkAlignElements * ranks;
  const std::int64_t padded = layout.padded_numel();
  std::vector<std::int64_t> ends;
  for (const Bucket& b : plan_buckets(segments, first_bucket_cap_bytes, bucket_cap_bytes)) {
    const std::int64_t end = round_up(b.offset + b.numel, unit);
    if (ends.empty() || end > ends.back()) ends.push_back(end);
  }
  for (const std::int64_t cut : cuts) {
    if (cut < 0 || cut > padded || cut % unit != 0)
      throw InvalidArgument(fmt::format(
          "plan_shards: cut {} is not a multiple of {} (64 elements x {} ranks) in [0, {}]: the "
          "ParameterStore's units must be laid out for this world size (Note [parameter units])",
          cut, unit, ranks, padded));
    if (cut > 0 && cut < padded) ends.push_back(cut);
  }
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  while (!ends.empty() && ends.back() > padded) ends.pop_back();
  if (padded > 0 && (ends.empty() || ends.back() < padded)) ends.push_back(padded);
  // The tail past the buffer gets a bucket of its own (Note [shard layout]).
  const std::int64_t before_last = ends.size() > 1 ? ends[ends.size() - 2] : 0;
  if (padded > buffer_numel && padded - unit > before_last)
    ends.insert(ends.end() - 1, padded - unit);

  // Segments are in offset order, so the ones a bucket touches are a run.
  std::size_t first = 0;
  std::int64_t start = 0;
  for (const std::int64_t end : ends) {
    while (first < segments.size() &&
           segments[first].offset + std::max<std::int64_t>(segments[first].numel, 1) <= start)
      ++first;
    std::size_t last = first;
    while (last < segments.size() && segments[last].offset < end) ++last;
    layout.buckets.push_back({start, end - start, first, last});
    start = end;
  }
  return layout;
}

std::pair<std::size_t, std::size_t> buckets_of_range(const ShardLayout& layout, FlatRange range) {
  const auto starts_at = [&](std::int64_t offset) {
    auto it = std::lower_bound(layout.buckets.begin(), layout.buckets.end(), offset,
                               [](const Bucket& b, std::int64_t at) { return b.offset < at; });
    const std::size_t index = static_cast<std::size_t>(it - layout.buckets.begin());
    const bool edge = index == layout.buckets.size() ? offset == layout.padded_numel()
                                                     : layout.buckets[index].offset == offset;
    if (!edge)
      throw InvalidArgument(fmt::format(
          "buckets_of_range: [{}, {}) does not start and end at bucket edges of the shard layout",
          range.offset, range.offset + range.numel));
    return index;
  };
  return {starts_at(range.offset), starts_at(range.offset + range.numel)};
}

void gather_shards(Communicator& comm, const ShardLayout& layout, const core::Tensor& shard,
                   core::Tensor& full, const core::Stream& stream) {
  if (shard.dtype() != DType::f32 || full.dtype() != DType::f32 ||
      shard.numel() != layout.shard_numel() || full.numel() != layout.padded_numel())
    throw InvalidArgument(fmt::format(
        "gather_shards: shard ({} {}) and full ({} {}) must be f32 of {} and {} elements",
        shard.numel(), dtype_name(shard.dtype()), full.numel(), dtype_name(full.dtype()),
        layout.shard_numel(), layout.padded_numel()));
  std::int64_t position = 0;
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const std::int64_t size = layout.chunk_numel(b);
    const std::int64_t mine = layout.buckets[b].offset + layout.rank * size;
    full.view(mine, {size}).copy_from(shard.view(position, {size}), stream);
    float* base = full.data_as<float>() + layout.buckets[b].offset;
    comm.allgather(base + layout.rank * size, base, size, DType::f32, stream);
    position += size;
  }
}

}  // namespace lockstep::comm
