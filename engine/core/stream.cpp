// Stream and Event (engine/core/stream.h).
#include "engine/core/stream.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace lockstep::core {

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
    cudaStream_t raw = nullptr;
    LOCKSTEP_CHECK_CUDA(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    s.handle_.reset(raw, [](cudaStream_t h) { cudaStreamDestroy(h); });
  }
#endif
  return s;
}

void Stream::synchronize() const {
#if LOCKSTEP_WITH_CUDA
  if (device_.is_cuda()) LOCKSTEP_CHECK_CUDA(cudaStreamSynchronize(handle()));
#endif
}

void Stream::wait(const Event& event) const {
#if LOCKSTEP_WITH_CUDA
  if (device_.is_cuda() && event.handle())
    LOCKSTEP_CHECK_CUDA(cudaStreamWaitEvent(handle(), event.handle(), 0));
#else
  (void)event;
#endif
}

void Event::record(const Stream& stream) {
#if LOCKSTEP_WITH_CUDA
  if (!stream.device().is_cuda()) return;
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
  if (status == cudaErrorNotReady) return false;
  LOCKSTEP_CHECK_CUDA(status);
#endif
  return true;
}

}  // namespace lockstep::core
