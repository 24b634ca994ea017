// StepGraph (engine/step_graph.h): Note [step graph].
#include "engine/step_graph.h"

#include <fmt/format.h>

#include "engine/data_parallel_step.h"
#include "engine/kernel_paths.h"
#include "kernels/error.h"

namespace lockstep::engine {

StepGraph::StepGraph(core::Device device, core::Stream stream)
    : device_(device), stream_(std::move(stream)), arena_(device) {
  if (!stream_.device().is_cuda() || !stream_.handle())
    throw InvalidArgument(
        "StepOptions::cuda_graph: the step's stream is the legacy default stream of " +
        device_.str() + ", which cannot be captured; give the step a core::Stream::create(device)");
}

StepGraph::~StepGraph() {
  if (graph_) {
    try {
      stream_.synchronize();  // a launch in flight uses the arena
    } catch (...) {           // a broken stream has reported its error already
    }
  }
}

StepGraph::Key StepGraph::key_of(std::span<const MicroBatch> batches, float dloss) const {
  Key key;
  key.dloss = dloss;
  for (std::size_t k = 0; k < batches.size(); ++k)
    for (const auto& [name, tensor] : batches[k].tensors()) {
      if (!(tensor.device() == device_))
        throw InvalidArgument(fmt::format(
            "StepOptions::cuda_graph: the micro-batch's '{}' is on {}, the model on {}; move it "
            "to the model's device first",
            name, tensor.device().str(), device_.str()));
      key.names.push_back(fmt::format("{}:{}", k, name));
      key.shapes.push_back(tensor.shape());
      key.dtypes.push_back(tensor.dtype());
    }
  return key;
}

StepGraph::Action StepGraph::next(std::span<const MicroBatch> batches, float dloss) {
  Key key = key_of(batches, dloss);
  const bool same_as_last = key.same_shapes(last_key_);
  same_shape_steps_ = same_as_last ? same_shape_steps_ + 1 : 1;
  last_key_ = key;
  if (graph_ && key.same_shapes(graph_key_)) {
    if (key.dloss == graph_key_.dloss) return Action::replay;
    pending_key_ = std::move(key);  // a new loss scale: the shapes are warm already
    return Action::capture;
  }
  if (same_shape_steps_ > kWarmupSteps) {
    pending_key_ = std::move(key);
    return Action::capture;
  }
  ++counts_.eager;
  if (graph_) {
    counts_.last_eager_reason = "the micro-batches' shapes differ from the captured step's";
    note_kernel_path("step", "eager", counts_.last_eager_reason);
  } else {
    note_kernel_path("step", "eager", "warm-up before the capture");
  }
  return Action::eager;
}

std::span<const MicroBatch> StepGraph::stage(std::span<const MicroBatch> batches) {
  static_batches_.clear();
  auto copy = [&](const core::Tensor& t) {
    if (!t.defined()) return core::Tensor();
    core::Tensor s = core::Tensor::empty(t.shape(), t.dtype(), device_, stream_);
    s.copy_from(t, stream_);
    return s;
  };
  for (const MicroBatch& b : batches) {
    MicroBatch s{copy(b.inputs), copy(b.targets), {}};
    for (const auto& [name, tensor] : b.named) s.named.set(name, copy(tensor));
    static_batches_.push_back(std::move(s));
  }
  return static_batches_;
}

void StepGraph::capture(const std::function<void()>& record) {
  if (graph_) {
    stream_.synchronize();  // the old graph may still run; its memory is the arena's
    graph_.reset();
  }
  try {
    graph_ = std::make_unique<core::CudaGraph>(stream_, arena_, record);
  } catch (const Error& e) {
    throw InvalidArgument(fmt::format(
        "StepOptions::cuda_graph: capturing the step into a CUDA graph failed: {} (Note [step "
        "graph]: run without the CUDA graph step, e.g. without lockstep-train --cuda-graph)",
        e.what()));
  }
  graph_key_ = pending_key_;
  ++counts_.captures;
  counts_.nodes = graph_->nodes();
  counts_.arena_bytes = arena_.reserved_bytes();
  graph_->launch(stream_);
  ++counts_.replays;
  note_kernel_path("step", "cuda graph");
}

void StepGraph::replay(std::span<const MicroBatch> batches) {
  for (std::size_t k = 0; k < batches.size(); ++k) {
    const MicroBatch& from = batches[k];
    MicroBatch& to = static_batches_[k];
    to.inputs.copy_from(from.inputs, stream_);
    if (from.targets.defined()) to.targets.copy_from(from.targets, stream_);
    for (const auto& [name, tensor] : from.named) {
      core::Tensor into = *to.named.find(name);  // a handle on the graph's tensor
      into.copy_from(tensor, stream_);
    }
  }
  graph_->launch(stream_);
  ++counts_.replays;
  note_kernel_path("step", "cuda graph");
}

}  // namespace lockstep::engine
