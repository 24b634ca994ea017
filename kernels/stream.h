// The one CUDA type kernels/ headers mention: a stream handle, declared the way
// cuda_runtime_api.h declares it, so that CPU-only code needs no CUDA headers.
#pragma once

struct CUstream_st;
struct CUevent_st;

namespace lockstep::kernels {
using CudaStream = CUstream_st*;
}  // namespace lockstep::kernels
