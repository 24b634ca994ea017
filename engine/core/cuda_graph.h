// CudaGraph: work queued on one GPU stream, captured once into a CUDA graph
// and launched again as one unit (cudaStreamBeginCapture in the relaxed
// mode, cudaGraphInstantiate, cudaGraphLaunch). What the work allocates comes
// from a CaptureArena (Note [capture arena], engine/core/capture_arena.h). The
// data-parallel step's use of it: Note [step graph], engine/step_graph.h.
#pragma once

#include <functional>
#include <memory>

#include "engine/core/capture_arena.h"
#include "engine/core/stream.h"

namespace lockstep::core {

class CudaGraph {
 public:
  // Runs `record` with `stream` capturing and this thread allocating from
  // `arena`, then instantiates what it queued. Nothing runs on the device
  // until launch(). When `record` throws, or CUDA refuses the capture (a call
  // that waits for the device, work on the legacy stream), the capture ends,
  // nothing is kept, and the error goes on with what was being captured.
  // Throws InvalidArgument for a CPU stream or the legacy default stream.
  // The arena must outlive the graph (Note [capture arena]: from the capture
  // on, pool memory freed is kept until the graph goes).
  CudaGraph(const Stream& stream, CaptureArena& arena, const std::function<void()>& record);
  // Destroy it only when no launch of it is still running (synchronize the
  // streams it was launched on first).
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Queues the whole graph on `stream` (the capture's stream, or another of its device).
  void launch(const Stream& stream) const;
  std::size_t nodes() const { return nodes_; }

 private:
  struct Handles;
  std::unique_ptr<Handles> handles_;
  CaptureArena* arena_ = nullptr;
  std::size_t nodes_ = 0;
};

}  // namespace lockstep::core
