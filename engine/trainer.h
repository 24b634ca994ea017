// Trainer: the training loop's two calls over any batch source (the HDF5
// DataLoader, an in-memory TensorDataset): step() takes this rank's K
// micro-batches (with their named tensors, io::Batch::named) and runs one
// DataParallelStep (engine/data_parallel_step.h, where the step's protocol
// and its Notes live); evaluate() measures the step's loss
// (StepOptions::loss) and, where the loss has one, its accuracy over a whole
// evaluation set, every rank its share.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/world.h"
#include "engine/data_parallel_step.h"
#include "engine/nn/loss.h"
#include "engine/nn/module.h"
#include "io/batch_source.h"

namespace lockstep::engine {

struct EvalResult {
  // Means over the evaluation set's rows (padding not counted); for token
  // batches every position is a row (loss and accuracy per token).
  double loss = 0.0;
  // In [0, 1]; none for a loss without the metric (Loss::count_correct).
  std::optional<double> accuracy;
  std::int64_t samples = 0;
};

class Trainer {
 public:
  // Collective: builds the DataParallelStep over `world` (which checks that
  // every rank has the same settings and model).
  Trainer(Module& model, ParameterStore& store, Optimizer& optimizer, LrScheduler scheduler,
          LossScaler& scaler, comm::World& world, StepOptions options, core::Stream stream);

  // Takes K micro-batches from `source` and one optimizer step. nullopt when
  // the epoch has fewer than K micro-batches left (they are left unused).
  // StepResult::seconds counts the wait for the data too.
  // Note [rank-invariant batches]: with StepOptions::rank_invariant the
  // rank's K chunks are contiguous rows of the global batch (Note
  // [rank-invariant step]): the source gives them as one batch of K x B rows
  // (a sampler with micro_batch K x B hands rank r rows [r K B, (r + 1) K B)
  // of each global batch), which step() splits into K views of B rows.
  std::optional<StepResult> step(io::BatchSource& source);
  // Loss and accuracy over the source's whole epoch 0, every rank its share
  // (collective), with the step's loss object.
  EvalResult evaluate(io::BatchSource& source);

  std::int64_t steps() const { return step_.steps(); }
  // Continues a resumed run at `steps` (the checkpoint's step).
  void set_steps(std::int64_t steps) { step_.set_steps(steps); }
  const core::Stream& stream() const { return step_.stream(); }
  // The step it runs (RunCheckpoints saves and restores its count).
  DataParallelStep& data_parallel_step() { return step_; }

 private:
  static void split_chunks(const io::Batch& batch, int chunks,
                           std::vector<MicroBatch>& micro_batches);

  Module& model_;
  comm::World& world_;
  DataParallelStep step_;
};

}  // namespace lockstep::engine
