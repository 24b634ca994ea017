// Trainer (engine/trainer.h).
#include "engine/trainer.h"

#include <fmt/core.h>

#include <chrono>
#include <vector>

#include "engine/core/memory.h"
#include "engine/core/trace.h"

namespace lockstep::engine {
namespace {

// Rows [k R / K, (k + 1) R / K) of a [R, ...] tensor.
core::Tensor chunk_rows(const core::Tensor& t, int k, int chunks) {
  core::Shape shape = t.shape();
  shape[0] /= chunks;
  return t.view(k * (t.numel() / chunks), shape);
}

}  // namespace

// Note [rank-invariant batches]: the rank's K chunks, one batch of K x B
// rows, split into K views of B rows.
void Trainer::split_chunks(const io::Batch& batch, int chunks,
                           std::vector<MicroBatch>& micro_batches) {
  const std::int64_t rows = batch.inputs.dim(0);
  if (rows % chunks != 0 || batch.valid != rows)
    throw InvalidArgument(fmt::format(
        "Trainer (rank_invariant): a batch of {} rows ({} real) cannot be {} chunks of equal "
        "rows: the source must give K x B real rows per step (drop_last, micro_batch K x B)",
        rows, batch.valid, chunks));
  for (int k = 0; k < chunks; ++k) {
    MicroBatch m{chunk_rows(batch.inputs, k, chunks), chunk_rows(batch.labels, k, chunks)};
    for (const auto& [name, tensor] : batch.named) m.named.set(name, chunk_rows(tensor, k, chunks));
    micro_batches.push_back(std::move(m));
  }
}

Trainer::Trainer(Module& model, ParameterStore& store, Optimizer& optimizer, LrScheduler scheduler,
                 LossScaler& scaler, comm::World& world, StepOptions options, core::Stream stream)
    : model_(model),
      world_(world),
      step_(model, store, optimizer, std::move(scheduler), scaler, &world, std::move(options),
            std::move(stream)) {}

std::optional<StepResult> Trainer::step(io::BatchSource& source) {
  const auto start = std::chrono::steady_clock::now();
  core::trace::set_step(step_.steps() + 1);
  core::trace::reset_breakdown();  // Note [step breakdown]
  core::trace::Span step_span("step", "step");
  // The io::Batch objects are kept until the step ends: a CPU loader's
  // buffers return to its pool only when nothing refers to them.
  std::vector<io::Batch> batches;
  std::vector<MicroBatch> micro_batches;
  const int k_total = step_.options().accumulation;
  const bool invariant = step_.options().rank_invariant;
  for (int k = 0; k < (invariant ? 1 : k_total); ++k) {
    core::trace::Span wait("data wait", core::trace::Part::data);
    std::optional<io::Batch> b = source.next();
    if (!b) return std::nullopt;
    if (invariant)
      split_chunks(*b, k_total, micro_batches);
    else
      micro_batches.push_back({b->inputs, b->labels, b->named});
    batches.push_back(std::move(*b));
  }
  StepResult r = step_.run(micro_batches);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.breakdown = core::trace::breakdown();
  return r;
}

EvalResult Trainer::evaluate(io::BatchSource& source) {
  core::trace::Span span("evaluate", "eval");
  const core::Stream& stream = step_.stream();
  Loss& loss = step_.loss();
  const DataParallelStep::FullParameters full = step_.full_parameters();  // ZeRO-3: whole values
  model_.eval();
  // Note [memory kinds]: an evaluation's forward is activations as a step's is,
  // so that a peak reached while evaluating is split as one reached training.
  core::MemoryKindScope kind(core::MemoryKind::activations);
  source.start_epoch(0);
  // loss x counted rows, correct rows, counted rows, samples, and whether the
  // loss has the accuracy metric (Note [loss rows]: a token batch counts each
  // position as a row).
  double sums[5] = {0, 0, 0, 0, 1};
  Context ctx = step_.context(0, 0);
  auto real_rows = [](const core::Tensor& t, std::int64_t valid) {
    core::Shape s = t.shape();
    s[0] = valid;
    return t.view(0, s);
  };
  while (std::optional<io::Batch> batch = source.next()) {
    if (batch->valid == 0) continue;
    // Rows [0, valid) are real; the rest is padding (Note [padding], io/sampler.h).
    MicroBatch real{real_rows(batch->inputs, batch->valid), real_rows(batch->labels, batch->valid)};
    for (const auto& [name, tensor] : batch->named)
      real.named.set(name, real_rows(tensor, batch->valid));
    const core::NamedTensors tensors = real.tensors();
    const core::NamedTensors outputs = model_.forward_named(tensors, ctx);
    const double mean = loss.forward_named(outputs, tensors, ctx).to_vector<float>(stream)[0];
    const double rows = loss.counted_rows().to_vector<float>(stream)[0];
    sums[0] += mean * rows;
    sums[2] += rows;
    sums[3] += static_cast<double>(batch->valid);
    const core::Tensor correct = loss.count_correct_named(outputs, tensors, stream);
    if (correct.defined())
      sums[1] += correct.to_vector<float>(stream)[0];
    else
      sums[4] = 0;
  }
  model_.train();
  std::vector<float> local(std::begin(sums), std::end(sums));
  core::Tensor totals = core::Tensor::from_vector<float>(local, {5}, DType::f32);
  world_.host().allreduce(totals, comm::ReduceOp::sum);
  const auto t = totals.to_vector<float>();
  EvalResult r;
  r.samples = static_cast<std::int64_t>(t[3]);
  r.loss = t[2] > 0 ? t[0] / t[2] : 0.0;
  // Every rank's loss is the same object type (the step's agreement), so
  // either all have the metric or none.
  if (t[4] == static_cast<float>(world_.size())) r.accuracy = t[2] > 0 ? t[1] / t[2] : 0.0;
  return r;
}

}  // namespace lockstep::engine
