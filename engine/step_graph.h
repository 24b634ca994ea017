// StepGraph: the data-parallel step's forward and backward passes captured
// once into a CUDA graph and replayed on later steps of the same shapes
// (StepOptions::cuda_graph; Note [step graph]). DataParallelStep owns one and
// asks it, step by step, whether to run eagerly, capture or replay.
//
// Note [step graph]: a step's device work is queued by thousands of kernel
// launches from the host; replaying a captured graph queues it with one. What
// is captured: zeroing the gradients, the synchroniser's begin_step, every
// micro-batch's forward, loss and backward with the bucket allreduces that
// backward starts, and the synchroniser's finish: everything run() does before
// the step's one read of the device (Note [one read per step]). The update
// after it (unscale, the read, agreement, clipping, the optimizer) stays on
// the host's side, eager: its decisions depend on values read back, and its
// kernels are a few dozen launches.
// A replay repeats the capture's kernels with the capture's arguments, so:
//   - inputs: each micro-batch's tensors are copied into the graph's own
//     (static) tensors before the launch; a step whose tensors differ in name,
//     shape, type or count from the captured step's runs eagerly;
//   - the loss gradient (loss scale / K / divisor) is an argument of the loss's
//     backward: a new f16 loss scale captures again (rare: a back-off, a growth);
//   - the step number is frozen: Dropout, whose keys use it, refuses capture
//     (Context::graph_capture), as does anything else that reads Context::step;
//   - the embedding lookups' index checks (Note [deferred index check]) are
//     the capture's: the step restores them before each replay, since an
//     eager step in between registers its own;
//   - host code inside modules runs once, at the capture; whatever it decides
//     per step (a weight copy's version check) is decided then. Weights change
//     between steps only through the optimizer, which writes the autocast
//     copies itself or leaves them to the captured casts;
//   - memory the passes allocate is the arena's (Note [capture arena]).
// Before the first capture of a shape the step runs eagerly kWarmupSteps
// times: the first makes the GEMM and convolution plans by timing (which a
// capture cannot do), the SDPA plans and the modules' kept tensors; the
// second runs as the graph will.
// Not captured (refused at construction): a world of more than one rank (the
// watchdog cannot see collectives inside a graph, and every rank would have
// to capture alike; not built), ZeRO (its gathers and shards decide on the
// host mid-pass), the rank-invariant step (its chunk tree), the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/capture_arena.h"
#include "engine/core/cuda_graph.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::engine {

struct MicroBatch;  // engine/data_parallel_step.h

struct StepGraphCounts {
  std::int64_t eager = 0;     // steps run eagerly (warm-up, other shapes)
  std::int64_t captures = 0;  // graphs captured
  std::int64_t replays = 0;   // steps run by launching the graph (the capture's own included)
  std::size_t nodes = 0;      // in the latest graph
  std::size_t arena_bytes = 0;
  std::string last_eager_reason;  // why the latest eager step after a capture was eager
};

class StepGraph {
 public:
  static constexpr int kWarmupSteps = 2;
  enum class Action { eager, capture, replay };

  StepGraph(core::Device device, core::Stream stream);
  ~StepGraph();

  // What this step does, from its micro-batches' tensors and the loss gradient.
  Action next(std::span<const MicroBatch> batches, float dloss);
  // For a capture: the graph's own copies of `batches` (copied on the stream),
  // which the captured passes must read.
  std::span<const MicroBatch> stage(std::span<const MicroBatch> batches);
  // Captures what `record` queues (the passes over stage()'s batches),
  // replacing any earlier graph, and launches it once for this step.
  void capture(const std::function<void()>& record);
  // Copies `batches` into the graph's tensors and launches it.
  void replay(std::span<const MicroBatch> batches);
  const StepGraphCounts& counts() const { return counts_; }

 private:
  struct Key {
    std::vector<std::string> names;
    std::vector<std::vector<std::int64_t>> shapes;
    std::vector<DType> dtypes;
    float dloss = 0.0f;
    bool same_shapes(const Key& o) const {
      return names == o.names && shapes == o.shapes && dtypes == o.dtypes;
    }
  };
  Key key_of(std::span<const MicroBatch> batches, float dloss) const;

  core::Device device_;
  core::Stream stream_;
  core::CaptureArena arena_;
  std::unique_ptr<core::CudaGraph> graph_;
  Key graph_key_;  // the captured step's
  Key last_key_;   // the latest step's
  int same_shape_steps_ = 0;
  Key pending_key_;  // next()'s decision to capture, for capture()
  std::vector<MicroBatch> static_batches_;
  StepGraphCounts counts_;
};

}  // namespace lockstep::engine
