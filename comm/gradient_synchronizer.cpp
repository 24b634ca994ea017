// GradientSynchronizer (comm/gradient_synchronizer.h): construction checks,
// readiness bookkeeping, the reduction of one bucket and ZeRO-3's gathers.
#include "comm/gradient_synchronizer.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "comm/detail/bucket_runner.h"
#include "comm/host_buffer.h"
#include "comm/model_check.h"
#include "engine/core/memory.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "kernels/error.h"

namespace lockstep::comm {
namespace {

std::vector<std::string> describe_model(const SynchronizedModel& model) {
  std::vector<std::string> entries;
  for (const GradientSegment& s : model.segments)
    entries.push_back(fmt::format("parameter '{}' {} {} at offset {}", s.name,
                                  dtype_name(model.parameters.dtype()), core::shape_str(s.shape),
                                  s.offset));
  for (const NamedBuffer& b : model.buffers)
    entries.push_back(fmt::format("buffer '{}' {} {}", b.name, dtype_name(b.tensor.dtype()),
                                  core::shape_str(b.tensor.shape())));
  entries.push_back(fmt::format("flat buffers of {} elements", model.parameters.numel()));
  return entries;
}

std::string size_text(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b < 1e3) return fmt::format("{} B", bytes);
  return b < 1e6 ? fmt::format("{:.1f} kB", b / 1e3) : fmt::format("{:.1f} MB", b / 1e6);
}

}  // namespace

GradientSynchronizer::NoSync::NoSync(GradientSynchronizer& sync) : sync_(&sync) {
  ++sync_->no_sync_depth_;
}

GradientSynchronizer::NoSync::~NoSync() {
  if (!sync_) return;
  // Note [transient gradients]: the micro-batch's backward ended; its
  // buckets are completed before the next one reports (or in finish()).
  if (--sync_->no_sync_depth_ == 0 && sync_->transient_gradients() && sync_->in_step_)
    sync_->pass_ended_ = true;
}

GradientSynchronizer::NoSync::NoSync(NoSync&& other) noexcept
    : sync_(std::exchange(other.sync_, nullptr)) {}

GradientSynchronizer::GradientSynchronizer(Communicator& comm, SynchronizedModel model,
                                           SynchronizerOptions options)
    : comm_(comm), model_(std::move(model)), options_(std::move(options)) {
  check_model();
  const core::Device device = comm_.device();
  if (device.is_cuda() && !options_.compute_stream.device().is_cuda())
    options_.compute_stream = core::Stream::default_for(device);
  const core::Stream& compute = options_.compute_stream;

  check_same_model(comm_, describe_model(model_));
  comm_.broadcast(model_.parameters, 0, compute);
  parameter_numel_ = model_.parameters.numel();

  pack_buffers();
  broadcast_buffers();
  plan();

  if (options_.ordered)
    ordered_ = std::make_unique<OrderedAllreduce>(comm_, model_.gradients.numel(), compute);
  std::int64_t largest = 0;
  for (const Bucket& bucket : buckets_) largest = std::max(largest, bucket.numel);
  const bool tail = sharded() && shards_.padded_numel() > shards_.buffer_numel;
  // ZeRO-2: the gradients are the caller's, group by group, from now on; the
  // shard is made in set_gradient_groups, once the caller has dropped its
  // flat buffer (so that the two never exist together).
  if (transient_gradients()) model_.gradients = core::Tensor();
  // ZeRO-3: the caller shards its values now (Note [parameter units]).
  if (sharded_parameters()) model_.parameters = core::Tensor();
  auto reduce = [this](std::size_t b, const core::Stream& stream) { reduce_bucket(b, stream); };
  if (device.is_cuda()) {
    comm_stream_ = core::Stream::create(device);
    core::trace::set_stream_name(comm_stream_, "nccl stream");
    if (options_.wire_dtype != DType::f32)
      wire_ = core::Tensor::empty({largest}, options_.wire_dtype, device, comm_stream_);
    if (tail)
      tail_ = core::Tensor::empty({buckets_.back().numel}, DType::f32, device, comm_stream_);
    runner_ = detail::make_stream_runner(reduce, compute, comm_stream_);
  } else {
    if (options_.wire_dtype != DType::f32)
      wire_ = empty_host_buffer({largest}, options_.wire_dtype);
    if (tail) tail_ = empty_host_buffer({buckets_.back().numel}, DType::f32);
    // Duplicated in both modes: ranks may choose differently (host_overlap
    // depends on each node's cores) and a duplicate is a collective.
    thread_comm_ = comm_.duplicate("gradients");
    // Note [transient gradients]: ZeRO-2 reduces each bucket on the caller's thread at once.
    runner_ = options_.host_overlap.value_or(true) && !transient_gradients()
                  ? detail::make_thread_runner(reduce)
                  : detail::make_deferred_runner(reduce);
  }
}

GradientSynchronizer::~GradientSynchronizer() = default;

// Buffers travel packed, one broadcast per dtype rather than one per buffer.
void GradientSynchronizer::pack_buffers() {
  for (std::size_t i = 0; i < model_.buffers.size(); ++i) {
    const DType dtype = model_.buffers[i].tensor.dtype();
    std::size_t pack = 0;
    while (pack < pack_members_.size() &&
           model_.buffers[pack_members_[pack].front()].tensor.dtype() != dtype)
      ++pack;
    if (pack == pack_members_.size()) pack_members_.emplace_back();
    pack_members_[pack].push_back(i);
  }
  for (const auto& members : pack_members_) {
    std::int64_t numel = 0;
    for (std::size_t i : members) numel += model_.buffers[i].tensor.numel();
    const DType dtype = model_.buffers[members.front()].tensor.dtype();
    buffer_packs_.push_back(
        members.size() == 1
            ? core::Tensor()
            : core::Tensor::empty({numel}, dtype, comm_.device(), options_.compute_stream));
  }
}

// The bucket plan, and the per-step bookkeeping sized to it.
void GradientSynchronizer::plan() {
  if (sharded()) {
    shards_ = plan_shards(model_.segments, model_.parameters.numel(), comm_.size(), comm_.rank(),
                          options_.first_bucket_cap_bytes, options_.bucket_cap_bytes, model_.cuts);
    buckets_ = shards_.buckets;
  } else {
    buckets_ =
        plan_buckets(model_.segments, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);
  }
  // A sharded bucket may share a segment with its neighbours (Note [shard layout]).
  buckets_of_.assign(model_.segments.size(), {0, 0});
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    for (std::size_t s = bucket.first_segment; s < bucket.end_segment; ++s) {
      if (buckets_of_[s].second == 0) buckets_of_[s].first = b;
      buckets_of_[s].second = b + 1;
    }
    const std::string what =
        bucket.first_segment == bucket.end_segment
            ? std::string("padding")
            : fmt::format("{} .. {}", model_.segments[bucket.first_segment].name,
                          model_.segments[bucket.end_segment - 1].name);
    bucket_names_.push_back(fmt::format("gradient bucket {} of {}: {}, {}", b + 1, buckets_.size(),
                                        what, size_text(bucket.numel * sizeof(float))));
    if (sharded())
      gather_names_.push_back(fmt::format("parameter bucket {} of {}: {}, {}", b + 1,
                                          buckets_.size(), what,
                                          size_text(bucket.numel * sizeof(float))));
  }
  pending_.assign(buckets_.size(), 0);
  ready_.assign(model_.segments.size(), 0);
  if (!transient_gradients()) return;
  // Note [transient gradients]: a group ends where no segment straddles the
  // edge between two buckets.
  std::int64_t position = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    const bool joins_previous = b > 0 && bucket.first_segment < bucket.end_segment &&
                                buckets_[b - 1].first_segment < buckets_[b - 1].end_segment &&
                                buckets_[b - 1].end_segment - 1 == bucket.first_segment;
    if (joins_previous) {
      groups_.back().numel += bucket.numel;
      last_bucket_.back() = b;
    } else {
      groups_.push_back({bucket.offset, bucket.numel});
      last_bucket_.push_back(b);
    }
    group_of_.push_back(groups_.size() - 1);
    chunk_position_.push_back(position);
    position += shards_.chunk_numel(b);
  }
}

void GradientSynchronizer::check_model() const {
  const core::Tensor& params = model_.parameters;
  const core::Tensor& grads = model_.gradients;
  // ZeRO-2 may go without the flat gradients (Note [transient gradients]).
  if (!params.defined() || (!grads.defined() && options_.zero_stage < 2))
    throw InvalidArgument(
        "GradientSynchronizer: the flat parameter and gradient buffers must both be given");
  if (params.dtype() != DType::f32 ||
      (grads.defined() && (grads.dtype() != DType::f32 || params.numel() != grads.numel())))
    throw InvalidArgument(fmt::format(
        "GradientSynchronizer: parameters ({} {}) and gradients ({} {}) must be f32 buffers of the "
        "same size",
        params.numel(), dtype_name(params.dtype()), grads.numel(), dtype_name(grads.dtype())));
  for (const core::Tensor* t : {&params, &grads})
    if (t->defined() && !(t->device() == comm_.device()))
      throw InvalidArgument(fmt::format(
          "GradientSynchronizer: the model is on {} but communicator '{}' ({}) takes buffers on "
          "{} (use World::for_device)",
          t->device().str(), comm_.label(), comm_.backend(), comm_.device().str()));
  for (const NamedBuffer& b : model_.buffers)
    if (!b.tensor.defined() || !(b.tensor.device() == comm_.device()))
      throw InvalidArgument(fmt::format("GradientSynchronizer: buffer '{}' must be a tensor on {}",
                                        b.name, comm_.device().str()));
  const DType wire = options_.wire_dtype;
  if (wire != DType::f32 && wire != DType::bf16 && wire != DType::f16)
    throw InvalidArgument(fmt::format("GradientSynchronizer: wire_dtype {} is not f32, bf16 or f16",
                                      dtype_name(wire)));
  check_segments(model_.segments, params.numel());
  if (options_.ordered && (options_.average || wire != DType::f32))
    throw InvalidArgument(fmt::format(
        "GradientSynchronizer: ordered synchronisation sums f32 gradients in a fixed order (Note "
        "[ordered synchronisation]); it was given average = {} and wire_dtype {}: set average = "
        "false (divide each rank's gradient instead) and wire_dtype f32",
        options_.average, dtype_name(wire)));
  if (options_.zero_stage < 0 || options_.zero_stage > 3)
    throw InvalidArgument(fmt::format(
        "GradientSynchronizer: zero_stage {} is not supported (use 0: allreduce every gradient, "
        "1: ZeRO-1, reduce-scatter into per-rank shards, 2: ZeRO-2, and keep only the shard's "
        "gradients, or 3: ZeRO-3, and the shard's parameters)",
        options_.zero_stage));
  if (!model_.cuts.empty() && options_.zero_stage == 0)
    throw InvalidArgument(
        "GradientSynchronizer: the model has ZeRO-3 cuts but zero_stage 0 plans no shards");
  if (options_.zero_stage >= 2 && options_.ordered)
    throw InvalidArgument(
        "GradientSynchronizer: ordered synchronisation sums the whole gradient buffer in "
        "finish(), which ZeRO-2 does not keep (Note [transient gradients]): use zero_stage 1 "
        "with it");
}

void GradientSynchronizer::broadcast_buffers() {
  const core::Stream& stream = options_.compute_stream;
  for (std::size_t p = 0; p < pack_members_.size(); ++p) {
    const auto& members = pack_members_[p];
    if (members.size() == 1) {  // no packing needed
      comm_.broadcast(model_.buffers[members.front()].tensor, 0, stream);
      continue;
    }
    core::Tensor& pack = buffer_packs_[p];
    std::int64_t offset = 0;
    for (std::size_t i : members) {
      const core::Tensor& buffer = model_.buffers[i].tensor;
      pack.view(offset, buffer.shape()).copy_from(buffer, stream);
      offset += buffer.numel();
    }
    comm_.broadcast(pack, 0, stream);
    if (comm_.rank() == 0) continue;
    offset = 0;
    for (std::size_t i : members) {
      core::Tensor& buffer = model_.buffers[i].tensor;
      buffer.copy_from(pack.view(offset, buffer.shape()), stream);
      offset += buffer.numel();
    }
  }
}

void GradientSynchronizer::begin_step(std::int64_t step) {
  if (in_step_)
    throw InvalidArgument(fmt::format(
        "begin_step({}) while step {} is open: call finish() after its backward", step, step_));
  step_ = step;
  if (comm_.watchdog()) comm_.watchdog()->set_step(step);
  broadcast_buffers();
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    pending_[b] = buckets_[b].end_segment - buckets_[b].first_segment;
  if (transient_gradients() && !gradient_groups_)
    throw InvalidArgument(
        "begin_step: ZeRO-2 needs the gradients' owner: call set_gradient_groups first (Note "
        "[transient gradients])");
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = next_release_ = recorded_through_ = 0;
  first_pass_ = true;
  pass_ended_ = false;
  in_step_ = true;
}

void GradientSynchronizer::mark_ready(std::size_t segment) {
  if (segment >= model_.segments.size())
    throw InvalidArgument(fmt::format("mark_ready({}): the model has {} gradient segments", segment,
                                      model_.segments.size()));
  if (no_sync_depth_ > 0 && !transient_gradients()) return;
  const std::string& name = model_.segments[segment].name;
  if (pass_ended_) {  // Note [transient gradients]: the previous micro-batch's buckets
    pass_ended_ = false;
    complete_pass();
    std::fill(ready_.begin(), ready_.end(), 0);
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      pending_[b] = buckets_[b].end_segment - buckets_[b].first_segment;
    next_launch_ = next_release_ = recorded_through_ = 0;
    first_pass_ = false;
  }
  if (!in_step_)
    throw InvalidArgument(fmt::format(
        "mark_ready('{}') outside a step: call begin_step(step) before the forward pass", name));
  if (ready_[segment])
    throw InvalidArgument(fmt::format(
        "parameter '{}' was reported ready twice in one backward pass at step {} (a module must "
        "report each of its parameters once)",
        name, step_));
  ready_[segment] = 1;
  for (std::size_t b = buckets_of_[segment].first; b < buckets_of_[segment].second; ++b)
    --pending_[b];
  if (!options_.ordered) launch_ready_buckets();
}

// Note [bucket order]: buckets start strictly in index order, on every rank.
// Collectives must be issued in the same order everywhere, and readiness
// order may differ between ranks (or from the plan); a complete bucket whose
// predecessors are still waiting starts right after them.
void GradientSynchronizer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && pending_[next_launch_] == 0) {
    if (core::trace::active())
      core::trace::instant(fmt::format("bucket {} ready", next_launch_), "comm");
    runner_->launch(next_launch_++);
  }
  if (!transient_gradients()) return;
  if (!comm_.device().is_cuda()) runner_->wait_all();  // Note [transient gradients]
  release_reduced_groups(false);
}

void GradientSynchronizer::release_reduced_groups(bool all) {
  std::size_t complete = 0;  // groups [0, complete) have all their buckets launched
  while (complete < groups_.size() && last_bucket_[complete] < next_launch_) ++complete;
  std::size_t through = complete;
  if (comm_.device().is_cuda() && !all) {
    // Note [stream-ordered free]: the compute stream waits for the groups
    // before the latest complete one, then they may go.
    if (complete == recorded_through_) return;
    through = recorded_through_;
    if (through > next_release_) options_.compute_stream.wait(group_reduced_);
    group_reduced_.record(comm_stream_);
    recorded_through_ = complete;
  }
  for (; next_release_ < through; ++next_release_) gradient_groups_->release(next_release_);
}

void GradientSynchronizer::complete_pass() {
  std::vector<std::size_t> missing;
  for (std::size_t s = 0; s < ready_.size(); ++s)
    if (!ready_[s]) missing.push_back(s);
  if (options_.ordered) {
    ordered_->run(model_.gradients, options_.compute_stream);
  } else {
    while (next_launch_ < buckets_.size()) runner_->launch(next_launch_++);
    runner_->wait_all();
    if (transient_gradients()) release_reduced_groups(true);
  }
  if (missing.empty()) return;
  std::string others;
  for (std::size_t i = 1; i < std::min<std::size_t>(missing.size(), 4); ++i)
    others += fmt::format("{}'{}'", i > 1 ? ", " : "", model_.segments[missing[i]].name);
  if (missing.size() > 4) others += fmt::format(" and {} more", missing.size() - 4);
  throw InvalidArgument(fmt::format(
      "finish() at step {}: parameter '{}' (segment {} of {}) was never reported ready in this "
      "backward pass{}; whatever runs the owning module's backward must then call "
      "report_ready(ctx) on that module (Module::report_ready, which calls mark_ready), also "
      "when the gradient is zero, as the containers do (docs/custom-training.md)",
      step_, model_.segments[missing.front()].name, missing.front(), model_.segments.size(),
      others.empty() ? "" : " (nor were " + others + ")"));
}

// Note [missing readiness]: when a segment was never reported, this rank still
// reduces every bucket before throwing, so that it issues the same
// collectives as a rank whose backward was complete. When every rank misses
// the same parameter (a module that forgets to report), every rank throws and
// none is left waiting.
void GradientSynchronizer::finish() {
  if (no_sync_depth_ > 0)
    throw InvalidArgument(
        "finish() inside no_sync(): end the NoSync guard before the last micro-batch's backward, "
        "then call finish()");
  if (!in_step_)
    throw InvalidArgument("finish() without an open step: call begin_step(step) first");
  in_step_ = false;
  pass_ended_ = false;
  complete_pass();
}

// Note [wire scaling]: with a 16-bit wire format each rank divides by the
// world size before rounding, as PyTorch's compression hooks do: the sum of N
// f16 gradients could overflow 65504 where their mean does not.
void GradientSynchronizer::reduce_bucket(std::size_t b, const core::Stream& stream) {
  if (transient_gradients()) {
    reduce_scatter_group(b, stream);
    return;
  }
  if (sharded()) {
    reduce_scatter_bucket(b, stream);
    return;
  }
  const Bucket& bucket = buckets_[b];
  OperationContext context(bucket_names_[b], static_cast<std::int64_t>(b));
  Communicator& comm = bucket_comm();
  core::Tensor slice = model_.gradients.view(bucket.offset, {bucket.numel});
  if (options_.wire_dtype == DType::f32) {
    comm.allreduce(slice, options_.average ? ReduceOp::avg : ReduceOp::sum, stream);
    return;
  }
  core::Tensor wire = wire_.view(0, {bucket.numel});
  if (options_.average) core::ops::scale(slice, 1.0f / static_cast<float>(comm.size()), stream);
  core::ops::cast(slice, wire, stream);
  comm.allreduce(wire, ReduceOp::sum, stream);
  core::ops::cast(wire, slice, stream);
}

const ShardLayout& GradientSynchronizer::shard_layout() const {
  if (!sharded())
    throw InvalidArgument(
        "GradientSynchronizer::shard_layout: the synchroniser is not sharded (zero_stage 0)");
  return shards_;
}

// ZeRO-1 (Note [shard layout]): in place, the bucket's slice of the buffer is
// every rank's contribution and this rank's chunk receives the reduction. A
// 16-bit wire format (Note [wire scaling]) and the tail bucket, which reaches
// past the buffer, go through a scratch buffer.
void GradientSynchronizer::reduce_scatter_bucket(std::size_t b, const core::Stream& stream) {
  const Bucket& bucket = buckets_[b];
  OperationContext context(bucket_names_[b], static_cast<std::int64_t>(b));
  Communicator& comm = bucket_comm();
  const std::int64_t chunk = shards_.chunk_numel(b);
  const std::int64_t in_buffer = std::min(bucket.numel, shards_.buffer_numel - bucket.offset);
  const DType wire = options_.wire_dtype;
  const ReduceOp op = options_.average ? ReduceOp::avg : ReduceOp::sum;
  if (wire == DType::f32 && in_buffer == bucket.numel) {
    float* base = model_.gradients.data_as<float>() + bucket.offset;
    comm.reduce_scatter(base, base + comm.rank() * chunk, chunk, DType::f32, op, stream);
    return;
  }
  core::Tensor scratch = (wire == DType::f32 ? tail_ : wire_).view(0, {bucket.numel});
  core::Tensor slice = model_.gradients.view(bucket.offset, {in_buffer});
  if (in_buffer < bucket.numel)
    scratch.view(in_buffer, {bucket.numel - in_buffer}).fill_(0.0, stream);
  if (wire != DType::f32 && options_.average)
    core::ops::scale(slice, 1.0f / static_cast<float>(comm.size()), stream);
  core::Tensor staged = scratch.view(0, {in_buffer});
  core::ops::cast(slice, staged, stream);
  const std::size_t element = dtype_size(wire);
  char* base = static_cast<char*>(scratch.data());
  comm.reduce_scatter(base, base + comm.rank() * chunk * element, chunk, wire,
                      wire == DType::f32 ? op : ReduceOp::sum, stream);
  const FlatRange mine = shards_.chunk(b, comm.rank());
  if (mine.numel == 0) return;
  core::Tensor back = model_.gradients.view(mine.offset, {mine.numel});
  core::ops::cast(scratch.view(mine.offset - bucket.offset, {mine.numel}), back, stream);
}

// Note [transient gradients]: the bucket's slice of its group is every
// rank's contribution; this rank's chunk of the sum lands in its place in the
// shard, or, after the step's first micro-batch, in scratch that is added
// there. The group covers the layout's padding, so no bucket needs the tail
// scratch; a 16-bit wire (Note [wire scaling]) goes through wire_.
void GradientSynchronizer::reduce_scatter_group(std::size_t b, const core::Stream& stream) {
  const Bucket& bucket = buckets_[b];
  OperationContext context(bucket_names_[b], static_cast<std::int64_t>(b));
  Communicator& comm = bucket_comm();
  const std::int64_t chunk = shards_.chunk_numel(b);
  const FlatRange& group = groups_[group_of_[b]];
  core::Tensor slice =
      gradient_groups_->group(group_of_[b]).view(bucket.offset - group.offset, {bucket.numel});
  core::Tensor target = shard_grads_.view(chunk_position_[b], {chunk});
  if (!first_pass_ && !chunk_scratch_.defined()) {  // the first step with accumulation
    std::int64_t largest = 0;
    for (std::size_t i = 0; i < buckets_.size(); ++i)
      largest = std::max(largest, shards_.chunk_numel(i));
    core::MemoryKindScope kind(core::MemoryKind::communication);  // Note [memory kinds]
    chunk_scratch_ = core::Tensor::empty({largest}, DType::f32, comm.device(), stream);
  }
  core::Tensor received = first_pass_ ? target : chunk_scratch_.view(0, {chunk});
  const DType wire = options_.wire_dtype;
  if (wire == DType::f32) {
    comm.reduce_scatter(slice.data(), received.data(), chunk, DType::f32,
                        options_.average ? ReduceOp::avg : ReduceOp::sum, stream);
  } else {
    core::Tensor staged = wire_.view(0, {bucket.numel});
    if (options_.average) core::ops::scale(slice, 1.0f / static_cast<float>(comm.size()), stream);
    core::ops::cast(slice, staged, stream);
    char* base = static_cast<char*>(staged.data());
    comm.reduce_scatter(base, base + comm.rank() * chunk * dtype_size(wire), chunk, wire,
                        ReduceOp::sum, stream);
    core::ops::cast(staged.view(comm.rank() * chunk, {chunk}), received, stream);
  }
  if (!first_pass_) core::ops::add(target, received, target, stream);
}

void GradientSynchronizer::gather_bucket(core::Tensor& flat, std::size_t b,
                                         const core::Stream& stream) {
  const Bucket& bucket = buckets_[b];
  OperationContext context(gather_names_[b], static_cast<std::int64_t>(b));
  Communicator& comm = bucket_comm();
  const std::int64_t chunk = shards_.chunk_numel(b);
  const std::int64_t in_buffer = std::min(bucket.numel, shards_.buffer_numel - bucket.offset);
  if (in_buffer == bucket.numel) {
    float* base = flat.data_as<float>() + bucket.offset;
    comm.allgather(base + comm.rank() * chunk, base, chunk, DType::f32, stream);
    return;
  }
  core::Tensor scratch = tail_.view(0, {bucket.numel});
  scratch.fill_(0.0, stream);
  const FlatRange mine = shards_.chunk(b, comm.rank());
  if (mine.numel > 0)
    scratch.view(mine.offset - bucket.offset, {mine.numel})
        .copy_from(flat.view(mine.offset, {mine.numel}), stream);
  float* base = scratch.data_as<float>();
  comm.allgather(base + comm.rank() * chunk, base, chunk, DType::f32, stream);
  flat.view(bucket.offset, {in_buffer}).copy_from(scratch.view(0, {in_buffer}), stream);
}

void GradientSynchronizer::set_gradient_groups(GradientGroups& groups) {
  if (!transient_gradients())
    throw InvalidArgument(
        "GradientSynchronizer::set_gradient_groups needs zero_stage 2 or 3 (with stages 0 and 1 "
        "the "
        "gradients are the model's flat buffer)");
  gradient_groups_ = &groups;
  if (shard_grads_.defined()) return;
  core::MemoryKindScope kind(core::MemoryKind::gradients);  // Note [memory kinds]
  shard_grads_ = core::Tensor::zeros({shards_.shard_numel()}, DType::f32, comm_.device(),
                                     options_.compute_stream);
}

core::Tensor& GradientSynchronizer::shard_gradients() {
  if (!transient_gradients())
    throw InvalidArgument(
        "GradientSynchronizer::shard_gradients needs zero_stage 2 or 3 (with stages 0 and 1 the "
        "gradients are the model's flat buffer)");
  return shard_grads_;
}

core::Tensor GradientSynchronizer::gather_gradients() {
  core::Tensor full = core::Tensor::empty({shards_.padded_numel()}, DType::f32, comm_.device(),
                                          options_.compute_stream);
  gather_shards(comm_, shards_, shard_gradients(), full, options_.compute_stream);
  return full;
}

void GradientSynchronizer::gather(core::Tensor& flat) {
  if (!sharded())
    throw InvalidArgument(
        "GradientSynchronizer::gather needs zero_stage 1 or 2 (the synchroniser "
        "allreduces every gradient: every rank holds every parameter already)");
  if (sharded_parameters())
    throw InvalidArgument(
        "GradientSynchronizer::gather: under ZeRO-3 no rank holds the flat parameters; gather a "
        "unit's with start_gather (Note [parameter units])");
  if (in_step_)
    throw InvalidArgument("GradientSynchronizer::gather inside a step: call finish() first");
  if (!flat.defined() || flat.dtype() != DType::f32 || flat.numel() != parameter_numel_ ||
      !(flat.device() == comm_.device()))
    throw InvalidArgument(fmt::format(
        "GradientSynchronizer::gather: the buffer must be {} f32 elements on {}, like the "
        "model's flat parameters",
        parameter_numel_, comm_.device().str()));
  core::trace::Span span("parameter gather", core::trace::Part::comm);
  if (!comm_.device().is_cuda()) {
    for (std::size_t b = 0; b < buckets_.size(); ++b) gather_bucket(flat, b, core::Stream());
    return;
  }
  updated_.record(options_.compute_stream);
  comm_stream_.wait(updated_);
  for (std::size_t b = 0; b < buckets_.size(); ++b) gather_bucket(flat, b, comm_stream_);
  gathered_.record(comm_stream_);
  options_.compute_stream.wait(gathered_);
}

// Note [parameter units]: each bucket's chunk goes to its place in the new
// buffer, then one in-place allgather per bucket. The buffer belongs to the
// compute stream (Note [stream-ordered free]): the communication stream
// starts after it, and the compute stream waits for the gather before it
// reads the values, so the buffer's release on the compute stream comes
// after the gather in stream order.
GradientSynchronizer::Gather GradientSynchronizer::start_gather(FlatRange range,
                                                                const core::Tensor& shard) {
  if (!sharded_parameters())
    throw InvalidArgument(
        "GradientSynchronizer::start_gather needs zero_stage 3 (the parameters sharded)");
  if (!shard.defined() || shard.dtype() != DType::f32 || shard.numel() != shards_.shard_numel())
    throw InvalidArgument(fmt::format(
        "GradientSynchronizer::start_gather: the shard must be {} f32 elements (this rank's packed "
        "values), got {}",
        shards_.shard_numel(), shard.defined() ? shard.numel() : 0));
  const auto [first, end] = buckets_of_range(shards_, range);
  core::trace::Span span("parameter gather", core::trace::Part::comm);
  const core::Stream& compute = options_.compute_stream;
  Gather gather;
  {
    core::MemoryKindScope kind(core::MemoryKind::gathered);  // Note [memory kinds]
    gather.values = core::Tensor::empty({range.numel}, DType::f32, comm_.device(), compute);
  }
  const bool gpu = comm_.device().is_cuda();
  core::Stream stream = gpu ? comm_stream_ : core::Stream();
  if (gpu) {
    updated_.record(compute);
    comm_stream_.wait(updated_);
  }
  Communicator& comm = bucket_comm();
  for (std::size_t b = first; b < end; ++b) {
    OperationContext context(gather_names_[b], static_cast<std::int64_t>(b));
    const std::int64_t chunk = shards_.chunk_numel(b);
    const std::int64_t at = buckets_[b].offset - range.offset;
    core::Tensor mine = gather.values.view(at + comm.rank() * chunk, {chunk});
    mine.copy_from(shard.view(chunk_position_[b], {chunk}), stream);
    float* base = gather.values.data_as<float>() + at;
    comm.allgather(mine.data(), base, chunk, DType::f32, stream);
  }
  if (gpu) gather.done.record(comm_stream_);
  return gather;
}

void GradientSynchronizer::wait_gather(const Gather& gather) {
  if (comm_.device().is_cuda()) options_.compute_stream.wait(gather.done);
}

}  // namespace lockstep::comm
