// Device dispatch for code that calls kernels/ directly (ops, layers,
// optimizers): runs on_cpu() for a CPU device, or on_gpu for a GPU one with
// that GPU current. Given the CPU stream with a GPU device, the work goes to
// the device's default stream and is waited for before returning: the CPU
// stream means "synchronous". dispatch's on_gpu takes the stream's handle
// (what kernels/ takes); dispatch_stream's takes the Stream itself, for work
// that allocates on it or uses its GEMM workspace.
#pragma once

#include <string>

#include "engine/core/device.h"
#include "engine/core/stream.h"
#include "kernels/error.h"

namespace lockstep::core {

template <typename OnCpu, typename OnGpu>
void dispatch_stream(Device device, [[maybe_unused]] const Stream& stream, OnCpu&& on_cpu,
                     [[maybe_unused]] OnGpu&& on_gpu) {
  if (!device.is_cuda()) {
    on_cpu();
    return;
  }
#if LOCKSTEP_WITH_CUDA
  const bool synchronous = !stream.device().is_cuda();
  if (!synchronous && !(stream.device() == device))
    throw InvalidArgument("work on " + device.str() + " given a stream of " +
                          stream.device().str() + " (use a stream of the tensors' device)");
  // Kernels launch into, and cuBLASLt's handle is picked for, the current
  // device, whatever stream they are given.
  set_current_device(device);
  const Stream s = synchronous ? Stream::default_for(device) : stream;
  on_gpu(s);
  if (synchronous) s.synchronize();
#else
  require_usable(device);  // throws: no CUDA in this build
#endif
}

template <typename OnCpu, typename OnGpu>
void dispatch(Device device, const Stream& stream, OnCpu&& on_cpu, OnGpu&& on_gpu) {
  dispatch_stream(device, stream, on_cpu, [&](const Stream& s) { on_gpu(s.handle()); });
}

}  // namespace lockstep::core
