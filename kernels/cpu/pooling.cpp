// CPU pooling (kernels/pooling.h). The loops run on f32; 16-bit inputs are
// widened first and outputs rounded once. Backward passes gather, per input
// element, over the windows that cover it in (oh, ow) order: the same order
// as the CUDA kernels, so both backends add the same f32 terms in turn.
// Window bounds are tabulated once per call, so the loops do no division.
// Channels-last calls transpose into NCHW scratch around the same loops, so
// their bits are the NCHW ones by construction (Note [channels-last pooling]).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/detail/cpu_convert.h"
#include "kernels/detail/cpu_float.h"
#include "kernels/error.h"
#include "kernels/pooling.h"

namespace lockstep::kernels {

void validate_global_avg_pool_nhwc(std::int64_t batch, std::int64_t spatial,
                                   std::int64_t channels) {
  if (batch < 0 || channels < 0 || spatial < 1)
    throw InvalidArgument("global_avg_pool_nhwc: batch " + std::to_string(batch) + ", spatial " +
                          std::to_string(spatial) + " and channels " + std::to_string(channels) +
                          " must be non-negative, with a plane of at least one element");
}

void validate_pool2d(const Pool2dShape& s) {
  auto fail = [](const std::string& what) { throw InvalidArgument("pool2d: " + what); };
  if (s.batch <= 0 || s.channels <= 0 || s.in_h <= 0 || s.in_w <= 0)
    fail("input sizes must be positive, got batch " + std::to_string(s.batch) + ", channels " +
         std::to_string(s.channels) + ", " + std::to_string(s.in_h) + "x" + std::to_string(s.in_w));
  if (s.kernel_h <= 0 || s.kernel_w <= 0 || s.stride_h <= 0 || s.stride_w <= 0)
    fail("kernel and stride must be positive");
  if (s.pad_h < 0 || s.pad_w < 0 || 2 * s.pad_h > s.kernel_h || 2 * s.pad_w > s.kernel_w)
    fail("padding " + std::to_string(s.pad_h) + "x" + std::to_string(s.pad_w) +
         " must be at most half the kernel " + std::to_string(s.kernel_h) + "x" +
         std::to_string(s.kernel_w));
  if (s.in_h + 2 * s.pad_h < s.kernel_h || s.in_w + 2 * s.pad_w < s.kernel_w)
    fail("padded input " + std::to_string(s.in_h + 2 * s.pad_h) + "x" +
         std::to_string(s.in_w + 2 * s.pad_w) + " is smaller than the kernel " +
         std::to_string(s.kernel_h) + "x" + std::to_string(s.kernel_w));
  if (s.in_h * s.in_w > std::numeric_limits<std::int32_t>::max())
    fail("an input plane of " + std::to_string(s.in_h * s.in_w) +
         " elements does not fit the i32 argmax");
}

namespace cpu {
namespace {

// The whole tensor as f32: the buffer itself, or widened into `scratch`.
const float* as_f32(const void* p, DType type, std::int64_t n, std::vector<float>& scratch) {
  if (type == DType::f32) return static_cast<const float*>(p);
  scratch.resize(static_cast<std::size_t>(n));
  detail::widen(p, type, n, scratch.data());
  return scratch.data();
}

// Where to compute an output: the buffer itself, or f32 scratch that
// finish() rounds into it.
float* out_f32(void* p, DType type, std::int64_t n, std::vector<float>& scratch) {
  if (type == DType::f32) return static_cast<float*>(p);
  scratch.resize(static_cast<std::size_t>(n));
  return scratch.data();
}

void finish(const std::vector<float>& scratch, DType type, void* out) {
  if (type != DType::f32)
    detail::narrow(scratch.data(), static_cast<std::int64_t>(scratch.size()), type, out);
}

struct Range {
  std::int64_t lo, hi;
};

// Per output index along one axis, the window clipped to the input: [lo, hi).
std::vector<Range> windows(std::int64_t outputs, std::int64_t kernel, std::int64_t stride,
                           std::int64_t pad, std::int64_t size) {
  std::vector<Range> out(static_cast<std::size_t>(outputs));
  for (std::int64_t o = 0; o < outputs; ++o) {
    const std::int64_t start = o * stride - pad;
    out[o] = {std::max<std::int64_t>(start, 0), std::min(start + kernel, size)};
  }
  return out;
}

// Per input index along one axis, the outputs whose windows cover it: [lo, hi).
std::vector<Range> covering(std::int64_t size, std::int64_t kernel, std::int64_t stride,
                            std::int64_t pad, std::int64_t outputs) {
  std::vector<Range> out(static_cast<std::size_t>(size));
  for (std::int64_t i = 0; i < size; ++i) {
    const std::int64_t padded = i + pad;
    out[i] = {padded < kernel ? 0 : (padded - kernel) / stride + 1,
              std::min(outputs, padded / stride + 1)};
  }
  return out;
}

// The tables of one call.
struct Tables {
  std::int64_t in_hw, out_h, out_w, out_hw, planes;
  std::vector<Range> rows, cols;            // windows per output row / column
  std::vector<Range> row_cover, col_cover;  // covering outputs per input row / column

  explicit Tables(const Pool2dShape& s)
      : in_hw(s.in_h * s.in_w),
        out_h(s.out_h()),
        out_w(s.out_w()),
        out_hw(out_h * out_w),
        planes(s.batch * s.channels),
        rows(windows(out_h, s.kernel_h, s.stride_h, s.pad_h, s.in_h)),
        cols(windows(out_w, s.kernel_w, s.stride_w, s.pad_w, s.in_w)),
        row_cover(covering(s.in_h, s.kernel_h, s.stride_h, s.pad_h, out_h)),
        col_cover(covering(s.in_w, s.kernel_w, s.stride_w, s.pad_w, out_w)) {}

  float divisor(const Pool2dShape& s, bool count_include_pad, std::int64_t oh,
                std::int64_t ow) const {
    // Without ceil mode a window never leaves the padded input, so the whole
    // window is kernel_h * kernel_w.
    return count_include_pad
               ? static_cast<float>(s.kernel_h * s.kernel_w)
               : static_cast<float>((rows[oh].hi - rows[oh].lo) * (cols[ow].hi - cols[ow].lo));
  }
};

// Note [pool 2x2]: the 2x2, stride-2, unpadded window (most CNNs' pooling)
// has its own loop: each output reads two adjacent pairs, so the loads are
// contiguous and GCC vectorises the loop, where the general loop's strided
// gather stays scalar. The four elements are taken in the general loop's
// order under the same rule (Note [max pool ties]), so both give the same
// outputs and argmax.
bool is_pool_2x2(const Pool2dShape& s) {
  return s.kernel_h == 2 && s.kernel_w == 2 && s.stride_h == 2 && s.stride_w == 2 && s.pad_h == 0 &&
         s.pad_w == 0;
}

[[gnu::target_clones("avx2", "default")]] void max_pool_2x2(const Pool2dShape& s, const Tables& t,
                                                            const float* in, float* out,
                                                            std::int32_t* argmax) {
  const std::int64_t w = s.in_w;
  const auto w32 = static_cast<std::int32_t>(w);
  for (std::int64_t p = 0; p < t.planes; ++p)
    for (std::int64_t oh = 0; oh < t.out_h; ++oh) {
      const float* r0 = in + p * t.in_hw + 2 * oh * w;
      const float* r1 = r0 + w;
      float* y = out + p * t.out_hw + oh * t.out_w;
      std::int32_t* index = argmax ? argmax + p * t.out_hw + oh * t.out_w : nullptr;
      const auto row = static_cast<std::int32_t>(2 * oh * w);
      for (std::int64_t ow = 0; ow < t.out_w; ++ow) {
        const auto col = static_cast<std::int32_t>(2 * ow);
        float best = r0[2 * ow];  // taken over -inf: v > -inf or v is NaN, unless v is -inf
        std::int32_t at = row + col;
        const float candidates[3] = {r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
        const std::int32_t offsets[3] = {1, w32, w32 + 1};
        for (int c = 0; c < 3; ++c) {
          const float v = candidates[c];
          const bool take = (v > best) | (v != v);
          best = take ? v : best;
          at = take ? row + col + offsets[c] : at;
        }
        y[ow] = best;
        if (index) index[ow] = at;
      }
    }
}

// Per group, the [rows, cols] matrix of `src` into [cols, rows] in `dst`:
// NHWC [hw, c] to NCHW [c, hw] and back. E has the element's size.
template <typename E>
void transpose_groups(const void* src, void* dst, std::int64_t groups, std::int64_t rows,
                      std::int64_t cols) {
  const auto* in = static_cast<const E*>(src);
  auto* out = static_cast<E*>(dst);
  for (std::int64_t g = 0; g < groups; ++g, in += rows * cols, out += rows * cols)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

void transpose_groups(std::size_t element_bytes, const void* src, void* dst, std::int64_t groups,
                      std::int64_t rows, std::int64_t cols) {
  if (element_bytes == 2)
    transpose_groups<std::uint16_t>(src, dst, groups, rows, cols);
  else
    transpose_groups<std::uint32_t>(src, dst, groups, rows, cols);
}

// NCHW scratch for one channels-last call: the buffers' NCHW forms and the
// shape that reads them.
struct Planar {
  Pool2dShape shape;
  std::size_t element_bytes;
  std::int64_t in_hw, out_hw;
  Planar(const Pool2dShape& s, DType type)
      : shape(s),
        element_bytes(dtype_size(type)),
        in_hw(s.in_h * s.in_w),
        out_hw(s.out_h() * s.out_w()) {
    shape.channels_last = false;
  }
  std::vector<char> buffer(std::int64_t hw) const {
    return std::vector<char>(static_cast<std::size_t>(shape.batch * shape.channels * hw) *
                             element_bytes);
  }
  // NHWC `src` of hw positions per image into NCHW `dst`, and back.
  void to_planes(const void* src, void* dst, std::int64_t hw, std::size_t bytes) const {
    transpose_groups(bytes, src, dst, shape.batch, hw, shape.channels);
  }
  void to_channels_last(const void* src, void* dst, std::int64_t hw, std::size_t bytes) const {
    transpose_groups(bytes, src, dst, shape.batch, shape.channels, hw);
  }
};

}  // namespace

void max_pool2d_forward(const Pool2dShape& s, DType type, const void* x, void* y,
                        std::int32_t* argmax) {
  validate_pool2d(s);
  if (s.channels_last) {
    detail::require_float(type, "max_pool2d_forward");
    const Planar p(s, type);
    std::vector<char> x_planes = p.buffer(p.in_hw), y_planes = p.buffer(p.out_hw);
    std::vector<std::int32_t> argmax_planes(
        argmax ? static_cast<std::size_t>(s.batch * s.channels * p.out_hw) : 0);
    p.to_planes(x, x_planes.data(), p.in_hw, p.element_bytes);
    max_pool2d_forward(p.shape, type, x_planes.data(), y_planes.data(),
                       argmax ? argmax_planes.data() : nullptr);
    p.to_channels_last(y_planes.data(), y, p.out_hw, p.element_bytes);
    if (argmax) p.to_channels_last(argmax_planes.data(), argmax, p.out_hw, sizeof(std::int32_t));
    return;
  }
  detail::require_float(type, "max_pool2d_forward");
  const Tables t(s);
  std::vector<float> x_scratch, y_scratch;
  const float* in = as_f32(x, type, t.planes * t.in_hw, x_scratch);
  float* out = out_f32(y, type, t.planes * t.out_hw, y_scratch);
  if (is_pool_2x2(s)) {
    max_pool_2x2(s, t, in, out, argmax);
    finish(y_scratch, type, y);
    return;
  }
  // A row of outputs at a time, the window position outermost: the innermost
  // loop runs over independent outputs (no dependency chain through the
  // maximum), and each output still sees its window in row-major order.
  std::vector<std::uint32_t> best(static_cast<std::size_t>(t.out_w));  // f32 bits
  std::vector<std::int64_t> index(static_cast<std::size_t>(t.out_w));
  std::vector<Range> reach(static_cast<std::size_t>(s.kernel_w));  // outputs column kj is in
  for (std::int64_t kj = 0; kj < s.kernel_w; ++kj) {
    const std::int64_t offset = kj - s.pad_w;  // iw = ow * stride_w + offset
    const std::int64_t lo =
        std::min(t.out_w, offset >= 0 ? 0 : (s.stride_w - 1 - offset) / s.stride_w);
    const std::int64_t last = s.in_w - 1 - offset;
    reach[kj] = {lo, last < 0 ? lo : std::max(lo, std::min(t.out_w, last / s.stride_w + 1))};
  }
  const std::uint32_t minus_inf = float_bits(-std::numeric_limits<float>::infinity());
  for (std::int64_t p = 0; p < t.planes; ++p) {
    const float* plane = in + p * t.in_hw;
    for (std::int64_t oh = 0; oh < t.out_h; ++oh) {
      const Range r = t.rows[oh];
      for (std::int64_t ow = 0; ow < t.out_w; ++ow) {
        best[ow] = minus_inf;
        index[ow] = r.lo * s.in_w + t.cols[ow].lo;
      }
      for (std::int64_t ih = r.lo; ih < r.hi; ++ih)
        for (std::int64_t kj = 0; kj < s.kernel_w; ++kj) {
          const std::int64_t base = ih * s.in_w + kj - s.pad_w;
          for (std::int64_t ow = reach[kj].lo; ow < reach[kj].hi; ++ow) {
            const std::int64_t i = base + ow * s.stride_w;
            const float v = plane[i];
            // Note [max pool ties]. Selected with masks: a branch here would
            // be mispredicted on about half of random inputs.
            const bool take = (v > bits_float(best[ow])) | (v != v);
            const std::uint32_t mask = 0u - static_cast<std::uint32_t>(take);
            best[ow] = (float_bits(v) & mask) | (best[ow] & ~mask);
            const std::uint64_t wide_mask = 0u - static_cast<std::uint64_t>(take);
            index[ow] =
                static_cast<std::int64_t>((static_cast<std::uint64_t>(i) & wide_mask) |
                                          (static_cast<std::uint64_t>(index[ow]) & ~wide_mask));
          }
        }
      const std::int64_t o = p * t.out_hw + oh * t.out_w;
      for (std::int64_t ow = 0; ow < t.out_w; ++ow) {
        out[o + ow] = bits_float(best[ow]);
        if (argmax) argmax[o + ow] = static_cast<std::int32_t>(index[ow]);
      }
    }
  }
  finish(y_scratch, type, y);
}

void max_pool2d_backward(const Pool2dShape& s, DType type, const void* dy,
                         const std::int32_t* argmax, void* dx) {
  validate_pool2d(s);
  detail::require_float(type, "max_pool2d_backward");
  if (s.channels_last) {
    const Planar p(s, type);
    std::vector<char> dy_planes = p.buffer(p.out_hw), dx_planes = p.buffer(p.in_hw);
    std::vector<std::int32_t> argmax_planes(
        static_cast<std::size_t>(s.batch * s.channels * p.out_hw));
    p.to_planes(dy, dy_planes.data(), p.out_hw, p.element_bytes);
    p.to_planes(argmax, argmax_planes.data(), p.out_hw, sizeof(std::int32_t));
    max_pool2d_backward(p.shape, type, dy_planes.data(), argmax_planes.data(), dx_planes.data());
    p.to_channels_last(dx_planes.data(), dx, p.in_hw, p.element_bytes);
    return;
  }
  const Tables t(s);
  std::vector<float> dy_scratch, dx_scratch;
  const float* grad = as_f32(dy, type, t.planes * t.out_hw, dy_scratch);
  float* out = out_f32(dx, type, t.planes * t.in_hw, dx_scratch);
  if (s.stride_h >= s.kernel_h && s.stride_w >= s.kernel_w) {
    // Windows do not overlap: each input element has at most one term, so
    // scattering gives the gather's sum (0 + dy, which also turns -0 into +0).
    std::fill(out, out + t.planes * t.in_hw, 0.0f);
    for (std::int64_t p = 0; p < t.planes; ++p)
      for (std::int64_t o = p * t.out_hw; o < (p + 1) * t.out_hw; ++o)
        out[p * t.in_hw + argmax[o]] = 0.0f + grad[o];
  } else {
    for (std::int64_t p = 0; p < t.planes; ++p)
      for (std::int64_t ih = 0; ih < s.in_h; ++ih)
        for (std::int64_t iw = 0; iw < s.in_w; ++iw) {
          const Range r = t.row_cover[ih], c = t.col_cover[iw];
          const std::int32_t self = static_cast<std::int32_t>(ih * s.in_w + iw);
          float acc = 0.0f;
          for (std::int64_t oh = r.lo; oh < r.hi; ++oh)
            for (std::int64_t ow = c.lo; ow < c.hi; ++ow) {
              const std::int64_t o = p * t.out_hw + oh * t.out_w + ow;
              if (argmax[o] == self) acc += grad[o];
            }
          out[p * t.in_hw + self] = acc;
        }
  }
  finish(dx_scratch, type, dx);
}

void avg_pool2d_forward(const Pool2dShape& s, DType type, bool count_include_pad, const void* x,
                        void* y) {
  validate_pool2d(s);
  detail::require_float(type, "avg_pool2d_forward");
  if (s.channels_last) {
    const Planar p(s, type);
    std::vector<char> x_planes = p.buffer(p.in_hw), y_planes = p.buffer(p.out_hw);
    p.to_planes(x, x_planes.data(), p.in_hw, p.element_bytes);
    avg_pool2d_forward(p.shape, type, count_include_pad, x_planes.data(), y_planes.data());
    p.to_channels_last(y_planes.data(), y, p.out_hw, p.element_bytes);
    return;
  }
  const Tables t(s);
  std::vector<float> x_scratch, y_scratch;
  const float* in = as_f32(x, type, t.planes * t.in_hw, x_scratch);
  float* out = out_f32(y, type, t.planes * t.out_hw, y_scratch);
  for (std::int64_t p = 0; p < t.planes; ++p) {
    const float* plane = in + p * t.in_hw;
    for (std::int64_t oh = 0; oh < t.out_h; ++oh)
      for (std::int64_t ow = 0; ow < t.out_w; ++ow) {
        const Range r = t.rows[oh], c = t.cols[ow];
        float sum = 0.0f;
        for (std::int64_t ih = r.lo; ih < r.hi; ++ih)
          for (std::int64_t iw = c.lo; iw < c.hi; ++iw) sum += plane[ih * s.in_w + iw];
        out[p * t.out_hw + oh * t.out_w + ow] = sum / t.divisor(s, count_include_pad, oh, ow);
      }
  }
  finish(y_scratch, type, y);
}

void avg_pool2d_backward(const Pool2dShape& s, DType type, bool count_include_pad, const void* dy,
                         void* dx) {
  validate_pool2d(s);
  detail::require_float(type, "avg_pool2d_backward");
  if (s.channels_last) {
    const Planar p(s, type);
    std::vector<char> dy_planes = p.buffer(p.out_hw), dx_planes = p.buffer(p.in_hw);
    p.to_planes(dy, dy_planes.data(), p.out_hw, p.element_bytes);
    avg_pool2d_backward(p.shape, type, count_include_pad, dy_planes.data(), dx_planes.data());
    p.to_channels_last(dx_planes.data(), dx, p.in_hw, p.element_bytes);
    return;
  }
  const Tables t(s);
  std::vector<float> dy_scratch, dx_scratch;
  const float* grad = as_f32(dy, type, t.planes * t.out_hw, dy_scratch);
  float* out = out_f32(dx, type, t.planes * t.in_hw, dx_scratch);
  for (std::int64_t p = 0; p < t.planes; ++p)
    for (std::int64_t ih = 0; ih < s.in_h; ++ih)
      for (std::int64_t iw = 0; iw < s.in_w; ++iw) {
        const Range r = t.row_cover[ih], c = t.col_cover[iw];
        float acc = 0.0f;
        for (std::int64_t oh = r.lo; oh < r.hi; ++oh)
          for (std::int64_t ow = c.lo; ow < c.hi; ++ow)
            acc += grad[p * t.out_hw + oh * t.out_w + ow] / t.divisor(s, count_include_pad, oh, ow);
        out[p * t.in_hw + ih * s.in_w + iw] = acc;
      }
  finish(dx_scratch, type, dx);
}

void global_avg_pool_forward(DType type, std::int64_t planes, std::int64_t spatial, const void* x,
                             void* y) {
  detail::require_float(type, "global_avg_pool_forward");
  std::vector<float> scratch(type == DType::f32 ? 0 : spatial);
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* plane = static_cast<const float*>(x) + p * spatial;
    if (type != DType::f32) {
      detail::widen(static_cast<const char*>(x) + p * spatial * dtype_size(type), type, spatial,
                    scratch.data());
      plane = scratch.data();
    }
    double sum = 0.0;
    for (std::int64_t i = 0; i < spatial; ++i) sum += plane[i];
    detail::store_f32(y, type, p, static_cast<float>(sum / static_cast<double>(spatial)));
  }
}

void global_avg_pool_backward(DType type, std::int64_t planes, std::int64_t spatial, const void* dy,
                              void* dx) {
  detail::require_float(type, "global_avg_pool_backward");
  for (std::int64_t p = 0; p < planes; ++p) {
    const float g =
        static_cast<float>(detail::load_f32(dy, type, p) / static_cast<double>(spatial));
    for (std::int64_t i = p * spatial; i < (p + 1) * spatial; ++i)
      detail::store_f32(dx, type, i, g);
  }
}

void global_avg_pool_nhwc_forward(DType type, std::int64_t batch, std::int64_t spatial,
                                  std::int64_t channels, const void* x, void* y) {
  validate_global_avg_pool_nhwc(batch, spatial, channels);
  detail::require_float(type, "global_avg_pool_nhwc_forward");
  // Per image, every channel's sum advances one position at a time: each sum
  // still adds its plane in spatial order, as global_avg_pool_forward's.
  std::vector<float> row(static_cast<std::size_t>(channels));
  std::vector<double> sums(static_cast<std::size_t>(channels));
  const std::size_t element_bytes = dtype_size(type);
  for (std::int64_t n = 0; n < batch; ++n) {
    std::fill(sums.begin(), sums.end(), 0.0);
    for (std::int64_t i = 0; i < spatial; ++i) {
      detail::widen(static_cast<const char*>(x) + (n * spatial + i) * channels * element_bytes,
                    type, channels, row.data());
      for (std::int64_t c = 0; c < channels; ++c) sums[c] += row[c];
    }
    for (std::int64_t c = 0; c < channels; ++c)
      detail::store_f32(y, type, n * channels + c,
                        static_cast<float>(sums[c] / static_cast<double>(spatial)));
  }
}

void global_avg_pool_nhwc_backward(DType type, std::int64_t batch, std::int64_t spatial,
                                   std::int64_t channels, const void* dy, void* dx) {
  validate_global_avg_pool_nhwc(batch, spatial, channels);
  detail::require_float(type, "global_avg_pool_nhwc_backward");
  for (std::int64_t n = 0; n < batch; ++n)
    for (std::int64_t c = 0; c < channels; ++c) {
      const float g = static_cast<float>(detail::load_f32(dy, type, n * channels + c) /
                                         static_cast<double>(spatial));
      for (std::int64_t i = 0; i < spatial; ++i)
        detail::store_f32(dx, type, (n * spatial + i) * channels + c, g);
    }
}

}  // namespace cpu
}  // namespace lockstep::kernels
