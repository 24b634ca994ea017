// GradientSynchronizer (comm/gradient_synchronizer.h): construction checks,
// readiness bookkeeping and the reduction of one bucket.
#include "comm/gradient_synchronizer.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "comm/detail/bucket_runner.h"
#include "comm/host_buffer.h"
#include "comm/model_check.h"
#include "engine/core/ops.h"
#include "engine/core/trace.h"
#include "kernels/error.h"

namespace lockstep::comm {
namespace {

std::vector<std::string> describe_model(const SynchronizedModel& model) {
  std::vector<std::string> entries;
  for (const GradientSegment& s : model.segments)
    entries.push_back(fmt::format("parameter '{}' {} {} at offset {}", s.name,
                                  dtype_name(model.gradients.dtype()), core::shape_str(s.shape),
                                  s.offset));
  for (const NamedBuffer& b : model.buffers)
    entries.push_back(fmt::format("buffer '{}' {} {}", b.name, dtype_name(b.tensor.dtype()),
                                  core::shape_str(b.tensor.shape())));
  entries.push_back(fmt::format("flat buffers of {} elements", model.gradients.numel()));
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
  if (sync_) --sync_->no_sync_depth_;
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

  pack_buffers();
  broadcast_buffers();
  plan();

  std::int64_t largest = 0;
  for (const Bucket& bucket : buckets_) largest = std::max(largest, bucket.numel);
  auto reduce = [this](std::size_t b, const core::Stream& stream) { reduce_bucket(b, stream); };
  if (device.is_cuda()) {
    const core::Stream comm_stream = core::Stream::create(device);
    if (options_.wire_dtype != DType::f32)
      wire_ = core::Tensor::empty({largest}, options_.wire_dtype, device, comm_stream);
    runner_ = detail::make_stream_runner(reduce, compute, comm_stream);
  } else {
    if (options_.wire_dtype != DType::f32)
      wire_ = empty_host_buffer({largest}, options_.wire_dtype);
    // Duplicated in both modes: ranks may choose differently (host_overlap
    // depends on each node's cores) and a duplicate is a collective.
    thread_comm_ = comm_.duplicate("gradients");
    runner_ = options_.host_overlap ? detail::make_thread_runner(reduce)
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
  buckets_ =
      plan_buckets(model_.segments, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes);
  bucket_of_.resize(model_.segments.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = buckets_[b];
    for (std::size_t s = bucket.first_segment; s < bucket.end_segment; ++s) bucket_of_[s] = b;
    bucket_names_.push_back(fmt::format("gradient bucket {} of {}: {} .. {}, {}", b + 1,
                                        buckets_.size(), model_.segments[bucket.first_segment].name,
                                        model_.segments[bucket.end_segment - 1].name,
                                        size_text(bucket.numel * sizeof(float))));
  }
  pending_.assign(buckets_.size(), 0);
  ready_.assign(model_.segments.size(), 0);
}

void GradientSynchronizer::check_model() const {
  const core::Tensor& params = model_.parameters;
  const core::Tensor& grads = model_.gradients;
  if (!params.defined() || !grads.defined())
    throw InvalidArgument(
        "GradientSynchronizer: the flat parameter and gradient buffers must both be given");
  if (params.dtype() != DType::f32 || grads.dtype() != DType::f32 ||
      params.numel() != grads.numel())
    throw InvalidArgument(fmt::format(
        "GradientSynchronizer: parameters ({} {}) and gradients ({} {}) must be f32 buffers of the "
        "same size",
        params.numel(), dtype_name(params.dtype()), grads.numel(), dtype_name(grads.dtype())));
  for (const core::Tensor* t : {&params, &grads})
    if (!(t->device() == comm_.device()))
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
  check_segments(model_.segments, grads.numel());
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
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  in_step_ = true;
}

void GradientSynchronizer::mark_ready(std::size_t segment) {
  if (segment >= model_.segments.size())
    throw InvalidArgument(fmt::format("mark_ready({}): the model has {} gradient segments", segment,
                                      model_.segments.size()));
  if (no_sync_depth_ > 0) return;
  const std::string& name = model_.segments[segment].name;
  if (!in_step_)
    throw InvalidArgument(fmt::format(
        "mark_ready('{}') outside a step: call begin_step(step) before the forward pass", name));
  if (ready_[segment])
    throw InvalidArgument(fmt::format(
        "parameter '{}' was reported ready twice in one backward pass at step {} (a module must "
        "report each of its parameters once)",
        name, step_));
  ready_[segment] = 1;
  --pending_[bucket_of_[segment]];
  launch_ready_buckets();
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
  std::vector<std::size_t> missing;
  for (std::size_t s = 0; s < ready_.size(); ++s)
    if (!ready_[s]) missing.push_back(s);
  if (!missing.empty())
    while (next_launch_ < buckets_.size()) runner_->launch(next_launch_++);
  runner_->wait_all();
  if (missing.empty()) return;
  std::string others;
  for (std::size_t i = 1; i < std::min<std::size_t>(missing.size(), 4); ++i)
    others += fmt::format("{}'{}'", i > 1 ? ", " : "", model_.segments[missing[i]].name);
  if (missing.size() > 4) others += fmt::format(" and {} more", missing.size() - 4);
  throw InvalidArgument(fmt::format(
      "finish() at step {}: parameter '{}' (segment {} of {}) was never reported ready in this "
      "backward pass{}; the module that owns it must call mark_ready after writing its gradient, "
      "also when the gradient is zero",
      step_, model_.segments[missing.front()].name, missing.front(), model_.segments.size(),
      others.empty() ? "" : " (nor were " + others + ")"));
}

// Note [wire scaling]: with a 16-bit wire format each rank divides by the
// world size before rounding, as PyTorch's compression hooks do: the sum of N
// f16 gradients could overflow 65504 where their mean does not.
void GradientSynchronizer::reduce_bucket(std::size_t b, const core::Stream& stream) {
  const Bucket& bucket = buckets_[b];
  OperationContext context(bucket_names_[b], static_cast<std::int64_t>(b));
  Communicator& comm = thread_comm_ ? *thread_comm_ : comm_;
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

}  // namespace lockstep::comm
