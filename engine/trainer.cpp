// Trainer (engine/trainer.h).
#include "engine/trainer.h"

#include <chrono>
#include <vector>

#include "engine/core/trace.h"

namespace lockstep::engine {

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
  for (int k = 0; k < step_.options().accumulation; ++k) {
    core::trace::Span wait("data wait", core::trace::Part::data);
    std::optional<io::Batch> b = source.next();
    if (!b) return std::nullopt;
    micro_batches.push_back({b->inputs, b->labels});
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
  model_.eval();
  source.start_epoch(0);
  // loss * rows, correct rows, rows, samples; a token batch counts each
  // position as a row (language models: loss and accuracy per token).
  double sums[4] = {0, 0, 0, 0};
  Context ctx = step_.context(0, 0);
  auto real_rows = [](const core::Tensor& t, std::int64_t valid) {
    core::Shape s = t.shape();
    s[0] = valid;
    return t.view(0, s);
  };
  while (std::optional<io::Batch> batch = source.next()) {
    if (batch->valid == 0) continue;
    // Rows [0, valid) are real; the rest is padding (Note [padding], io/sampler.h).
    const core::Tensor inputs = real_rows(batch->inputs, batch->valid);
    const core::Tensor labels = real_rows(batch->labels, batch->valid);
    const core::Tensor logits = model_.forward(inputs, ctx);
    const double mean = loss_.forward(logits, labels, ctx).to_vector<float>(stream)[0];
    sums[0] += mean * static_cast<double>(labels.numel());
    sums[1] += count_correct(logits, labels, stream).to_vector<float>(stream)[0];
    sums[2] += static_cast<double>(labels.numel());
    sums[3] += static_cast<double>(batch->valid);
  }
  model_.train();
  core::Tensor totals =
      core::Tensor::from_vector<float>({static_cast<float>(sums[0]), static_cast<float>(sums[1]),
                                        static_cast<float>(sums[2]), static_cast<float>(sums[3])},
                                       {4}, DType::f32);
  world_.host().allreduce(totals, comm::ReduceOp::sum);
  const auto t = totals.to_vector<float>();
  EvalResult r;
  r.samples = static_cast<std::int64_t>(t[3]);
  r.loss = t[2] > 0 ? t[0] / t[2] : 0.0;
  r.accuracy = t[2] > 0 ? t[1] / t[2] : 0.0;
  return r;
}

}  // namespace lockstep::engine
