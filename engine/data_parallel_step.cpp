// DataParallelStep (engine/data_parallel_step.h): Note [step protocol].
#include "engine/data_parallel_step.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "comm/step_agreement.h"
#include "comm/world.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "engine/optim/clip.h"
#include "engine/zero.h"
#include "kernels/conv.h"
#include "kernels/gemm.h"

namespace lockstep::engine {
namespace {

// `decide()`, with its NumericalError (the loss scale at its floor) naming the step.
template <typename Decide>
double with_step(std::int64_t step, Decide&& decide) {
  try {
    return decide();
  } catch (const NumericalError& e) {
    throw NumericalError(fmt::format("step {}: {}", step, e.what()));
  }
}

}  // namespace

comm::SynchronizedModel synchronized_model(Module& model, ParameterStore& store) {
  comm::SynchronizedModel m;
  m.parameters = store.values();
  if (store.flat_gradients())
    m.gradients = store.grads();  // ZeRO-2: none (Note [transient gradients])
  for (const ParameterStore::Slot& s : store.slots())
    m.segments.push_back({s.parameter->name, s.offset, s.numel, s.shape});
  for (Buffer* b : model.buffers()) m.buffers.push_back({b->name, b->value});
  for (const ParameterStore::Piece& piece : store.pieces())  // Note [parameter units]
    if (piece.range.offset > 0) m.cuts.push_back(piece.range.offset);
  return m;
}

core::NamedTensors MicroBatch::tensors() const {
  core::NamedTensors all{{"inputs", inputs}};
  if (targets.defined()) all.set("targets", targets);
  for (const auto& [name, tensor] : named) {
    if (all.contains(name))
      throw InvalidArgument("MicroBatch: a named tensor is called '" + name +
                            "', the name of the batch's own inputs or targets (rename it)");
    all.set(name, tensor);
  }
  return all;
}

RankMean rank_mean(int world_size, core::Device device) {
  if (device.is_cuda()) return {1, true};
  return {world_size, false};
}

DataParallelStep::DataParallelStep(Module& model, ParameterStore& store, Optimizer& optimizer,
                                   LrScheduler scheduler, LossScaler& scaler, comm::World* world,
                                   StepOptions options, core::Stream stream)
    : model_(model),
      store_(store),
      optimizer_(optimizer),
      scheduler_(std::move(scheduler)),
      scaler_(scaler),
      world_(world),
      options_(std::move(options)),
      stream_(std::move(stream)),
      loss_(options_.loss ? options_.loss : std::make_shared<CrossEntropyLoss>()) {
  // The step's inputs are data: nothing reads their gradient, so the first
  // layer skips computing it (no call for the user to copy).
  model_.set_input_grad(false);
  if (options_.accumulation < 1)
    throw InvalidArgument("DataParallelStep: StepOptions::accumulation is " +
                          std::to_string(options_.accumulation) + "; it must be at least 1");
  if (options_.max_consecutive_skips < 1)
    throw InvalidArgument("StepOptions::max_consecutive_skips must be at least 1, got " +
                          std::to_string(options_.max_consecutive_skips));
  if (options_.sync.zero_stage < 0 || options_.sync.zero_stage > 3)
    throw InvalidArgument("DataParallelStep: StepOptions::sync.zero_stage is " +
                          std::to_string(options_.sync.zero_stage) +
                          "; use 0 (plain data parallelism), 1 (ZeRO-1: optimizer state "
                          "sharded over the ranks), 2 (ZeRO-2: and the gradients) or 3 (ZeRO-3: "
                          "and the parameters)");
  if (options_.sync.zero_stage != 0 && !world_)
    throw InvalidArgument("DataParallelStep: StepOptions::sync.zero_stage " +
                          std::to_string(options_.sync.zero_stage) +
                          " shards over a world's ranks; a step without a world has none (use "
                          "zero_stage 0)");
  if (options_.sync.zero_stage >= 2 && options_.rank_invariant)
    throw InvalidArgument(fmt::format(
        "DataParallelStep: StepOptions::rank_invariant sums every gradient in one tree order, "
        "which needs the whole gradient buffer; ZeRO-{} keeps only each rank's shard (use "
        "zero_stage 1 with it)",
        options_.sync.zero_stage));
  // Note [parameter units]: without a unit there is nothing to gather.
  if (options_.sync.zero_stage == 3 && world_ && store_.pieces().empty() &&
      default_units(model_).empty())
    throw InvalidArgument(fmt::format(
        "DataParallelStep: ZeRO-3 (StepOptions::sync.zero_stage 3) gathers the parameters unit "
        "by unit, by default the children with parameters of the model's outermost Sequential "
        "(Note [parameter units], engine/zero3.h), and {} has none: its tree holds no Sequential, "
        "or that Sequential has no child with trainable parameters. Put its layers in a "
        "Sequential, lay the ParameterStore out with units of your own (ParameterUnits), or use "
        "zero_stage 2 (the gradients and optimizer state sharded, the parameters whole)",
        model_.describe()));
  if (options_.sync.zero_stage == 3 && world_ &&
      (store_.pieces().empty() || store_.units().ranks != world_->size()))
    throw InvalidArgument(fmt::format(
        "DataParallelStep: StepOptions::sync.zero_stage 3 needs the ParameterStore laid out in "
        "units for this world of {} ranks (it is laid out {}); build it with "
        "ParameterStore::Units{{default_units(model), world.size()}} (Note [parameter units], "
        "engine/zero3.h)",
        world_->size(),
        store_.pieces().empty() ? std::string("without units")
                                : fmt::format("for {} ranks", store_.units().ranks)));
  const int world_size = world_ ? world_->size() : 1;
  const std::int64_t chunks = std::int64_t{options_.accumulation} * world_size;
  if (options_.rank_invariant) {
    if (!comm::invariant_world_size(chunks, world_size))
      throw InvalidArgument(fmt::format(
          "DataParallelStep: StepOptions::rank_invariant with accumulation {} on {} ranks ({} "
          "chunks): a rank's chunks must be a power of two in number for its partial sum to be a "
          "node of the tree over all chunks (Note [invariant world sizes], comm/ordered_reduce.h). "
          "{} chunks give the same bits on {} ranks: run on one of those, with accumulation {} / "
          "ranks",
          options_.accumulation, world_size, chunks, chunks,
          comm::world_sizes_text(comm::invariant_world_sizes(chunks)), chunks));
    if (store_.device().is_cuda() && !kernels::deterministic())
      throw InvalidArgument(
          "DataParallelStep: StepOptions::rank_invariant on CUDA needs the deterministic kernels "
          "(cuDNN's deterministic algorithms, cuBLASLt without split-K reduction passes: Note "
          "[deterministic gemm]); call kernels::set_deterministic(true) (lockstep-train's "
          "--rank-invariant does) before building the step");
    options_.sync.ordered = true;
  }
  if (world_) {
    comm::check_agreement(world_->host(), agreement_fields());
    options_.sync.compute_stream = stream_;
    // A world of one has nothing to overlap: a communication thread would
    // only cost wake-ups (Note [host overlap]). Otherwise, unless the caller
    // chose, the thread runs where this rank has a core the GEMMs leave free.
    if (world_->size() == 1)
      options_.sync.host_overlap = false;
    else if (!options_.sync.host_overlap)
      options_.sync.host_overlap = comm::host_overlap_pays(*world_, kernels::cpu::gemm_threads());
    const RankMean mean = options_.rank_invariant ? RankMean{world_size, false}
                                                  : rank_mean(world_->size(), store_.device());
    options_.sync.average = mean.synchronizer_averages;
    loss_gradient_divisor_ = mean.loss_gradient_divisor;
    core::MemoryKindScope kind(core::MemoryKind::communication);  // Note [memory kinds]
    sync_ = std::make_unique<comm::GradientSynchronizer>(
        world_->for_device(store_.device()), synchronized_model(model_, store_), options_.sync);
    if (sync_->transient_gradients()) {  // Note [transient gradients]
      store_.use_gradient_groups(sync_->gradient_groups());
      sync_->set_gradient_groups(store_);
      if (sync_->sharded_parameters()) {  // Note [parameter units]
        store_.shard_values(sync_->shard_layout(), stream_);
        gathers_ = std::make_unique<ParameterGathers>(store_, *sync_,
                                                      world_->for_device(store_.device()), stream_);
      }
      optimizer_.shard(world_->for_device(store_.device()), sync_->shard_layout(), stream_,
                       sync_->shard_gradients());
      owned_ = sync_->shard_layout().owned_packed();
    } else if (sync_->sharded()) {
      optimizer_.shard(world_->for_device(store_.device()), sync_->shard_layout(), stream_);
      owned_ = sync_->shard_layout().owned();
    }
    const std::size_t sums = options_.rank_invariant ? static_cast<std::size_t>(chunks)
                             : sync_->sharded()      ? GradientPayload().size()
                                                     : 0;
    agreement_ = std::make_unique<comm::StepAgreement>(world_->host(), sums);
  }
  if (options_.rank_invariant) {
    tree_ = std::make_unique<comm::ChunkTree>(store_.grads(), options_.accumulation, stream_);
    std::vector<comm::NamedBuffer> buffers;
    for (Buffer* b : model_.buffers()) buffers.push_back({b->name, b->value});
    if (!buffers.empty())  // Note [chunk buffers]
      chunk_buffers_ = std::make_unique<comm::ChunkBuffers>(
          std::move(buffers), options_.accumulation,
          world_ ? &world_->for_device(store_.device()) : nullptr, stream_);
    chunk_sums_.assign(static_cast<std::size_t>(chunks), 0.0);
  }
  core::trace::set_stream_name(stream_, "cuda compute stream");
  measured_ =
      sharded() && !tree_ ? owned_ : std::vector<comm::FlatRange>{{0, store_.grads().numel()}};
  if (options_.cuda_graph) {
    check_graph_options();
    graph_ = std::make_unique<StepGraph>(store_.device(), stream_);
  }
  readback_ =
      std::make_unique<StepReadback>(static_cast<std::int64_t>(measured_.size()),
                                     tree_ ? options_.accumulation : 0, store_.device(), stream_);
  weighted_loss_ = core::Tensor::empty({1}, DType::f32, store_.device(), stream_);
  model_.train();
}

void DataParallelStep::check_graph_options() const {
  const auto refuse = [](const std::string& why) {
    throw InvalidArgument("StepOptions::cuda_graph: " + why +
                          " (Note [step graph]); turn cuda_graph off for this run");
  };
  if (!store_.device().is_cuda())
    refuse("the model is on " + store_.device().str() + "; CUDA graphs need a GPU");
  if (world_ && world_->size() > 1)
    refuse(
        fmt::format("the world has {} ranks; capturing the bucket allreduces of several ranks "
                    "is not built, only a world of one",
                    world_->size()));
  if (options_.sync.zero_stage != 0)
    refuse(fmt::format("ZeRO stage {} gathers and shards on the host within the passes",
                       options_.sync.zero_stage));
  if (options_.rank_invariant)
    refuse("the rank-invariant step sums its chunks in a host-driven tree");
}

comm::NamedValues DataParallelStep::agreement_fields() const {
  const ScheduleOptions& s = scheduler_.options();
  const LossScalerOptions& l = scaler_.options();
  // The caller's fields first: they are in the words of its configuration.
  comm::NamedValues fields = options_.agreement;
  const comm::NamedValues own{
      {"step.loss", loss_->describe()},
      {"step.accumulation", std::to_string(options_.accumulation)},
      {"step.autocast", options_.autocast ? dtype_name(*options_.autocast) : "off"},
      {"step.max_grad_norm", fmt::format("{}", options_.max_grad_norm)},
      {"step.seed", std::to_string(options_.seed)},
      {"step.max_consecutive_skips", std::to_string(options_.max_consecutive_skips)},
      {"step.zero_stage", std::to_string(options_.sync.zero_stage)},
      {"step.rank_invariant", options_.rank_invariant ? "on" : "off"},
      {"step.schedule",
       fmt::format("{} warmup_steps={} total_steps={} step_size={} milestones=[{}] gamma={} "
                   "eta_min={}",
                   kind_name(scheduler_.kind()), s.warmup_steps, s.total_steps, s.step_size,
                   fmt::join(s.milestones, ","), s.gamma, s.eta_min)},
      {"step.loss_scaler", l.enabled
                               ? fmt::format("init_scale={} growth_factor={} backoff_factor={} "
                                             "growth_interval={} min_scale={}",
                                             l.init_scale, l.growth_factor, l.backoff_factor,
                                             l.growth_interval, l.min_scale)
                               : "off"},
      {"step.optimizer",
       fmt::format("{}, {} groups", optimizer_.type_name(), optimizer_.group_count())}};
  fields.insert(fields.end(), own.begin(), own.end());
  for (std::size_t g = 0; g < optimizer_.group_count(); ++g)
    fields.emplace_back(
        fmt::format("step.optimizer.group[{}]", g),
        fmt::format("lr={} weight_decay={}", optimizer_.initial_lr(g), optimizer_.weight_decay(g)));
  return fields;
}

Context DataParallelStep::context(std::int64_t micro_batch, std::int64_t rows) const {
  const int rank = world_ ? world_->rank() : 0, size = world_ ? world_->size() : 1;
  Context ctx;
  ctx.stream = stream_;
  ctx.autocast = options_.autocast;
  ctx.seed = options_.seed;
  ctx.step = static_cast<std::uint64_t>(steps_);
  ctx.index_checks = &readback_->index_checks();  // Note [deferred index check]
  // Note [dropout keys]; Note [rank-invariant step]: chunk rank x K + k.
  ctx.first_sample = options_.rank_invariant
                         ? (rank * std::int64_t{options_.accumulation} + micro_batch) * rows
                         : (micro_batch * size + rank) * rows;
  return ctx;
}

comm::GradientSynchronizer& DataParallelStep::synchronizer() {
  if (!sync_)
    throw InvalidArgument(
        "DataParallelStep::synchronizer(): this step has no world, hence no synchroniser");
  return *sync_;
}

DataParallelStep::FullParameters::FullParameters(ParameterGathers* gathers, bool write_back)
    : gathers_(gathers), write_back_(write_back) {
  if (gathers_) gathers_->gather_all();
}

DataParallelStep::FullParameters::~FullParameters() {
  if (gathers_) gathers_->drop_all(write_back_);
}

StepResult DataParallelStep::run(std::span<const MicroBatch> micro_batches) {
  const auto start = std::chrono::steady_clock::now();
  const int k_total = options_.accumulation;
  if (static_cast<int>(micro_batches.size()) != k_total)
    throw InvalidArgument(fmt::format(
        "DataParallelStep::run: {} micro-batches given, StepOptions::accumulation is {}",
        micro_batches.size(), k_total));
  const float dloss = scaler_.scale() / static_cast<float>(k_total * loss_gradient_divisor_);
  switch (graph_ ? graph_->next(micro_batches, dloss) : StepGraph::Action::eager) {
    case StepGraph::Action::eager:
      forward_backward(micro_batches, dloss, false);
      eager_since_capture_ = true;  // its own index checks are registered now
      break;
    case StepGraph::Action::capture: {
      const std::span<const MicroBatch> staged = graph_->stage(micro_batches);
      core::trace::Span capture("capture cuda graph", core::trace::Part::compute);
      graph_->capture([&] { forward_backward(staged, dloss, true); });
      graph_index_checks_ = readback_->index_checks();  // the lookups the graph reports on
      eager_since_capture_ = false;
      break;
    }
    case StepGraph::Action::replay: {
      core::trace::Span replay("replay cuda graph", core::trace::Part::compute, stream_);
      // An eager step since the capture registered its own lookups: a bad
      // index the graph reports names the captured ones (Note [step graph]).
      if (eager_since_capture_) readback_->index_checks() = *graph_index_checks_;
      eager_since_capture_ = false;
      graph_->replay(micro_batches);
      break;
    }
  }
  StepResult r;
  update(r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

void DataParallelStep::forward_backward(std::span<const MicroBatch> micro_batches, float dloss,
                                        bool capturing) {
  const int k_total = options_.accumulation;
  store_.zero_grad(stream_);
  if (sync_) sync_->begin_step(steps_);
  if (gathers_) gathers_->begin_step();  // Note [parameter units]: the resident pieces
  readback_->clear(stream_);
  core::Tensor loss_total = readback_->loss_total(), rows_total = readback_->rows_total();
  for (int k = 0; k < k_total; ++k) {
    std::optional<comm::GradientSynchronizer::NoSync> quiet;
    if (sync_ && k + 1 < k_total) quiet.emplace(sync_->no_sync());
    const MicroBatch& batch = micro_batches[k];
    if (tree_ && k > 0) store_.zero_grad(stream_);  // each chunk's own gradient, for the tree
    core::MemoryKindScope kind(core::MemoryKind::activations);  // Note [memory kinds]
    Context ctx = context(k, batch.inputs.dim(0));
    ctx.graph_capture = capturing;
    if (sync_) ctx.on_grad_ready = [this](Parameter& p) { sync_->mark_ready(store_.index_of(p)); };
    if (gathers_)
      ctx.on_module = [this](Module& m, ModulePhase phase) { gathers_->on_module(m, phase); };
    if (chunk_buffers_) chunk_buffers_->begin_chunk(k, stream_);
    {
      core::trace::Span forward("forward", core::trace::Part::compute);
      const core::NamedTensors tensors = batch.tensors();
      const core::NamedTensors outputs = model_.forward_named(tensors, ctx);
      core::trace::Span loss_span;  // Note [module spans]: the loss is a span of its own
      loss_span.open("forward", "loss", "module", &stream_);
      // Note [gradient in the forward]: outputs is not read after; Note
      // [announcement scope]: withdrawn if the loss's forward never takes it.
      const ExpectedBackward announced(*loss_, dloss);
      const core::Tensor loss = loss_->forward_named(outputs, tensors, ctx);
      // Note [loss rows]: the mean weighed by the rows it is of.
      if (tree_) {  // Note [rank-invariant step]: each chunk's, summed in the tree
        core::Tensor chunk_loss = readback_->chunk_losses().view(k, {1});
        core::ops::mul(loss, loss_->counted_rows(), chunk_loss, stream_);
      } else {
        core::ops::mul(loss, loss_->counted_rows(), weighted_loss_, stream_);
        core::ops::add(loss_total, weighted_loss_, loss_total, stream_);
      }
      core::ops::add(rows_total, loss_->counted_rows(), rows_total, stream_);
    }
    if (chunk_buffers_) chunk_buffers_->end_chunk(stream_);
    core::trace::Span backward("backward", core::trace::Part::compute);
    core::NamedTensors doutputs;
    {
      core::trace::Span loss_span;
      loss_span.open("backward", "loss", "module", &stream_);
      doutputs = loss_->backward_named(dloss, ctx);
    }
    model_.backward_named(doutputs, ctx);
    model_.report_ready(ctx);
    if (tree_) tree_->add(stream_);
  }
  if (sync_) {
    core::trace::Span wait("gradient sync wait", core::trace::Part::comm);
    sync_->finish();
  }
  if (gathers_) gathers_->end_step();
  if (chunk_buffers_) chunk_buffers_->finish(stream_);
}

// Note [non-finite steps]: the scaler's flag (f16) or the norm (fp32, bf16)
// says whether every gradient is finite. The step's device values come back
// in one read (Note [one read per step]); the agreement gives the global loss
// (and, under ZeRO-1 and ZeRO-2, the shards' findings and norms); then the decision.
void DataParallelStep::update(StepResult& r) {
  r.loss_scale = scaler_.scale();
  const StepReadback::Values& local = [&]() -> const StepReadback::Values& {
    core::trace::Span unscale("unscale and measure", core::trace::Part::optimizer);
    measure_gradients(measured_grads(), measured_, scaler_, *readback_, stream_);
    return readback_->read(stream_);  // waits for the device
  }();
  // Note [deferred index check]: a bad index refuses the step on every rank.
  const bool bad_index = kernels::index_report_bad(local.bad_index);
  const double local_loss = bad_index ? std::numeric_limits<double>::quiet_NaN() : local.loss_total;
  GradientPayload gradients = gradient_payload(local);
  // ZeRO-1 and ZeRO-2: this rank's shard, summed over the ranks by the agreement.
  std::span<double> sums = sharded() && !tree_ ? std::span<double>(gradients) : std::span<double>();
  if (tree_) {  // Note [rank-invariant step]: each chunk's loss at its chunk's slot
    const int k_total = options_.accumulation, rank = world_ ? world_->rank() : 0;
    std::fill(chunk_sums_.begin(), chunk_sums_.end(), 0.0);
    for (int k = 0; k < k_total; ++k)
      chunk_sums_[static_cast<std::size_t>(rank * k_total + k)] =
          bad_index ? local_loss : local.chunk_losses[static_cast<std::size_t>(k)];
    sums = chunk_sums_;
  }
  comm::StepTotals totals{local_loss, local.rows_total, comm::stop_requested()};
  if (world_) {
    core::trace::Span agreement("agreement", core::trace::Part::comm);
    totals = agreement_->agree(local_loss, local.rows_total, sums);
  }
  if (bad_index) readback_->index_checks().check(local.bad_index, stream_);  // throws
  if (tree_)
    totals.loss_sum = comm::tree_sum<double>(
        static_cast<std::int64_t>(chunk_sums_.size()),
        [&](std::int64_t j) { return chunk_sums_[static_cast<std::size_t>(j)]; },
        [](double a, double b) { return a + b; });
  {
    core::trace::Span decide("decide and schedule", core::trace::Part::optimizer);
    r.grad_norm = with_step(steps_ + 1, [&] {
      return decide_gradients(measured_grads(), measured_, scaler_, options_.max_grad_norm,
                              gradients, stream_)
          .grad_norm;
    });
    scheduler_.apply(optimizer_, steps_);
    r.lr = optimizer_.lr(0);
  }
  r.skipped = !std::isfinite(r.grad_norm) || !std::isfinite(totals.loss_sum);
  if (!r.skipped) {
    {
      core::trace::Span optimizer("optimizer", core::trace::Part::optimizer, stream_);
      optimizer_.step(stream_);
    }
    // Every rank's updated shard; exposed communication in the breakdown.
    // ZeRO-3: the next forward gathers (Note [parameter units]).
    if (sharded() && !sync_->sharded_parameters()) sync_->gather(store_.values());
  }

  r.step = ++steps_;
  r.loss = totals.mean_loss();
  r.samples = totals.samples;
  r.stop = totals.stop;
  skipped_steps_ += r.skipped ? 1 : 0;
  consecutive_skips_ = r.skipped ? consecutive_skips_ + 1 : 0;
  r.skipped_steps = skipped_steps_;
  if (consecutive_skips_ >= options_.max_consecutive_skips) throw_nonfinite(r.step, r.loss);
}

void DataParallelStep::throw_nonfinite(std::int64_t step, double mean_loss) {
  // The gradients are the allreduced ones, the same on every rank, so every
  // rank names the same parameter; with ZeRO-1 every rank's shard first.
  const bool transient = sync_ && sync_->transient_gradients();
  if (sharded() && !transient) sync_->gather(store_.grads());
  const std::vector<float> g =
      (transient ? sync_->gather_gradients() : store_.grads()).to_vector<float>(stream_);
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

}  // namespace lockstep::engine
