// DistributedSampler: which samples each rank reads, batch by batch. One
// order of all N samples per epoch, a permutation keyed by (seed, epoch)
// (Note [sampler permutation]) or 0..N-1 without shuffling; global batch b
// is positions [b*G, (b+1)*G) of that order, G = world_size * micro_batch,
// and rank r takes positions [b*G + r*B, b*G + (r+1)*B).
//
// Note [padding]: with drop_last the last partial global batch is dropped;
// without it (evaluation) the epoch is padded to a whole number of global
// batches by repeating the order from its start, so every sample is seen at
// least once. Padding is always a suffix of the global batch, hence of each
// micro-batch: `valid` rows come first, and metrics count only those. A rank
// whose whole micro-batch is padding still gets one (valid = 0) and takes the
// step with the others.
//
// The position is the number of global samples consumed this epoch (a
// multiple of G); resuming at (epoch, position) continues exactly, on any
// world size with the same global batch.
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::io {

struct SamplerOptions {
  std::int64_t micro_batch = 1;  // B: rows per rank per step
  int world_size = 1;
  int rank = 0;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = true;  // false: pad the last global batch (Note [padding])
};

struct MicroBatch {
  std::vector<std::int64_t> indices;  // global sample index of each row, B of them
  std::int64_t valid = 0;             // rows [0, valid) are real samples; the rest padding
};

class DistributedSampler {
 public:
  DistributedSampler(std::int64_t dataset_size, const SamplerOptions& options);

  const SamplerOptions& options() const { return options_; }
  std::int64_t dataset_size() const { return dataset_size_; }
  std::int64_t global_batch() const { return options_.micro_batch * options_.world_size; }
  std::int64_t batches_per_epoch() const;
  // The position at the end of an epoch: batches_per_epoch() * global_batch().
  std::int64_t epoch_positions() const { return batches_per_epoch() * global_batch(); }

  // The order of all samples in `epoch` (Note [sampler permutation]).
  std::vector<std::int64_t> order(std::int64_t epoch) const;
  // Computes and keeps the order of `epoch` for micro_batch().
  void set_epoch(std::int64_t epoch);
  std::int64_t epoch() const { return epoch_; }
  // This rank's rows of global batch `batch` of the current epoch.
  MicroBatch micro_batch(std::int64_t batch) const;
  // Throws InvalidArgument unless `position` is a multiple of the global batch
  // within [0, epoch_positions()].
  void check_position(std::int64_t position) const;

 private:
  std::int64_t dataset_size_;
  SamplerOptions options_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> order_;
};

}  // namespace lockstep::io
