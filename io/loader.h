// DataLoader: this rank's micro-batches of a Dataset, in order, assembled
// ahead of the consumer by T worker threads into a fixed pool of D host
// buffers (sized for the batches the consumer holds, Note [loader pool
// size]), then handed out as tensors on the loader's device.
//
// Note [loader pipeline]: a worker takes the next batch index and a free
// buffer together, under one lock, so buffers go to batches in order and the
// batch the consumer waits for always has one. It reads the batch's rows
// (sorted and coalesced, Dataset::read_inputs), fills the labels, runs the
// transform, and posts the buffer. next() takes batches strictly in index
// order, so the sequence is the same for every T. What happens then depends
// on the device:
// - cpu: the batch's tensors are the buffer itself (no copy). The buffer
//   returns to the pool once the consumer has dropped every reference to
//   them (copies and views included); next() throws when the consumer holds
//   all D buffers, rather than waiting forever.
// - cuda: the buffer is pinned (core::allocate_pinned). Its host-to-device
//   copy runs on the loader's own stream into tensors allocated on the
//   consumer's stream (so they are freed in order with the consumer's work);
//   an event recorded after the copy marks the batch ready, and next() makes
//   the consumer's stream wait for it. The buffer returns to the pool at once,
//   fenced by a second event that a worker waits for before refilling it. The
//   copy of batch k+1 is issued when next() hands out batch k if the batch is
//   assembled by then, so it overlaps the consumer's step.
// An exception in a worker (a read error, a damaged image, a throwing transform) is kept with
// its batch and rethrown by next() when the consumer reaches that batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "io/batch_source.h"
#include "io/dataset.h"
#include "io/image_transform.h"
#include "io/sampler.h"

namespace lockstep::io {

// A batch in host memory as a transform sees it: before the copy to the
// device and before u8 scaling, in the dataset's dtype. A transform changes
// values in place (augmentation, normalisation); shapes stay.
struct HostBatch {
  void* inputs = nullptr;  // [rows, ...sample_shape] of `dtype`
  DType dtype = DType::u8;
  core::Shape shape;                      // [rows, ...sample_shape]
  std::int64_t* labels = nullptr;         // [rows], or [rows, T] for tokens
  std::span<const std::int64_t> indices;  // global sample index of each row
  std::int64_t valid = 0;                 // Note [padding], io/sampler.h
  std::int64_t epoch = 0, index = 0;      // global batch `index` of `epoch`
};
// Runs on worker threads, several at once: it must be thread-safe, and it
// should key any randomness by (epoch, sample index) so results do not
// depend on which thread ran it.
using Transform = std::function<void(HostBatch&)>;

struct LoaderOptions {
  SamplerOptions sampler{};
  int threads = 4;  // T
  // Batches the consumer keeps at once (the Trainer: one step's accumulation).
  // On the cpu they all stay lent, so the pool must outnumber them (Note
  // [loader pool size]).
  std::int64_t held_batches = 1;
  // D, buffers in the pool; 0: 2 * threads + 1 + held_batches on the cpu (held
  // capped at an epoch's batches), 2 * threads + 2 on cuda.
  int depth = 0;
  core::Device device = core::Device::cpu();
  // CUDA: the stream the consumer uses the batches on (default: the device's
  // default stream). Batch tensors are allocated on it.
  core::Stream stream{};
  bool scale_u8 = false;  // u8 inputs come out as f32 x / 255 (x * (1.0f / 255))
  // > 0: check every label lies in [0, num_classes) at start (token shards:
  // every token of a batch, as it is assembled).
  std::int64_t num_classes = 0;
  Transform transform{};
  // The image pipeline (Note [image batches] in loader.cpp): when enabled,
  // every row is decoded (encoded-image shards) or taken as u8 [C, H, W],
  // cropped, flipped and normalised by these options, and inputs come out
  // f32 [B, channels, height, width] (on cuda, normalised on the device). Required for
  // encoded-image shards; scale_u8 must then be off (the normalisation includes x / 255).
  ImageOptions images{};
};

struct LoaderStats {
  std::int64_t batches = 0;  // handed out since construction
  double wait_s = 0;         // time next() spent waiting for a batch to be assembled
  double max_wait_s = 0;
};

// A BatchSource: start_epoch drops the batches of a previous epoch not yet
// handed out.
class DataLoader final : public BatchSource {
 public:
  DataLoader(Dataset dataset, LoaderOptions options);
  // Stops the workers (mid-epoch too: each finishes the batch in hand) and joins them.
  ~DataLoader() override;

  std::optional<Batch> next() override;
  LoaderPosition position() const override;
  const DistributedSampler& sampler() const override;
  const Dataset& dataset() const;
  int depth() const;  // buffers in the pool
  LoaderStats stats() const;

 private:
  void do_start_epoch(std::int64_t epoch, std::int64_t position) override;

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lockstep::io
