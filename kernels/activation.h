// Activations on raw buffers of a float type, computed in f32: ReLU and GELU
// (exact, with erf, and PyTorch's tanh approximation). The backward takes the
// forward's input x (for ReLU the output works too: same sign).
#pragma once

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

enum class Activation { relu, gelu_exact, gelu_tanh };

namespace cpu {
void activation_forward(Activation act, const void* x, void* y, DType type, std::int64_t n);
// dx = dy * act'(x); dx may alias dy.
void activation_backward(Activation act, const void* dy, const void* x, void* dx, DType type,
                         std::int64_t n);
}  // namespace cpu

namespace cuda {
void activation_forward(Activation act, const void* x, void* y, DType type, std::int64_t n,
                        CudaStream stream);
void activation_backward(Activation act, const void* dy, const void* x, void* dx, DType type,
                         std::int64_t n, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
