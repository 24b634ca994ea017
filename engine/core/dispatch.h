// Device dispatch for code that calls kernels/ directly (ops, layers): runs
// on_cpu() for a CPU device, or on_gpu(stream handle) for a GPU one. Given the
// CPU stream with a GPU device, the work goes to the device's default stream
// and is waited for before returning: the CPU stream means "synchronous".
#pragma once

#include "engine/core/device.h"
#include "engine/core/stream.h"

namespace lockstep::core {

template <typename OnCpu, typename OnGpu>
void dispatch(Device device, [[maybe_unused]] const Stream& stream, OnCpu&& on_cpu,
              [[maybe_unused]] OnGpu&& on_gpu) {
  if (!device.is_cuda()) {
    on_cpu();
    return;
  }
#if LOCKSTEP_WITH_CUDA
  const bool synchronous = !stream.device().is_cuda();
  if (synchronous) set_current_device(device);
  const Stream s = synchronous ? Stream::default_for(device) : stream;
  on_gpu(s.handle());
  if (synchronous) s.synchronize();
#else
  require_usable(device);  // throws: no CUDA in this build
#endif
}

}  // namespace lockstep::core
