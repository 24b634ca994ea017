// The rank-invariant reduction (StepOptions::rank_invariant, docs/reproducibility.md):
// sums in one fixed tree over the chunk index, on a rank (ChunkTree, over its
// chunks' gradients) and across ranks (OrderedAllreduce, over the ranks'
// partial sums), so that a global batch gives the same bits on any supported
// number of ranks. Which world sizes a chunk count supports: invariant_world_sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::comm {

// Note [chunk tree]: the sum of n leaves x[0], ..., x[n-1] (chunk gradients,
// or ranks' partial sums) is, by definition,
//   n = 1:                 x[0]
//   n a power of two:      sum(first n/2) + sum(last n/2)
//   otherwise:             sum(first 2^floor(log2 n)) + sum(the rest)
// Float addition commutes bit for bit, so only this association matters.
// The binary-counter form computes it with one pass over the leaves: a stack
// of complete blocks (sizes decreasing), a new leaf merging with equal-sized
// blocks as a binary increment carries, and at the end the blocks folded
// smallest (rightmost) first: B1 + (B2 + (... + Bm)).
//
// Note [invariant world sizes]: with C chunks, W ranks and K = C / W chunks
// per rank (rank r holding chunks [r K, (r + 1) K)), each rank's tree over its
// K chunks is a subtree of the tree over all C exactly when K is a power of
// two: the tree's splits then fall on multiples of K, and the tree over the
// W partial sums is the tree over C above them. W = 1 (one tree over all C)
// always qualifies. So C chunks give the same bits on W ranks for W = 1 and
// for every W = C / 2^i with 2^i dividing C: 12 chunks on 1, 3, 6 or 12 ranks
// (4, 2 or 1 chunk each), not on 2 or 4 (6 or 3 chunks each).
bool invariant_world_size(std::int64_t chunks, int world_size);
// Every world size that `chunks` supports, ascending.
std::vector<int> invariant_world_sizes(std::int64_t chunks);
// "1, 3, 6 or 12": for error messages.
std::string world_sizes_text(const std::vector<int>& sizes);

// Note [chunk tree] over leaves given one at a time, host values: `leaf(i)`
// gives leaf i, `add(left, right)` the sum of two adjacent partial sums.
template <typename T, typename Leaf, typename Add>
T tree_sum(std::int64_t n, Leaf&& leaf, Add&& add) {
  std::vector<std::pair<int, T>> blocks;  // (level: log2 of its leaves, partial sum)
  for (std::int64_t i = 0; i < n; ++i) {
    std::pair<int, T> carry{0, leaf(i)};
    while (!blocks.empty() && blocks.back().first == carry.first) {
      carry = {carry.first + 1, add(std::move(blocks.back().second), std::move(carry.second))};
      blocks.pop_back();
    }
    blocks.push_back(std::move(carry));
  }
  T total = std::move(blocks.back().second);
  blocks.pop_back();
  for (; !blocks.empty(); blocks.pop_back())
    total = add(std::move(blocks.back().second), std::move(total));
  return total;
}

// The tree of Note [chunk tree] over gradients that arrive one chunk at a
// time in `leaf` (the flat f32 gradient buffer backward writes). After the
// last of `leaves` calls to add(), `leaf` holds the sum, and the tree is
// ready for the next step. Memory: ceil(log2(leaves)) partial buffers the
// size of `leaf` (0 for one chunk, 2 for 4, 3 for 8), made at construction on
// `leaf`'s device. Work per step: leaves - 1 adds and at most leaves - 1
// copies of the buffer.
class ChunkTree {
 public:
  ChunkTree(core::Tensor leaf, std::int64_t leaves, const core::Stream& stream);
  // `leaf` holds the next chunk's gradient (on `stream`'s order).
  void add(const core::Stream& stream);
  std::size_t partial_buffers() const { return partials_.size(); }

 private:
  core::Tensor leaf_;
  std::int64_t leaves_;
  std::int64_t seen_ = 0;
  std::vector<core::Tensor> partials_;  // per level
  std::vector<char> full_;
};

// Note [ordered allreduce]: the sum over the ranks of a flat f32 buffer of
// `numel` elements, in the tree of Note [chunk tree] over the rank index, the
// same bits on every rank, whatever order MPI or NCCL would add in (neither
// MPI_Reduce_scatter nor NCCL promises one). With S = numel / W:
//   alltoall: rank q receives every rank's slice [q S, (q + 1) S);
//   rank q adds the W slices in the tree (in place, in its receive buffer);
//   allgather of the W summed slices into every rank's buffer;
// and the last numel - W S (< W) elements are all-gathered and added by every
// rank in the same tree. The bytes per rank are those of a ring allreduce,
// 2 (W - 1) / W of the buffer. Memory: one receive buffer of W S elements.
class OrderedAllreduce {
 public:
  // On `comm`'s device; not collective.
  OrderedAllreduce(Communicator& comm, std::int64_t numel, const core::Stream& stream);
  // Collective: `data` (numel f32 elements on the communicator's device)
  // becomes the sum over the ranks. GPU buffers: enqueued on `stream`.
  void run(core::Tensor& data, const core::Stream& stream);

 private:
  Communicator& comm_;
  std::int64_t numel_, shard_, tail_;  // numel, S, numel - W S
  core::Tensor received_, tail_received_;
};

}  // namespace lockstep::comm
