// Trainer (engine/trainer.h).
#include "engine/trainer.h"

#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "comm/step_agreement.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "engine/optim/clip.h"

namespace lockstep::engine {

comm::SynchronizedModel synchronized_model(Module& model, ParameterStore& store) {
  comm::SynchronizedModel m;
  m.parameters = store.values();
  m.gradients = store.grads();
  for (const ParameterStore::Slot& s : store.slots())
    m.segments.push_back({s.parameter->name, s.offset, s.numel, s.parameter->value.shape()});
  for (Buffer* b : model.buffers()) m.buffers.push_back({b->name, b->value});
  return m;
}

RankMean rank_mean(const comm::World& world, core::Device device) {
  if (device.is_cuda()) return {1, true};
  return {world.size(), false};
}

Trainer::Trainer(Module& model, ParameterStore& store, Optimizer& optimizer, LrScheduler scheduler,
                 LossScaler& scaler, comm::World& world, TrainerOptions options,
                 core::Stream stream)
    : model_(model),
      store_(store),
      optimizer_(optimizer),
      scheduler_(std::move(scheduler)),
      scaler_(scaler),
      world_(world),
      options_(std::move(options)),
      stream_(std::move(stream)) {
  if (options_.accumulation < 1)
    throw InvalidArgument("Trainer: TrainerOptions::accumulation is " +
                          std::to_string(options_.accumulation) + "; it must be at least 1");
  if (options_.max_consecutive_skips < 1)
    throw InvalidArgument("TrainerOptions::max_consecutive_skips must be at least 1, got " +
                          std::to_string(options_.max_consecutive_skips));
  comm::check_agreement(world_.host(), agreement_fields());
  options_.sync.compute_stream = stream_;
  const RankMean mean = rank_mean(world_, store_.device());
  options_.sync.average = mean.synchronizer_averages;
  loss_gradient_divisor_ = mean.loss_gradient_divisor;
  sync_ = std::make_unique<comm::GradientSynchronizer>(
      world_.for_device(store_.device()), synchronized_model(model_, store_), options_.sync);
  step_totals_ = core::Tensor::empty({2}, DType::f32, store_.device(), stream_);
  weighted_loss_ = core::Tensor::empty({1}, DType::f32, store_.device(), stream_);
  model_.train();
}

comm::NamedValues Trainer::agreement_fields() const {
  const ScheduleOptions& s = scheduler_.options();
  const LossScalerOptions& l = scaler_.options();
  // The caller's fields first: they are in the words of its configuration.
  comm::NamedValues fields = options_.agreement;
  const comm::NamedValues own{
      {"trainer.accumulation", std::to_string(options_.accumulation)},
      {"trainer.autocast", options_.autocast ? dtype_name(*options_.autocast) : "off"},
      {"trainer.max_grad_norm", fmt::format("{}", options_.max_grad_norm)},
      {"trainer.seed", std::to_string(options_.seed)},
      {"trainer.max_consecutive_skips", std::to_string(options_.max_consecutive_skips)},
      {"trainer.schedule",
       fmt::format("{} warmup_steps={} total_steps={} step_size={} milestones=[{}] gamma={} "
                   "eta_min={}",
                   kind_name(scheduler_.kind()), s.warmup_steps, s.total_steps, s.step_size,
                   fmt::join(s.milestones, ","), s.gamma, s.eta_min)},
      {"trainer.loss_scaler", l.enabled
                                  ? fmt::format("init_scale={} growth_factor={} backoff_factor={} "
                                                "growth_interval={} min_scale={}",
                                                l.init_scale, l.growth_factor, l.backoff_factor,
                                                l.growth_interval, l.min_scale)
                                  : "off"},
      {"trainer.optimizer",
       fmt::format("{}, {} groups", optimizer_.type_name(), optimizer_.group_count())}};
  fields.insert(fields.end(), own.begin(), own.end());
  for (std::size_t g = 0; g < optimizer_.group_count(); ++g)
    fields.emplace_back(
        fmt::format("trainer.optimizer.group[{}]", g),
        fmt::format("lr={} weight_decay={}", optimizer_.initial_lr(g), optimizer_.weight_decay(g)));
  return fields;
}

Context Trainer::make_context(std::int64_t micro_batch, std::int64_t rows) {
  Context ctx;
  ctx.stream = stream_;
  ctx.autocast = options_.autocast;
  ctx.seed = options_.seed;
  ctx.step = static_cast<std::uint64_t>(steps_);
  ctx.first_sample = (micro_batch * world_.size() + world_.rank()) * rows;
  return ctx;
}

std::optional<StepResult> Trainer::step(io::DataLoader& loader) {
  const auto start = std::chrono::steady_clock::now();
  core::trace::set_step(steps_ + 1);
  core::trace::reset_breakdown();  // Note [step breakdown]
  core::trace::Span step_span("step", "step");
  const int k_total = options_.accumulation;
  std::vector<io::Batch> batches;
  for (int k = 0; k < k_total; ++k) {
    core::trace::Span wait("data wait", core::trace::Part::data);
    std::optional<io::Batch> b = loader.next();
    if (!b) return std::nullopt;
    batches.push_back(std::move(*b));
  }
  store_.zero_grad(stream_);
  sync_->begin_step(steps_);
  const float dloss = scaler_.scale() / static_cast<float>(k_total * loss_gradient_divisor_);
  step_totals_.fill_(0.0, stream_);
  core::Tensor loss_total = step_totals_.view(0, {1}), rows_total = step_totals_.view(1, {1});
  for (int k = 0; k < k_total; ++k) {
    std::optional<comm::GradientSynchronizer::NoSync> quiet;
    if (k + 1 < k_total) quiet.emplace(sync_->no_sync());
    const io::Batch& batch = batches[k];
    Context ctx = make_context(k, batch.inputs.dim(0));
    ctx.on_grad_ready = [this](Parameter& p) { sync_->mark_ready(store_.index_of(p)); };
    {
      core::trace::Span forward("forward", core::trace::Part::compute);
      const core::Tensor logits = model_.forward(batch.inputs, ctx);
      const core::Tensor loss = loss_.forward(logits, batch.labels, ctx);
      core::ops::mul(loss, loss_.counted_rows(), weighted_loss_, stream_);
      core::ops::add(loss_total, weighted_loss_, loss_total, stream_);
      core::ops::add(rows_total, loss_.counted_rows(), rows_total, stream_);
    }
    core::trace::Span backward("backward", core::trace::Part::compute);
    model_.backward(loss_.backward(dloss, ctx), ctx);
    model_.report_ready(ctx);
  }
  {
    core::trace::Span wait("gradient sync wait", core::trace::Part::comm);
    sync_->finish();
  }

  // Note [non-finite steps]: the scaler's flag (f16; the step's host
  // synchronisation) or the norm (fp32, bf16) says whether every gradient is
  // finite; the agreement gives the global loss; then the decision.
  StepResult r;
  {
    core::trace::Span unscale("unscale and clip", core::trace::Part::optimizer);
    scaler_.unscale(store_.grads(), stream_);
    r.loss_scale = scaler_.scale();
    bool scaler_clean = true;
    try {
      scaler_clean = scaler_.update(stream_);
    } catch (const NumericalError& e) {
      throw NumericalError(fmt::format("step {}: {}", steps_ + 1, e.what()));
    }
    r.grad_norm = !scaler_clean ? NAN
                  : options_.max_grad_norm > 0
                      ? clip_grad_norm(store_.grads(), options_.max_grad_norm, stream_)
                      : grad_norm(store_.grads(), stream_);
    scheduler_.apply(optimizer_, steps_);
    r.lr = optimizer_.lr(0);
  }
  const auto local = step_totals_.to_vector<float>(stream_);  // waits for the device
  comm::StepTotals totals;
  {
    core::trace::Span agreement("agreement", core::trace::Part::comm);
    totals = comm::agree_on_step(world_.host(), local[0], static_cast<std::int64_t>(local[1]));
  }
  r.skipped = !std::isfinite(r.grad_norm) || !std::isfinite(totals.loss_sum);
  if (!r.skipped) {
    core::trace::Span optimizer("optimizer", core::trace::Part::optimizer);
    optimizer_.step(stream_);
  }

  r.step = ++steps_;
  r.loss = totals.mean_loss();
  r.samples = totals.samples;
  r.stop = totals.stop;
  skipped_steps_ += r.skipped ? 1 : 0;
  consecutive_skips_ = r.skipped ? consecutive_skips_ + 1 : 0;
  r.skipped_steps = skipped_steps_;
  if (consecutive_skips_ >= options_.max_consecutive_skips) throw_nonfinite(r.step, r.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.breakdown = core::trace::breakdown();
  return r;
}

void Trainer::throw_nonfinite(std::int64_t step, double mean_loss) {
  // The gradients are the allreduced ones, the same on every rank, so every
  // rank names the same parameter.
  const std::vector<float> g = store_.grads().to_vector<float>(stream_);
  std::string culprit = "every gradient is finite";
  for (const ParameterStore::Slot& s : store_.slots()) {
    const auto first = static_cast<std::size_t>(s.offset);
    const auto end = first + static_cast<std::size_t>(s.numel);
    std::size_t i = first;
    while (i < end && std::isfinite(g[i])) ++i;
    if (i < end) {
      culprit = fmt::format(
          "the first parameter, in backward order, whose gradient is not finite is '{}' "
          "(element {} is {})",
          s.parameter->name, i - first, g[i]);
      break;
    }
  }
  throw NumericalError(fmt::format(
      "step {}: {} steps in a row were skipped for a non-finite loss or gradient "
      "(max_consecutive_skips {}); {}; the mean loss is {}. Lower the learning rate, clip the "
      "gradients, check the data, or resume from an earlier checkpoint",
      step, consecutive_skips_, options_.max_consecutive_skips, culprit, mean_loss));
}

EvalResult Trainer::evaluate(io::DataLoader& loader) {
  core::trace::Span span("evaluate", "eval");
  model_.eval();
  loader.start_epoch(0);
  // loss * rows, correct rows, rows, samples; a token batch counts each
  // position as a row (language models: loss and accuracy per token).
  double sums[4] = {0, 0, 0, 0};
  Context ctx = make_context(0, 0);
  auto real_rows = [](const core::Tensor& t, std::int64_t valid) {
    core::Shape s = t.shape();
    s[0] = valid;
    return t.view(0, s);
  };
  while (std::optional<io::Batch> batch = loader.next()) {
    if (batch->valid == 0) continue;
    // Rows [0, valid) are real; the rest is padding (Note [padding], io/sampler.h).
    const core::Tensor inputs = real_rows(batch->inputs, batch->valid);
    const core::Tensor labels = real_rows(batch->labels, batch->valid);
    const core::Tensor logits = model_.forward(inputs, ctx);
    const double mean = loss_.forward(logits, labels, ctx).to_vector<float>(stream_)[0];
    sums[0] += mean * static_cast<double>(labels.numel());
    sums[1] += count_correct(logits, labels, stream_).to_vector<float>(stream_)[0];
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
