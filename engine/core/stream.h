// Stream and Event: ordering of work on a device. On the CPU every operation
// completes before it returns, so both are no-ops there; on CUDA they wrap
// cudaStream_t and cudaEvent_t (created without timing: cheaper to record).
// A stream also owns the GEMM workspace of the work queued on it. Calls that
// need it make the stream's device current for the calling thread.
#pragma once

#include <memory>

#include "engine/core/device.h"
#include "kernels/stream.h"

namespace lockstep::core {

class Event;
class Storage;

class Stream {
 public:
  // The CPU "stream": everything synchronous.
  Stream() = default;
  // The legacy default stream of a GPU.
  static Stream default_for(Device device);
  // A new non-blocking stream on `device` (cpu: the CPU stream).
  static Stream create(Device device);

  Device device() const { return device_; }
  kernels::CudaStream handle() const { return handle_; }
  void synchronize() const;
  // Whether work queued now is being captured into a CUDA graph (never on
  // the CPU); such work runs only when the graph is launched.
  bool capturing() const;
  // Work queued on this stream after the call waits until `event` has happened.
  void wait(const Event& event) const;

  // cuBLASLt's workspace (kernels::cuda::kGemmWorkspaceBytes) for the GEMMs
  // queued on this GPU stream; Note [gemm workspace].
  void* gemm_workspace() const;

 private:
  struct State;
  Device device_;
  kernels::CudaStream handle_ = nullptr;  // null: CPU, or the default stream
  std::shared_ptr<State> state_;          // created streams: owns handle_
};

class Event {
 public:
  Event() = default;
  // Records the point `stream` has reached.
  void record(const Stream& stream);
  void synchronize() const;
  bool ready() const;  // has the recorded work finished?
  CUevent_st* handle() const { return handle_.get(); }

 private:
  std::shared_ptr<CUevent_st> handle_;
};

}  // namespace lockstep::core
