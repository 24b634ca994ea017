// DataParallelStep: one optimizer step of data-parallel training, written
// once for every caller (the Trainer, the benchmarks, a user's own loop),
// for any model and any loss (engine/nn/loss.h: the built-ins or the caller's).
// It takes this rank's K micro-batches of a global batch and runs them with
// autocast and loss scaling, averages the gradients over the ranks
// (comm::GradientSynchronizer, overlapped with backward), unscales, decides
// whether the step is finite, clips, applies the lr schedule, agrees with the
// other ranks on the loss and any stop request, and updates the parameters.
//
// Note [step protocol]: every rank runs, in this order, collectives included:
//   zero the gradients; sync.begin_step (rank 0's buffers to every rank);
//   K x { forward and loss (Module::forward_named, Loss::forward_named, for
//         every model: Note [several inputs and outputs]); backward, with
//         no_sync for the first K-1, each parameter reported to the
//         synchroniser as its gradient is complete; the root module's own
//         parameters reported last };
//   sync.finish (the gradients hold the mean over every rank's rows);
//   unscale (f16) and the sum of squares; the step's one read of the device
//   (Note [one read per step], engine/step_readback.h); comm::StepAgreement
//   (the loss, the rows, stop requests); the scaler's update, the global norm
//   or clipping, the schedule's lr; the skip decision (Note [non-finite
//   steps]); the optimizer's update.
// With StepOptions::sync.zero_stage 1 (ZeRO-1, docs/communication.md),
// finish leaves each rank the mean of its shard of the gradients; unscaling,
// the inf/NaN finding and the sum of squares are of the shard, summed over
// the ranks by the step agreement itself (Note [sharded step checks],
// engine/zero.h), then the scaler's update and clipping of the shard; the
// optimizer updates the shard, and sync.gather brings every rank's shard
// back. With zero_stage 2 (ZeRO-2) the same, but the gradients are the
// synchroniser's packed shard (Note [transient gradients],
// comm/gradient_synchronizer.h) and every micro-batch reduce-scatters. With
// zero_stage 3 (ZeRO-3) as 2, and the parameters sharded too: each unit is
// gathered around its forward and its backward (Note [parameter units],
// engine/zero3.h), the optimizer updates the packed shard, and nothing is
// gathered after the update.
// Everything that decides what happens next depends only on reduced
// or agreed values, so every rank decides alike with no further collective.
//
// Note [accumulation]: each micro-batch's loss gradient is scale / K, so K
// micro-batches of B rows give the update of one batch of K*B rows. Only the
// last micro-batch communicates (no_sync before it; under ZeRO-2 every one
// does, Note [transient gradients]). Dropout keys use the
// row's position in the step's global batch, (k * world + rank) * B + row,
// which is the same for any split of that batch (Note [dropout keys]).
//
// Note [mean in the loss gradient]: on host buffers the loss gradient is
// scale / (K * world size) and the synchroniser sums (average = false): the
// mean over ranks then costs nothing, where dividing after the allreduce is
// a pass over every gradient (a third of a 2.6 MB allreduce on 2 ranks). For
// a power-of-two world size the division is exact and the gradients are the
// same bits. GPU buffers keep the division after the sum (NCCL's ncclAvg
// fuses it), so that 16-bit backward passes see gradients world-size times
// larger, away from underflow.
//
// Note [non-finite steps]: a step whose global mean loss or allreduced
// gradients hold an inf or NaN is skipped in every precision: in f16 the loss
// scaler's check decides (and backs off), in fp32 and bf16 the global grad
// norm, computed anyway for clipping and the metrics, is not finite exactly
// when some gradient is not: squares of f32 values summed in f64 cannot
// overflow (at most 2^256 per element), so the sum of squares, the norm and
// the clip coefficient stay f64 up to the decision, never rounded to f32
// (where finite gradients of 1e20 would sum past FLT_MAX and read as inf;
// engine/optim/clip.h). Both look at allreduced gradients and the loss comes
// from the step agreement, so every rank takes the same decision with no
// extra collective; under ZeRO-1 a rank holds its shard's gradients only, and
// the shards' findings and sums of squares ride in the step agreement (Note
// [sharded step checks], engine/zero.h). After
// max_consecutive_skips skipped steps in a row, run() throws NumericalError naming the step and the
// first parameter, in backward order, whose gradient is not finite.
//
// Note [rank-invariant step]: with StepOptions::rank_invariant the global
// batch is C = K x world chunks of B rows, chunk j the rows [j B, (j + 1) B)
// of the global batch on any world size, and rank r's K micro-batches are
// chunks [r K, (r + 1) K) (the caller feeds them so; dropout keys use
// first_sample = j B). Every sum that decides the update is then taken in one
// order on any world size the chunk count supports (Note [invariant world
// sizes], comm/ordered_reduce.h; others are refused at construction):
//   - each chunk's forward and backward is the same computation (same rows,
//     same shapes, same keys; on CUDA the deterministic kernels, which the
//     step requires: kernels::set_deterministic, Note [deterministic gemm]);
//     its loss gradient is scale / C on every device (never a division after
//     the sum, Note [mean in the loss gradient]);
//   - the chunks' gradients combine in the tree of Note [chunk tree]
//     (comm::ChunkTree: zero, backward, add, per chunk; ceil(log2 K)
//     partial buffers the size of the flat gradients);
//   - the ranks' partial sums combine in the same tree (Note [ordered
//     synchronisation], comm/gradient_synchronizer.h), every rank ending with
//     every gradient, also under ZeRO-1;
//   - the inf/NaN check, the f16 scaler's decision, the norm and clipping
//     see the whole buffer in one order, on every rank alike, with or
//     without ZeRO-1 (the unsharded path);
//   - each chunk's loss x rows rides in the step agreement at its chunk's
//     slot of C f64 sums (exact: every other rank adds zero), and the loss
//     sum is their tree; row counts are integers.
//   - the model's buffers (BatchNorm's running statistics) move once per
//     step, by the mean over the chunks of each chunk's own move, in the
//     same tree (Note [chunk buffers], comm/chunk_buffers.h); each chunk
//     normalises with its own batch statistics.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "comm/agreement.h"
#include "comm/chunk_buffers.h"
#include "comm/gradient_synchronizer.h"
#include "comm/ordered_reduce.h"
#include "comm/step_agreement.h"
#include "comm/world.h"
#include "engine/core/trace.h"
#include "engine/nn/loss.h"
#include "engine/nn/module.h"
#include "engine/optim/loss_scaler.h"
#include "engine/optim/lr_scheduler.h"
#include "engine/optim/optimizer.h"
#include "engine/parameter_store.h"
#include "engine/step_graph.h"
#include "engine/step_readback.h"
#include "engine/zero3.h"

namespace lockstep::engine {

struct StepOptions {
  // The loss the model trains on (engine/nn/loss.h), shared with the caller,
  // who may also use it between steps (evaluation); null: CrossEntropyLoss().
  // Its describe() is among the settings every rank must share.
  std::shared_ptr<Loss> loss;
  int accumulation = 1;           // K micro-batches per optimizer step
  std::optional<DType> autocast;  // f16 or bf16
  double max_grad_norm = 0.0;     // clip to this global norm; 0: no clipping
  std::uint64_t seed = 0;         // dropout keys
  // Skipped steps in a row (Note [non-finite steps]) after which run()
  // throws; more than the 16 halvings that take the f16 scale from 2^16 to 1.
  int max_consecutive_skips = 20;
  // What else every rank must share (the program's configuration, the
  // dataset's agreement_fields(), the checkpoint_agreement_field()): checked
  // at construction with the step's own settings, in one collective.
  comm::NamedValues agreement;
  comm::SynchronizerOptions sync;
  // The same bits on any supported number of ranks (Note [rank-invariant
  // step]); off: the default step, unchanged. Sets sync.ordered.
  bool rank_invariant = false;
  // Replay the forward and backward passes as a CUDA graph once the shapes
  // repeat (Note [step graph], engine/step_graph.h): a GPU model, a step
  // stream made by core::Stream::create, no world or a world of one, no ZeRO,
  // not rank_invariant, no active Dropout. Off by default until it has been
  // measured on a GPU.
  bool cuda_graph = false;
};

struct StepResult {
  std::int64_t step = 0;  // optimizer steps taken, this one included
  double loss = 0.0;      // mean over the whole global batch, before the update
  double lr = 0.0;        // of group 0
  float loss_scale = 1.0f;
  double grad_norm = 0.0;          // after unscaling, before clipping; inf/NaN when skipped
  bool skipped = false;            // inf/NaN loss or gradients: no update (Note [non-finite steps])
  std::int64_t skipped_steps = 0;  // skipped by this step object so far, this one included
  bool stop = false;               // a rank was asked to stop (Note [stop requests])
  std::int64_t samples = 0;        // global samples in this step (target tokens for token batches)
  double seconds = 0.0;
  // This rank's time in the step's parts, the trace's spans (Note [step breakdown]).
  core::trace::Breakdown breakdown;
};

// One micro-batch of this rank, on the model's device: inputs [B, ...] and
// the targets the loss takes: class indices [B] i64 (or [B, T] for token
// batches) for cross-entropy, float targets of the output's shape for the
// elementwise losses, whatever the caller's own loss reads; and any other
// tensors of B rows the model or the loss reads by name (a second input, a
// second target, a mask: Note [several inputs and outputs]).
struct MicroBatch {
  core::Tensor inputs;
  core::Tensor targets;
  core::NamedTensors named{};
  // What the model and the loss see: "inputs", "targets" (when defined) and
  // the named ones; throws InvalidArgument when a named one reuses those names.
  core::NamedTensors tensors() const;
};

// The model as the GradientSynchronizer sees it: the store's flat buffers,
// its slots as gradient segments in ready order, the model's buffers.
comm::SynchronizedModel synchronized_model(Module& model, ParameterStore& store);

// Where the mean over ranks is taken (Note [mean in the loss gradient]): the
// number each rank divides its loss gradient by, and whether the
// synchroniser averages (the two always go together).
struct RankMean {
  int loss_gradient_divisor = 1;
  bool synchronizer_averages = true;
};
RankMean rank_mean(int world_size, core::Device device);

class DataParallelStep {
 public:
  // Over the ranks of `world`: collective. Checks that every rank has the
  // same settings and options.agreement (comm::check_agreement), then builds
  // the synchroniser, which checks that every rank built the same model and
  // copies rank 0's parameters and buffers to all.
  // With `world` null the step is this process's alone: no synchroniser and
  // no collective, the loss and the skip decision its own (a benchmark's
  // single-rank baseline, a reference in tests). The caller numbers steps in
  // the trace (core::trace::set_step) and opens the "step" span around its
  // data wait and run(); run() records the phases' spans.
  DataParallelStep(Module& model, ParameterStore& store, Optimizer& optimizer,
                   LrScheduler scheduler, LossScaler& scaler, comm::World* world,
                   StepOptions options, core::Stream stream);
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;

  // One optimizer step over this rank's `micro_batches` (StepOptions::
  // accumulation of them). Throws NumericalError after too many skipped steps
  // in a row, or when the f16 loss scale is at its floor (Note [non-finite steps]).
  StepResult run(std::span<const MicroBatch> micro_batches);

  // The forward context of micro-batch `micro_batch` of the next step, with
  // `rows` rows per rank (Note [accumulation]); no grad-ready hook.
  Context context(std::int64_t micro_batch, std::int64_t rows) const;

  // Steps taken, skipped ones included (the scheduler's and dropout's step;
  // the optimizer counts only the updates it made).
  std::int64_t steps() const { return steps_; }
  // Continues a resumed run at `steps` (the checkpoint's step).
  void set_steps(std::int64_t steps) { steps_ = steps; }
  const StepOptions& options() const { return options_; }
  // The loss the step trains on (StepOptions::loss, or the default).
  Loss& loss() { return *loss_; }
  const core::Stream& stream() const { return stream_; }
  // Throws InvalidArgument for a step without a world.
  comm::GradientSynchronizer& synchronizer();
  // What the CUDA graph step did so far (Note [step graph]); null when
  // StepOptions::cuda_graph is off.
  const StepGraphCounts* graph_counts() const { return graph_ ? &graph_->counts() : nullptr; }

  // While one lives, every parameter's value is whole on every rank (ZeRO-3
  // keeps only shards between steps: FSDP's summon_full_params); opening and
  // closing it are collectives. With `write_back` what the caller writes into
  // the values (a checkpoint's restore) reaches the shards at the close.
  // Under the other stages the values are always whole, and it does nothing.
  class FullParameters {
   public:
    FullParameters(ParameterGathers* gathers, bool write_back);
    ~FullParameters();
    FullParameters(const FullParameters&) = delete;
    FullParameters& operator=(const FullParameters&) = delete;

   private:
    ParameterGathers* gathers_;
    bool write_back_;
  };
  [[nodiscard]] FullParameters full_parameters(bool write_back = false) const {
    return FullParameters(gathers_.get(), write_back);
  }

 private:
  comm::NamedValues agreement_fields() const;
  // Everything before the update (Note [step protocol], up to sync.finish):
  // eager, or recorded into the step's CUDA graph (Note [step graph]).
  void forward_backward(std::span<const MicroBatch> micro_batches, float dloss, bool capturing);
  // Throws InvalidArgument when StepOptions::cuda_graph cannot hold.
  void check_graph_options() const;
  // Unscale, the inf decision, clipping or the norm, the schedule, the step
  // agreement and the optimizer (Note [step protocol], from sync.finish on).
  void update(StepResult& r);
  // ZeRO-1 and ZeRO-2 (StepOptions::sync.zero_stage 1, 2): each rank updates its shard.
  bool sharded() const { return sync_ && sync_->sharded(); }
  // The gradients the sharded checks read: the flat buffer (ZeRO-1) or the
  // packed shard (ZeRO-2, Note [transient gradients]).
  core::Tensor& shard_grads() {
    return sync_->transient_gradients() ? sync_->shard_gradients() : store_.grads();
  }
  // The buffer measured_'s ranges are of: the shard's under ZeRO-1 and ZeRO-2
  // (without the rank-invariant tree), the whole flat buffer otherwise.
  core::Tensor& measured_grads() { return sharded() && !tree_ ? shard_grads() : store_.grads(); }
  // Note [non-finite steps]: the error after the last allowed skip.
  [[noreturn]] void throw_nonfinite(std::int64_t step, double mean_loss);

  Module& model_;
  ParameterStore& store_;
  Optimizer& optimizer_;
  LrScheduler scheduler_;
  LossScaler& scaler_;
  comm::World* world_;
  StepOptions options_;
  core::Stream stream_;
  std::unique_ptr<comm::GradientSynchronizer> sync_;  // null without a world
  std::unique_ptr<ParameterGathers> gathers_;         // ZeRO-3 only
  std::vector<comm::FlatRange> owned_;  // ZeRO-1: this rank's shard (ZeRO-2: in shard_grads())
  std::unique_ptr<comm::StepAgreement> agreement_;  // null without a world
  std::shared_ptr<Loss> loss_;
  // The ranges whose unscale and sum of squares the step measures: the whole
  // gradient buffer, or this rank's ZeRO-1 shard (Note [sharded step checks]).
  std::vector<comm::FlatRange> measured_;
  // The step's device values, read once (Note [one read per step]): the loss
  // x counted rows and the rows summed over the micro-batches, the scaler's
  // flag, the sums of squares, the chunk losses; and one micro-batch's loss x rows.
  std::unique_ptr<StepReadback> readback_;
  core::Tensor weighted_loss_;
  int loss_gradient_divisor_ = 1;  // RankMean's
  // Note [rank-invariant step]: the chunks' tree, and the buffers'; the
  // agreement's C per-chunk sums (each chunk's loss x rows is in readback_).
  std::unique_ptr<comm::ChunkTree> tree_;
  std::unique_ptr<comm::ChunkBuffers> chunk_buffers_;  // null for a model without buffers
  std::vector<double> chunk_sums_;
  std::int64_t steps_ = 0;
  std::int64_t skipped_steps_ = 0, consecutive_skips_ = 0;
  std::unique_ptr<StepGraph> graph_;               // StepOptions::cuda_graph
  std::optional<IndexChecks> graph_index_checks_;  // the lookups its capture registered
  bool eager_since_capture_ = false;               // readback_ holds another step's lookups
};

}  // namespace lockstep::engine
