// The ZeRO-1 shard layout of the flat f32 buffers: buckets that tile the whole
// buffer, each split into one equal, 256-byte aligned chunk per rank, so that
// a bucket's gradients are reduce-scattered (MPI_Reduce_scatter_block,
// ncclReduceScatter) into the chunk's owner and its parameters all-gathered
// back. Rank r's shard is its chunk of every bucket.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "comm/buckets.h"
#include "comm/communicator.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::comm {

// A run of the flat buffers, in elements.
struct FlatRange {
  std::int64_t offset = 0;
  std::int64_t numel = 0;
};

// Note [shard layout]: with N ranks and U = N x 64 elements (64 f32 = 256
// bytes), the sharded buckets are [s_b, s_b+1) with s_0 = 0, each s_b a
// multiple of U: the ends of the unsharded bucket plan (plan_buckets)
// rounded up to U, empty buckets dropped. The last bucket ends at P, the
// buffer's size T rounded up to U; when P > T it is split so that the tail
// [P - U, P) is a bucket of its own, the only one that reaches past the
// buffer (it is reduced and gathered through a U-element scratch, the others
// in place). Bucket b of n_b elements gives rank r the chunk
// [s_b + r n_b / N, s_b + (r + 1) n_b / N), so every chunk starts on a
// 256-byte boundary and every rank's shard holds P / N elements, T / N
// rounded up to 64. A bucket may cut a parameter (the optimizer works on flat
// ranges, not parameters); it is complete once every segment it touches is.
// Padding (between parameters, and [T, P)) stays zero. ZeRO-3 adds cuts:
// offsets, each a multiple of U, where a bucket must end, so that each of its
// units is a run of whole buckets (Note [parameter units], engine/zero3.h).
struct ShardLayout {
  int ranks = 1;
  int rank = 0;
  std::int64_t buffer_numel = 0;  // T
  std::vector<Bucket> buckets;    // tiling [0, P); first/end_segment: the segments each touches

  std::int64_t padded_numel() const;  // P
  std::int64_t shard_numel() const { return padded_numel() / ranks; }
  std::int64_t chunk_numel(std::size_t bucket) const { return buckets[bucket].numel / ranks; }
  // Rank `owner`'s chunk of `bucket`, cut at the buffer's end (numel may be 0).
  FlatRange chunk(std::size_t bucket, int owner) const;
  // This rank's chunks, in bucket order: the elements it reduces, updates and keeps state for.
  std::vector<FlatRange> owned() const;
  // The same chunks in the packed shard (shard_numel() elements, chunk after
  // chunk in bucket order), as ZeRO-2 keeps gradients and ZeRO-1 state.
  std::vector<FlatRange> owned_packed() const;
};

// Note [shard layout]. `segments` must pass check_segments against `buffer_numel`;
// `cuts` must be multiples of U in [0, P] (InvalidArgument otherwise).
ShardLayout plan_shards(const std::vector<GradientSegment>& segments, std::int64_t buffer_numel,
                        int ranks, int rank, std::size_t first_bucket_cap_bytes,
                        std::size_t bucket_cap_bytes, const std::vector<std::int64_t>& cuts = {});
// The buckets [first, end) that tile `range` exactly; InvalidArgument when its
// edges are not bucket edges.
std::pair<std::size_t, std::size_t> buckets_of_range(const ShardLayout& layout, FlatRange range);

// Collective: `shard` (f32, shard_numel() elements: this rank's chunks, one
// after another in bucket order) of every rank into `full` (f32,
// padded_numel() elements, the flat layout), one allgather per bucket.
void gather_shards(Communicator& comm, const ShardLayout& layout, const core::Tensor& shard,
                   core::Tensor& full, const core::Stream& stream = {});

}  // namespace lockstep::comm
