// ChunkBuffers: a model's buffers (BatchNorm's running statistics) under the
// rank-invariant step (StepOptions::rank_invariant, docs/reproducibility.md).
// Each chunk's forward moves the buffers from the step's starting values as
// if it were the step's only batch; the chunks' moves are combined in the
// fixed tree of Note [chunk tree], on a rank and across ranks, and applied
// once per step, so the buffers after a step are the same bits on any
// supported number of ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/gradient_synchronizer.h"
#include "comm/ordered_reduce.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::comm {

// Note [chunk buffers]: with C chunks in the step, b0 a buffer's value at the
// step's start (after the synchroniser's broadcast from rank 0) and b_j the
// value chunk j's forward leaves when it starts from b0:
//   f32 buffers:    b = b0 + (1 / C) * tree_j (b_j - b0)
// with tree_j the sum of Note [chunk tree] over the chunk index (ChunkTree
// over a rank's chunks, OrderedAllreduce over the ranks' partial sums), each
// difference b_j - b0 rounded to f32, 1 / C rounded to f32 and the update one
// axpy. For BatchNorm (running = (1 - m) running + m stat), b_j - b0 =
// m (stat_j - b0), so b = (1 - m) b0 + m mean_j stat_j: the running
// statistics move once per step towards the mean over the chunks of each
// chunk's batch statistics (biased mean, unbiased variance, per chunk of B
// rows, as the chunk normalised with). A buffer no chunk moves stays b0 bit
// for bit (its differences are 0; finite b0, and -0 becomes +0). Other dtypes (num_batches_tracked,
// i64): every chunk starts from b0 too, and the buffer keeps the value this rank's last chunk
// leaves, so a counter counts steps, not chunks; a non-f32 buffer whose move depends on the rows
// would differ between world sizes. Memory, in copies of the buffers: one for b0 (every dtype), one
// for the chunk's differences, ceil(log2 K) partial sums (ChunkTree) and about one for
// OrderedAllreduce's receive buffer (f32 only). Work per chunk: a copy of every buffer (the
// restore, from the second chunk on) and one difference per f32 buffer; per step, the tree and the
// ordered allreduce over the f32 buffers' elements.
class ChunkBuffers {
 public:
  // `buffers` on `comm`'s device (or on any device when `comm` is null: a
  // step of one process), `chunks_per_rank` chunks per rank of each step.
  // Not collective.
  ChunkBuffers(std::vector<NamedBuffer> buffers, std::int64_t chunks_per_rank, Communicator* comm,
               const core::Stream& stream);
  // Before chunk `k`'s forward (k = 0, ..., K - 1): at 0 keeps b0, later
  // restores the buffers to it.
  void begin_chunk(std::int64_t k, const core::Stream& stream);
  // After chunk k's forward: its differences into the tree.
  void end_chunk(const core::Stream& stream);
  // After the last chunk, on every rank (collective): the combined update.
  void finish(const core::Stream& stream);

 private:
  std::vector<NamedBuffer> buffers_;
  std::vector<core::Tensor> start_;          // b0, per buffer
  std::vector<std::int64_t> offsets_;        // f32 buffers: their place in leaf_; -1 others
  std::int64_t chunks_ = 1, f32_numel_ = 0;  // C, and the f32 buffers' elements
  Communicator* comm_;
  core::Tensor leaf_;                         // the chunk's differences, then the sum over C
  std::unique_ptr<ChunkTree> tree_;           // null without f32 buffers
  std::unique_ptr<OrderedAllreduce> across_;  // null for one rank
};

}  // namespace lockstep::comm
