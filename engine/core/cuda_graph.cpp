// CudaGraph (engine/core/cuda_graph.h).
#include "engine/core/cuda_graph.h"

#include <exception>
#include <string>

#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace lockstep::core {

#if LOCKSTEP_WITH_CUDA
struct CudaGraph::Handles {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Handles() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

CudaGraph::CudaGraph(const Stream& stream, CaptureArena& arena, const std::function<void()>& record)
    : handles_(std::make_unique<Handles>()) {
  if (!stream.device().is_cuda() || !stream.handle())
    throw InvalidArgument(
        "CudaGraph: capture needs a stream made by Stream::create on a GPU, not " +
        std::string(stream.device().is_cuda() ? "the legacy default stream of "
                                              : "the CPU stream of ") +
        stream.device().str());
  if (!(arena.device() == stream.device()))
    throw InvalidArgument("CudaGraph: the arena is on " + arena.device().str() +
                          ", the stream on " + stream.device().str());
  set_current_device(stream.device());
  arena_ = &arena;
  arena.begin_graph();  // Note [capture arena]: what the pool held so far is kept if freed
  // Relaxed: this thread may still call cudaMalloc (the arena's chunks) and
  // create events while it captures; everything else that waits for the
  // device fails the capture, as it would in the other modes.
  if (const cudaError_t began =
          cudaStreamBeginCapture(stream.handle(), cudaStreamCaptureModeRelaxed);
      began != cudaSuccess) {
    arena.end_graph();
    LOCKSTEP_CHECK_CUDA(began);
  }
  std::exception_ptr failure;
  try {
    CaptureArenaScope scope(arena);
    record();
  } catch (...) {
    failure = std::current_exception();
  }
  const cudaError_t ended = cudaStreamEndCapture(stream.handle(), &handles_->graph);
  try {
    if (failure) {
      cudaGetLastError();  // the capture's own error is the one to report
      std::rethrow_exception(failure);
    }
    LOCKSTEP_CHECK_CUDA(ended);
    LOCKSTEP_CHECK_CUDA(cudaGraphGetNodes(handles_->graph, nullptr, &nodes_));
    LOCKSTEP_CHECK_CUDA(cudaGraphInstantiateWithFlags(&handles_->exec, handles_->graph, 0));
  } catch (...) {
    handles_.reset();
    arena.end_graph();
    throw;
  }
}

void CudaGraph::launch(const Stream& stream) const {
  set_current_device(stream.device());
  LOCKSTEP_CHECK_CUDA(cudaGraphLaunch(handles_->exec, stream.handle()));
}
#else
struct CudaGraph::Handles {};

CudaGraph::CudaGraph(const Stream& stream, CaptureArena&, const std::function<void()>&) {
  throw InvalidArgument("CudaGraph on " + stream.device().str() + ": this build has no CUDA");
}

void CudaGraph::launch(const Stream&) const {}
#endif

CudaGraph::~CudaGraph() {
  handles_.reset();
  if (arena_) arena_->end_graph();
}

}  // namespace lockstep::core
