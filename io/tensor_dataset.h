// TensorDataset: a BatchSource over rows already in memory (inputs [N, ...]
// and targets [N, ...], host tensors: class indices for cross-entropy, float
// values for regression, and any further named tensors of N rows: a second
// input, a second target, a mask), for tests and for programs that make their
// data rather than read it. Each epoch's order and each rank's
// share come from the same DistributedSampler as the HDF5 DataLoader's, so
// the two hand out the same rows for the same data, seed and epoch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "io/batch_source.h"
#include "io/sampler.h"

namespace lockstep::io {

struct TensorDatasetOptions {
  SamplerOptions sampler{};
  // Where batches are handed out; on CUDA their tensors are allocated and
  // copied on `stream` (default: the device's default stream, and waited for).
  core::Device device = core::Device::cpu();
  core::Stream stream{};
  // > 0: check at construction that every integer target lies in [0, num_classes).
  std::int64_t num_classes = 0;
  // The targets are probabilities, as binary cross-entropy (BCEWithLogitsLoss)
  // reads them: check at construction that every target lies in [0, 1].
  bool probability_targets = false;
};

class TensorDataset final : public BatchSource {
 public:
  // `inputs` and `targets` are host tensors with the same number of rows.
  // Integer targets (class indices) are handed out as i64: i32 and u8 ones
  // are widened here; float targets (f32, f16, bf16) are handed out as they
  // are. Tensors are kept (not copied, except widened targets): do not change
  // them while batches are being taken. Throws InvalidArgument naming the
  // argument at fault.
  TensorDataset(core::Tensor inputs, core::Tensor targets, TensorDatasetOptions options);
  // With further host tensors of the same rows, handed out by name in
  // Batch::named (integer ones widened to i64 as targets are; num_classes
  // and probability_targets check the targets only).
  TensorDataset(core::Tensor inputs, core::Tensor targets, core::NamedTensors named,
                TensorDatasetOptions options);

  std::optional<Batch> next() override;
  LoaderPosition position() const override;
  const DistributedSampler& sampler() const override { return sampler_; }
  std::int64_t size() const { return sampler_.dataset_size(); }

  // What ranks compare before training (comm::check_agreement): the rows'
  // count, shapes and dtypes (the named tensors' too), and a 64-bit FNV-1a digest of their bytes,
  // so ranks that made different data fail at the start.
  std::vector<std::pair<std::string, std::string>> agreement_fields() const;

 private:
  void do_start_epoch(std::int64_t epoch, std::int64_t position) override;
  // Rows `indices` of `all` as one host tensor [indices.size(), ...].
  static core::Tensor gather(const core::Tensor& all, const std::vector<std::int64_t>& indices);

  core::Tensor inputs_, labels_;
  core::NamedTensors named_;
  TensorDatasetOptions options_;
  DistributedSampler sampler_;
  std::int64_t epoch_ = 0;
  std::int64_t next_batch_ = -1;  // -1 before start_epoch
};

}  // namespace lockstep::io
