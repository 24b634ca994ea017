// The cuDNN handle for the calling thread on the current device, bound to
// `stream`. A handle is not safe to use from two threads at once, so each
// (thread, device) gets its own, created on first use; cudnnSetStream per call
// is cheap. Handles are never destroyed: a thread's map is leaked on purpose,
// as cuDNN handles must not be destroyed after the CUDA runtime shut down,
// which exit-time destructors cannot rule out (see kernels/cuda/gemm.cu).
#pragma once

#include <map>

#include "kernels/cuda/check.h"
#include "kernels/cuda/check_cudnn.h"
#include "kernels/stream.h"

namespace lockstep::kernels::cuda::detail {

inline cudnnHandle_t cudnn_handle(CudaStream stream) {
  thread_local auto* handles = new std::map<int, cudnnHandle_t>;
  int device = 0;
  LOCKSTEP_CHECK_CUDA(cudaGetDevice(&device));
  cudnnHandle_t& handle = (*handles)[device];
  if (!handle) LOCKSTEP_CHECK_CUDNN(cudnnCreate(&handle));
  LOCKSTEP_CHECK_CUDNN(cudnnSetStream(handle, stream));
  return handle;
}

}  // namespace lockstep::kernels::cuda::detail
