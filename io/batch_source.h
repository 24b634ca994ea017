// BatchSource: where a training loop takes this rank's micro-batches from,
// epoch by epoch. The HDF5 DataLoader (io/loader.h) is one; TensorDataset
// (io/tensor_dataset.h), rows already in memory, is another. Both split each
// epoch's order over the ranks with a DistributedSampler, so a checkpoint's
// (epoch, position) means the same for either.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/core/named_tensors.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "io/sampler.h"

namespace lockstep::io {

struct Batch {
  // Token shards (ShardFormat::is_tokens()): inputs [B, T] i32, the first
  // T tokens of each window, and labels [B, T] i64, its last T.
  core::Tensor inputs;  // [B, ...sample_shape]: the dataset's dtype, or f32 when scaled
  // What the loss trains towards: [B] i64 class indices, or for a target
  // shard (ShardFormat::has_targets) f32 [B, ...target_shape].
  core::Tensor labels;
  // Further tensors of B rows by name (a second input, a second target, a
  // mask: a TensorDataset's named tensors); the HDF5 DataLoader hands out none.
  core::NamedTensors named{};
  std::vector<std::int64_t> indices;  // global sample index of each row
  std::int64_t valid = 0;             // rows [0, valid) are real (Note [padding])
  std::int64_t epoch = 0, index = 0;  // global batch `index` of `epoch`
  core::Event ready;  // CUDA: recorded after the copy (the consumer's stream already waits)
};

// Where a checkpoint resumes: global samples consumed at the consumer.
struct LoaderPosition {
  std::int64_t epoch = 0;
  std::int64_t position = 0;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // Starts (or restarts) `epoch` at `position`, a count of global samples
  // already consumed (LoaderPosition::position of a checkpoint); throws
  // InvalidArgument unless it is a multiple of the global batch within the epoch.
  void start_epoch(std::int64_t epoch, std::int64_t position = 0) {
    do_start_epoch(epoch, position);
  }
  // The next micro-batch of this rank, or nothing at the end of the epoch.
  virtual std::optional<Batch> next() = 0;
  // Counted at the consumer: batches handed out, not batches prepared.
  virtual LoaderPosition position() const = 0;
  // The epoch's order and this rank's share of each global batch.
  virtual const DistributedSampler& sampler() const = 0;
  std::int64_t batches_per_epoch() const { return sampler().batches_per_epoch(); }

 protected:
  BatchSource() = default;
  BatchSource(const BatchSource&) = default;  // for the sources that can be copied
  BatchSource& operator=(const BatchSource&) = default;

 private:
  virtual void do_start_epoch(std::int64_t epoch, std::int64_t position) = 0;
};

}  // namespace lockstep::io
