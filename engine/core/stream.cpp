// Stream and Event (engine/core/stream.h).
#include "engine/core/stream.h"

#include <map>
#include <mutex>

#include "engine/core/memory.h"
#include "kernels/error.h"
#include "kernels/gemm.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace lockstep::core {

// Note [gemm workspace]: cuBLASLt may use a GEMM's workspace until the GEMM
// finishes, so two streams must not share one. A created stream's workspace
// belongs to its State: allocated in the stream's order on first use, and
// freed in that order when the last copy of the stream goes, just before the
// stream is destroyed. Nothing is keyed by the raw handle, which CUDA hands
// out again after a destroy. The Storage is ordered on a Stream that does not
// own the State (a State owning itself would never go). The default stream of
// a device lives as long as the process, and so does its workspace.
struct Stream::State {
  kernels::CudaStream raw = nullptr;
  std::mutex mutex;
  std::shared_ptr<Storage> gemm_workspace;
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    gemm_workspace.reset();
#if LOCKSTEP_WITH_CUDA
    if (raw) cudaStreamDestroy(raw);
#endif
  }
};

Stream Stream::default_for(Device device) {
  Stream s;
  s.device_ = device;
  return s;
}

Stream Stream::create(Device device) {
  Stream s;
  s.device_ = device;
#if LOCKSTEP_WITH_CUDA
  if (device.is_cuda()) {
    set_current_device(device);
    auto state = std::make_shared<State>();
    LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&state->raw, cudaStreamNonBlocking));
    s.handle_ = state->raw;
    s.state_ = std::move(state);
  }
#endif
  return s;
}

// Note [default stream device]: a null handle names the legacy default stream
// of the thread's *current* device, so every call that passes one makes the
// stream's device current first; otherwise a thread with another GPU current
// would synchronise, wait or record on that GPU's stream instead. Events are
// created on the current device too, and must share their stream's.
void Stream::synchronize() const {
#if LOCKSTEP_WITH_CUDA
  if (!device_.is_cuda()) return;
  if (!handle_) set_current_device(device_);
  LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(handle_));
#endif
}

bool Stream::capturing() const {
#if LOCKSTEP_WITH_CUDA
  if (!device_.is_cuda() || !handle_) return false;  // the legacy stream cannot capture
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  LOCKSTEP_CHECK_CUDA(cudaStreamIsCapturing(handle_, &status));
  return status != cudaStreamCaptureStatusNone;
#else
  return false;
#endif
}

void Stream::wait(const Event& event) const {
#if LOCKSTEP_WITH_CUDA
  if (!device_.is_cuda() || !event.handle()) return;
  if (!handle_) set_current_device(device_);
  LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(handle_, event.handle(), 0));
#else
  (void)event;
#endif
}

void* Stream::gemm_workspace() const {
  if (!device_.is_cuda())
    throw InvalidArgument("gemm_workspace: the cpu stream has none (GEMMs on the cpu need none)");
  const std::size_t bytes = kernels::cuda::kGemmWorkspaceBytes;
  if (!state_) {  // the default stream: one per device, for the process
    static std::mutex mutex;
    static auto* workspaces = new std::map<int, std::shared_ptr<Storage>>;  // Note [gemm workspace]
    std::lock_guard lock(mutex);
    std::shared_ptr<Storage>& slot = (*workspaces)[device_.index];
    if (!slot) slot = allocate(device_, bytes, *this);
    return slot->data();
  }
  std::lock_guard lock(state_->mutex);
  if (!state_->gemm_workspace) {
    Stream borrowed = default_for(device_);
    borrowed.handle_ = handle_;
    state_->gemm_workspace = allocate(device_, bytes, borrowed);
  }
  return state_->gemm_workspace->data();
}

void Event::record(const Stream& stream) {
#if LOCKSTEP_WITH_CUDA
  if (!stream.device().is_cuda()) return;
  set_current_device(stream.device());  // Note [default stream device]
  if (!handle_) {
    cudaEvent_t raw = nullptr;
    LOCKSTEP_CHECK_CUDA(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming));
    handle_.reset(raw, [](cudaEvent_t h) { cudaEventDestroy(h); });
  }
  LOCKSTEP_CHECK_CUDA(cudaEventRecord(handle_.get(), stream.handle()));
#else
  (void)stream;
#endif
}

void Event::synchronize() const {
#if LOCKSTEP_WITH_CUDA
  if (handle_) LOCKSTEP_CHECK_CUDA(cudaEventSynchronize(handle_.get()));
#endif
}

bool Event::ready() const {
#if LOCKSTEP_WITH_CUDA
  if (!handle_) return true;
  const cudaError_t status = cudaEventQuery(handle_.get());
  if (status == cudaErrorNotReady) {
    // "Not yet" is an answer, not a failure, but CUDA records it as the
    // thread's last error, where the next launch check would find it: clear
    // it, as PyTorch's event query does.
    cudaGetLastError();
    return false;
  }
  LOCKSTEP_CHECK_CUDA(status);
#endif
  return true;
}

}  // namespace lockstep::core
