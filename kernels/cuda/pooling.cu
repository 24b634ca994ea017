// CUDA pooling (kernels/pooling.h): one thread per output for the forwards,
// one per input element for the backwards, which gather over the windows that
// cover the element in (oh, ow) order, as the CPU loops do. Global average
// pooling gives each plane one thread that sums it in index order in f64.
// Channels-last calls (Note [channels-last pooling]) have kernels of their
// own with the channel innermost in the thread index, so a warp reads and
// writes consecutive channels (in 16-byte packs where they fit: Note
// [channels-last pooling packs]); each channel gets the NCHW thread's work in
// the same order, hence the same bits.
#include <math_constants.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_float.cuh"
#include "kernels/pooling.h"

namespace lockstep::kernels::cuda {
namespace {

using detail::from_f32;
using detail::kThreads;
using detail::to_f32;

// The window of output (oh, ow) clipped to the input: rows [h0, h1), cols [w0, w1).
struct Window {
  std::int64_t h0, h1, w0, w1;
};
__device__ Window window(const Pool2dShape& s, std::int64_t oh, std::int64_t ow) {
  const std::int64_t h = oh * s.stride_h - s.pad_h, w = ow * s.stride_w - s.pad_w;
  return {h > 0 ? h : 0, min(h + s.kernel_h, s.in_h), w > 0 ? w : 0, min(w + s.kernel_w, s.in_w)};
}

// Outputs along one axis whose windows cover input index i: [lo, hi).
__device__ void covering(std::int64_t i, std::int64_t pad, std::int64_t kernel, std::int64_t stride,
                         std::int64_t outputs, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t padded = i + pad;
  lo = padded < kernel ? 0 : (padded - kernel) / stride + 1;
  hi = min(outputs, padded / stride + 1);
}

__device__ float avg_divisor(const Pool2dShape& s, bool count_include_pad, const Window& w) {
  return count_include_pad ? static_cast<float>(s.kernel_h * s.kernel_w)
                           : static_cast<float>((w.h1 - w.h0) * (w.w1 - w.w0));
}

__device__ std::int64_t first_index() {
  return blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x;
}
__device__ std::int64_t grid_size() { return std::int64_t{gridDim.x} * blockDim.x; }

template <typename T>
__global__ void max_forward_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n, const T* x,
                                   T* y, std::int32_t* argmax) {
  const std::int64_t out_hw = oh_n * ow_n;
  for (std::int64_t o = first_index(); o < s.batch * s.channels * out_hw; o += grid_size()) {
    const std::int64_t p = o / out_hw, oh = o % out_hw / ow_n, ow = o % ow_n;
    const Window w = window(s, oh, ow);
    const T* plane = x + p * s.in_h * s.in_w;
    float best = -CUDART_INF_F;
    std::int64_t best_index = w.h0 * s.in_w + w.w0;
    for (std::int64_t ih = w.h0; ih < w.h1; ++ih)
      for (std::int64_t iw = w.w0; iw < w.w1; ++iw) {
        const float v = to_f32(plane[ih * s.in_w + iw]);
        if (v > best || isnan(v)) {  // Note [max pool ties]
          best = v;
          best_index = ih * s.in_w + iw;
        }
      }
    y[o] = from_f32<T>(best);
    if (argmax) argmax[o] = static_cast<std::int32_t>(best_index);
  }
}

template <typename T>
__global__ void max_backward_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n,
                                    const T* dy, const std::int32_t* argmax, T* dx) {
  const std::int64_t out_hw = oh_n * ow_n;
  const std::int64_t in_hw = s.in_h * s.in_w;
  for (std::int64_t i = first_index(); i < s.batch * s.channels * in_hw; i += grid_size()) {
    const std::int64_t p = i / in_hw, ih = i % in_hw / s.in_w, iw = i % s.in_w;
    std::int64_t oh0, oh1, ow0, ow1;
    covering(ih, s.pad_h, s.kernel_h, s.stride_h, oh_n, oh0, oh1);
    covering(iw, s.pad_w, s.kernel_w, s.stride_w, ow_n, ow0, ow1);
    const std::int32_t self = static_cast<std::int32_t>(ih * s.in_w + iw);
    float acc = 0.0f;
    for (std::int64_t oh = oh0; oh < oh1; ++oh)
      for (std::int64_t ow = ow0; ow < ow1; ++ow) {
        const std::int64_t o = p * out_hw + oh * ow_n + ow;
        if (argmax[o] == self) acc += to_f32(dy[o]);
      }
    dx[i] = from_f32<T>(acc);
  }
}

template <typename T>
__global__ void avg_forward_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n,
                                   bool count_include_pad, const T* x, T* y) {
  const std::int64_t out_hw = oh_n * ow_n;
  for (std::int64_t o = first_index(); o < s.batch * s.channels * out_hw; o += grid_size()) {
    const std::int64_t p = o / out_hw, oh = o % out_hw / ow_n, ow = o % ow_n;
    const Window w = window(s, oh, ow);
    const T* plane = x + p * s.in_h * s.in_w;
    float sum = 0.0f;
    for (std::int64_t ih = w.h0; ih < w.h1; ++ih)
      for (std::int64_t iw = w.w0; iw < w.w1; ++iw) sum += to_f32(plane[ih * s.in_w + iw]);
    y[o] = from_f32<T>(sum / avg_divisor(s, count_include_pad, w));
  }
}

template <typename T>
__global__ void avg_backward_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n,
                                    bool count_include_pad, const T* dy, T* dx) {
  const std::int64_t out_hw = oh_n * ow_n;
  const std::int64_t in_hw = s.in_h * s.in_w;
  for (std::int64_t i = first_index(); i < s.batch * s.channels * in_hw; i += grid_size()) {
    const std::int64_t p = i / in_hw, ih = i % in_hw / s.in_w, iw = i % s.in_w;
    std::int64_t oh0, oh1, ow0, ow1;
    covering(ih, s.pad_h, s.kernel_h, s.stride_h, oh_n, oh0, oh1);
    covering(iw, s.pad_w, s.kernel_w, s.stride_w, ow_n, ow0, ow1);
    float acc = 0.0f;
    for (std::int64_t oh = oh0; oh < oh1; ++oh)
      for (std::int64_t ow = ow0; ow < ow1; ++ow)
        acc += to_f32(dy[p * out_hw + oh * ow_n + ow]) /
               avg_divisor(s, count_include_pad, window(s, oh, ow));
    dx[i] = from_f32<T>(acc);
  }
}

template <typename T>
__global__ void global_avg_forward_kernel(std::int64_t planes, std::int64_t spatial, const T* x,
                                          T* y) {
  for (std::int64_t p = first_index(); p < planes; p += grid_size()) {
    double sum = 0.0;
    for (std::int64_t i = p * spatial; i < (p + 1) * spatial; ++i) sum += to_f32(x[i]);
    y[p] = from_f32<T>(static_cast<float>(sum / static_cast<double>(spatial)));
  }
}

template <typename T>
__global__ void global_avg_backward_kernel(std::int64_t planes, std::int64_t spatial, const T* dy,
                                           T* dx) {
  for (std::int64_t i = first_index(); i < planes * spatial; i += grid_size()) {
    dx[i] = from_f32<T>(static_cast<float>(to_f32(dy[i / spatial]) / static_cast<double>(spatial)));
  }
}

// Note [channels-last pooling packs]: an NHWC thread takes V consecutive
// channels of one pixel, loaded and stored as one 16-byte access (8 f16/bf16
// or 4 f32 values) where the channel count is a multiple of V and the data
// pointers are 16-byte aligned (resnet's 64 to 2048 channels), else V = 1: the
// index arithmetic is paid once per pack instead of per value. Each channel
// is scanned and summed exactly as the one-value thread does it, so V never
// changes a bit. argmax stays one i32 per output, in NHWC order.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// An NHWC pack index (packs_per_pixel = channels / V) split into its image,
// row, column and pack within the pixel.
struct Nhwc {
  std::int64_t n, h, w, pack;
};
__device__ Nhwc split_nhwc(std::int64_t i, std::int64_t h_n, std::int64_t w_n,
                           std::int64_t packs_per_pixel) {
  const std::int64_t pixel = i / packs_per_pixel;
  return {pixel / (h_n * w_n), pixel / w_n % h_n, pixel % w_n, i % packs_per_pixel};
}

template <typename T, int V>
__global__ void max_forward_nhwc_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n,
                                        const Pack<T, V>* x, Pack<T, V>* y, std::int32_t* argmax) {
  const std::int64_t P = s.channels / V;
  for (std::int64_t o = first_index(); o < s.batch * oh_n * ow_n * P; o += grid_size()) {
    const Nhwc at = split_nhwc(o, oh_n, ow_n, P);
    const Window w = window(s, at.h, at.w);
    const Pack<T, V>* image = x + at.n * s.in_h * s.in_w * P + at.pack;
    float best[V];
    std::int64_t best_index[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      best[e] = -CUDART_INF_F;
      best_index[e] = w.h0 * s.in_w + w.w0;
    }
    for (std::int64_t ih = w.h0; ih < w.h1; ++ih)
      for (std::int64_t iw = w.w0; iw < w.w1; ++iw) {
        const Pack<T, V> in = image[(ih * s.in_w + iw) * P];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float v = to_f32(in.v[e]);
          if (v > best[e] || isnan(v)) {  // Note [max pool ties]
            best[e] = v;
            best_index[e] = ih * s.in_w + iw;
          }
        }
      }
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(best[e]);
    y[o] = out;
    if (argmax) {
#pragma unroll
      for (int e = 0; e < V; ++e) argmax[o * V + e] = static_cast<std::int32_t>(best_index[e]);
    }
  }
}

template <typename T, int V>
__global__ void max_backward_nhwc_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n,
                                         const Pack<T, V>* dy, const std::int32_t* argmax,
                                         Pack<T, V>* dx) {
  const std::int64_t P = s.channels / V;
  for (std::int64_t i = first_index(); i < s.batch * s.in_h * s.in_w * P; i += grid_size()) {
    const Nhwc at = split_nhwc(i, s.in_h, s.in_w, P);
    std::int64_t oh0, oh1, ow0, ow1;
    covering(at.h, s.pad_h, s.kernel_h, s.stride_h, oh_n, oh0, oh1);
    covering(at.w, s.pad_w, s.kernel_w, s.stride_w, ow_n, ow0, ow1);
    const std::int32_t self = static_cast<std::int32_t>(at.h * s.in_w + at.w);
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = 0.0f;
    for (std::int64_t oh = oh0; oh < oh1; ++oh)
      for (std::int64_t ow = ow0; ow < ow1; ++ow) {
        const std::int64_t o = ((at.n * oh_n + oh) * ow_n + ow) * P + at.pack;
        const Pack<T, V> grad = dy[o];
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (argmax[o * V + e] == self) acc[e] += to_f32(grad.v[e]);
      }
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(acc[e]);
    dx[i] = out;
  }
}

template <typename T, int V>
__global__ void avg_forward_nhwc_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n,
                                        bool count_include_pad, const Pack<T, V>* x,
                                        Pack<T, V>* y) {
  const std::int64_t P = s.channels / V;
  for (std::int64_t o = first_index(); o < s.batch * oh_n * ow_n * P; o += grid_size()) {
    const Nhwc at = split_nhwc(o, oh_n, ow_n, P);
    const Window w = window(s, at.h, at.w);
    const Pack<T, V>* image = x + at.n * s.in_h * s.in_w * P + at.pack;
    float sum[V];
#pragma unroll
    for (int e = 0; e < V; ++e) sum[e] = 0.0f;
    for (std::int64_t ih = w.h0; ih < w.h1; ++ih)
      for (std::int64_t iw = w.w0; iw < w.w1; ++iw) {
        const Pack<T, V> in = image[(ih * s.in_w + iw) * P];
#pragma unroll
        for (int e = 0; e < V; ++e) sum[e] += to_f32(in.v[e]);
      }
    const float divisor = avg_divisor(s, count_include_pad, w);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(sum[e] / divisor);
    y[o] = out;
  }
}

template <typename T, int V>
__global__ void avg_backward_nhwc_kernel(Pool2dShape s, std::int64_t oh_n, std::int64_t ow_n,
                                         bool count_include_pad, const Pack<T, V>* dy,
                                         Pack<T, V>* dx) {
  const std::int64_t P = s.channels / V;
  for (std::int64_t i = first_index(); i < s.batch * s.in_h * s.in_w * P; i += grid_size()) {
    const Nhwc at = split_nhwc(i, s.in_h, s.in_w, P);
    std::int64_t oh0, oh1, ow0, ow1;
    covering(at.h, s.pad_h, s.kernel_h, s.stride_h, oh_n, oh0, oh1);
    covering(at.w, s.pad_w, s.kernel_w, s.stride_w, ow_n, ow0, ow1);
    float acc[V];
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = 0.0f;
    for (std::int64_t oh = oh0; oh < oh1; ++oh)
      for (std::int64_t ow = ow0; ow < ow1; ++ow) {
        const Pack<T, V> grad = dy[((at.n * oh_n + oh) * ow_n + ow) * P + at.pack];
        const float divisor = avg_divisor(s, count_include_pad, window(s, oh, ow));
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] += to_f32(grad.v[e]) / divisor;
      }
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = from_f32<T>(acc[e]);
    dx[i] = out;
  }
}

// Calls f(std::integral_constant<int, V>{}) with V per Note [channels-last
// pooling packs] for these channels and pointers (null counts as aligned).
template <typename T, typename F>
void with_channel_packs(std::int64_t channels, std::initializer_list<const void*> pointers, F&& f) {
  constexpr int kPack = 16 / sizeof(T);
  bool fit = channels % kPack == 0;
  for (const void* p : pointers) fit = fit && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  if (fit)
    f(std::integral_constant<int, kPack>{});
  else
    f(std::integral_constant<int, 1>{});
}

// One thread per (image, channel), consecutive threads on consecutive
// channels; each sums its channel over the positions in order in f64.
template <typename T>
__global__ void global_avg_forward_nhwc_kernel(std::int64_t batch, std::int64_t spatial,
                                               std::int64_t channels, const T* x, T* y) {
  for (std::int64_t p = first_index(); p < batch * channels; p += grid_size()) {
    const T* column = x + p / channels * spatial * channels + p % channels;
    double sum = 0.0;
    for (std::int64_t i = 0; i < spatial; ++i) sum += to_f32(column[i * channels]);
    y[p] = from_f32<T>(static_cast<float>(sum / static_cast<double>(spatial)));
  }
}

template <typename T>
__global__ void global_avg_backward_nhwc_kernel(std::int64_t batch, std::int64_t spatial,
                                                std::int64_t channels, const T* dy, T* dx) {
  for (std::int64_t i = first_index(); i < batch * spatial * channels; i += grid_size()) {
    const std::int64_t p = i / (spatial * channels) * channels + i % channels;
    dx[i] = from_f32<T>(static_cast<float>(to_f32(dy[p]) / static_cast<double>(spatial)));
  }
}

}  // namespace

void max_pool2d_forward(const Pool2dShape& s, DType type, const void* x, void* y,
                        std::int32_t* argmax, CudaStream stream) {
  validate_pool2d(s);
  detail::dispatch_float(type, "max_pool2d_forward", [&](auto tag) {
    using T = decltype(tag);
    if (s.channels_last) {
      with_channel_packs<T>(s.channels, {x, y}, [&](auto pack) {
        constexpr int V = decltype(pack)::value;
        max_forward_nhwc_kernel<T, V>
            <<<detail::grid_for(s.batch * s.channels / V * s.out_h() * s.out_w()), kThreads, 0,
               stream>>>(s, s.out_h(), s.out_w(), static_cast<const Pack<T, V>*>(x),
                         static_cast<Pack<T, V>*>(y), argmax);
      });
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      return;
    }
    max_forward_kernel<T>
        <<<detail::grid_for(s.batch * s.channels * s.out_h() * s.out_w()), kThreads, 0, stream>>>(
            s, s.out_h(), s.out_w(), static_cast<const T*>(x), static_cast<T*>(y), argmax);
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void max_pool2d_backward(const Pool2dShape& s, DType type, const void* dy,
                         const std::int32_t* argmax, void* dx, CudaStream stream) {
  validate_pool2d(s);
  detail::dispatch_float(type, "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    if (s.channels_last) {
      with_channel_packs<T>(s.channels, {dy, dx}, [&](auto pack) {
        constexpr int V = decltype(pack)::value;
        max_backward_nhwc_kernel<T, V>
            <<<detail::grid_for(s.batch * s.channels / V * s.in_h * s.in_w), kThreads, 0, stream>>>(
                s, s.out_h(), s.out_w(), static_cast<const Pack<T, V>*>(dy), argmax,
                static_cast<Pack<T, V>*>(dx));
      });
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      return;
    }
    max_backward_kernel<T>
        <<<detail::grid_for(s.batch * s.channels * s.in_h * s.in_w), kThreads, 0, stream>>>(
            s, s.out_h(), s.out_w(), static_cast<const T*>(dy), argmax, static_cast<T*>(dx));
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void avg_pool2d_forward(const Pool2dShape& s, DType type, bool count_include_pad, const void* x,
                        void* y, CudaStream stream) {
  validate_pool2d(s);
  detail::dispatch_float(type, "avg_pool2d_forward", [&](auto tag) {
    using T = decltype(tag);
    if (s.channels_last) {
      with_channel_packs<T>(s.channels, {x, y}, [&](auto pack) {
        constexpr int V = decltype(pack)::value;
        avg_forward_nhwc_kernel<T, V>
            <<<detail::grid_for(s.batch * s.channels / V * s.out_h() * s.out_w()), kThreads, 0,
               stream>>>(s, s.out_h(), s.out_w(), count_include_pad,
                         static_cast<const Pack<T, V>*>(x), static_cast<Pack<T, V>*>(y));
      });
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      return;
    }
    avg_forward_kernel<T>
        <<<detail::grid_for(s.batch * s.channels * s.out_h() * s.out_w()), kThreads, 0, stream>>>(
            s, s.out_h(), s.out_w(), count_include_pad, static_cast<const T*>(x),
            static_cast<T*>(y));
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void avg_pool2d_backward(const Pool2dShape& s, DType type, bool count_include_pad, const void* dy,
                         void* dx, CudaStream stream) {
  validate_pool2d(s);
  detail::dispatch_float(type, "avg_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    if (s.channels_last) {
      with_channel_packs<T>(s.channels, {dy, dx}, [&](auto pack) {
        constexpr int V = decltype(pack)::value;
        avg_backward_nhwc_kernel<T, V>
            <<<detail::grid_for(s.batch * s.channels / V * s.in_h * s.in_w), kThreads, 0, stream>>>(
                s, s.out_h(), s.out_w(), count_include_pad, static_cast<const Pack<T, V>*>(dy),
                static_cast<Pack<T, V>*>(dx));
      });
      LOCKSTEP_CHECK_CUDA(cudaGetLastError());
      return;
    }
    avg_backward_kernel<T>
        <<<detail::grid_for(s.batch * s.channels * s.in_h * s.in_w), kThreads, 0, stream>>>(
            s, s.out_h(), s.out_w(), count_include_pad, static_cast<const T*>(dy),
            static_cast<T*>(dx));
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void global_avg_pool_forward(DType type, std::int64_t planes, std::int64_t spatial, const void* x,
                             void* y, CudaStream stream) {
  detail::dispatch_float(type, "global_avg_pool_forward", [&](auto tag) {
    using T = decltype(tag);
    if (planes == 0) return;
    global_avg_forward_kernel<T><<<detail::grid_for(planes), kThreads, 0, stream>>>(
        planes, spatial, static_cast<const T*>(x), static_cast<T*>(y));
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void global_avg_pool_backward(DType type, std::int64_t planes, std::int64_t spatial, const void* dy,
                              void* dx, CudaStream stream) {
  detail::dispatch_float(type, "global_avg_pool_backward", [&](auto tag) {
    using T = decltype(tag);
    if (planes * spatial == 0) return;
    global_avg_backward_kernel<T><<<detail::grid_for(planes * spatial), kThreads, 0, stream>>>(
        planes, spatial, static_cast<const T*>(dy), static_cast<T*>(dx));
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void global_avg_pool_nhwc_forward(DType type, std::int64_t batch, std::int64_t spatial,
                                  std::int64_t channels, const void* x, void* y,
                                  CudaStream stream) {
  validate_global_avg_pool_nhwc(batch, spatial, channels);
  detail::dispatch_float(type, "global_avg_pool_nhwc_forward", [&](auto tag) {
    using T = decltype(tag);
    if (batch * channels == 0) return;
    global_avg_forward_nhwc_kernel<T><<<detail::grid_for(batch * channels), kThreads, 0, stream>>>(
        batch, spatial, channels, static_cast<const T*>(x), static_cast<T*>(y));
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

void global_avg_pool_nhwc_backward(DType type, std::int64_t batch, std::int64_t spatial,
                                   std::int64_t channels, const void* dy, void* dx,
                                   CudaStream stream) {
  validate_global_avg_pool_nhwc(batch, spatial, channels);
  detail::dispatch_float(type, "global_avg_pool_nhwc_backward", [&](auto tag) {
    using T = decltype(tag);
    if (batch * spatial * channels == 0) return;
    global_avg_backward_nhwc_kernel<T>
        <<<detail::grid_for(batch * spatial * channels), kThreads, 0, stream>>>(
            batch, spatial, channels, static_cast<const T*>(dy), static_cast<T*>(dx));
    LOCKSTEP_CHECK_CUDA(cudaGetLastError());
  });
}

}  // namespace lockstep::kernels::cuda
