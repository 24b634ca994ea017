// CPU convolution (kernels/conv.h): im2col + OpenBLAS GEMM, one GEMM per image
// and group, on an im2col buffer that stays in cache; col2im scatters the
// column gradient back in one pass (Note [explicit padding]). 16-bit data is widened to f32 per
// image (exact) and outputs are rounded once. Channels-last shapes go through the same path
// between transposes (Note [channels-last on the CPU]). Also the shape checks and the
// process-wide algorithm settings, which both backends share.
#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <vector>

#include "kernels/conv.h"
#include "kernels/detail/cpu_convert.h"
#include "kernels/detail/cpu_float.h"
#include "kernels/error.h"
#include "kernels/gemm.h"
#include "kernels/layout.h"

namespace lockstep::kernels {
namespace {
std::atomic<bool> deterministic_mode{false};
std::atomic<bool> autotune_mode{true};
}  // namespace

void set_deterministic(bool on) { deterministic_mode = on; }
bool deterministic() { return deterministic_mode; }
void set_conv_autotune(bool on) { autotune_mode = on; }
// Deterministic runs never time (Note [conv algorithm choice] in kernels/cuda/conv.cu).
bool conv_autotune() { return autotune_mode && !deterministic_mode; }

void validate_conv2d(const Conv2dShape& s) {
  auto fail = [](const std::string& what) { throw InvalidArgument("conv2d: " + what); };
  auto positive = [&](std::int64_t v, const char* name) {
    if (v <= 0) fail(std::string(name) + " must be positive, got " + std::to_string(v));
  };
  positive(s.batch, "batch");
  positive(s.in_channels, "in_channels");
  positive(s.in_h, "input height");
  positive(s.in_w, "input width");
  positive(s.out_channels, "out_channels");
  positive(s.kernel_h, "kernel height");
  positive(s.kernel_w, "kernel width");
  positive(s.stride_h, "stride");
  positive(s.stride_w, "stride");
  positive(s.dilation_h, "dilation");
  positive(s.dilation_w, "dilation");
  positive(s.groups, "groups");
  if (s.pad_h < 0 || s.pad_w < 0) fail("padding must not be negative");
  if (s.in_channels % s.groups != 0 || s.out_channels % s.groups != 0)
    fail("in_channels " + std::to_string(s.in_channels) + " and out_channels " +
         std::to_string(s.out_channels) + " must both be divisible by groups " +
         std::to_string(s.groups));
  if (s.in_h + 2 * s.pad_h < s.dilation_h * (s.kernel_h - 1) + 1 ||
      s.in_w + 2 * s.pad_w < s.dilation_w * (s.kernel_w - 1) + 1)
    fail("padded input " + std::to_string(s.in_h + 2 * s.pad_h) + "x" +
         std::to_string(s.in_w + 2 * s.pad_w) + " is smaller than the dilated kernel " +
         std::to_string(s.dilation_h * (s.kernel_h - 1) + 1) + "x" +
         std::to_string(s.dilation_w * (s.kernel_w - 1) + 1));
  // cuDNN's legacy descriptors index with int; keep both backends to one rule.
  constexpr std::int64_t kMax = std::numeric_limits<int>::max();
  const std::int64_t elements[] = {
      s.batch * s.in_channels * s.in_h * s.in_w, s.batch * s.out_channels * s.out_h() * s.out_w(),
      s.out_channels * (s.in_channels / s.groups) * s.kernel_h * s.kernel_w};
  for (std::int64_t n : elements)
    if (n > kMax)
      fail(std::to_string(n) + " elements in one tensor exceed 2^31 - 1 (split the batch)");
}

namespace cpu {
namespace {

// Sizes derived from a shape, per image and per group.
struct Geometry {
  std::int64_t in_hw, out_h, out_w, out_hw;
  std::int64_t out_per_group;
  std::int64_t k;         // GEMM depth per group: in/groups * kh * kw
  std::int64_t col_rows;  // rows of the im2col buffer: in * kh * kw
  bool pointwise;         // 1x1, stride 1, no padding: the image is its own im2col

  explicit Geometry(const Conv2dShape& s)
      : in_hw(s.in_h * s.in_w),
        out_h(s.out_h()),
        out_w(s.out_w()),
        out_hw(out_h * out_w),
        out_per_group(s.out_channels / s.groups),
        k(s.in_channels / s.groups * s.kernel_h * s.kernel_w),
        col_rows(s.in_channels * s.kernel_h * s.kernel_w),
        pointwise(s.kernel_h == 1 && s.kernel_w == 1 && s.stride_h == 1 && s.stride_w == 1 &&
                  s.pad_h == 0 && s.pad_w == 0) {}
};

// Note [explicit padding]: im2col reads, and col2im writes, a copy of the
// image with its zero padding made explicit ([in, h + 2 pad_h, w + 2 pad_w]),
// so every window position is in bounds and each (channel, ki, kj, oh) row
// segment is one branch-free strided copy. Without padding the image itself
// serves. (Bounds-checked segments of a few elements each cost more in call
// and branch overhead than the copy.)
struct Padded {
  std::int64_t h, w;  // padded sizes
  bool needed;
  explicit Padded(const Conv2dShape& s)
      : h(s.in_h + 2 * s.pad_h), w(s.in_w + 2 * s.pad_w), needed(s.pad_h > 0 || s.pad_w > 0) {}
};

// `padded` = x with its zero border (Note [explicit padding]).
void pad_image(const Conv2dShape& s, const Padded& p, const float* x, float* padded) {
  std::fill(padded, padded + s.in_channels * p.h * p.w, 0.0f);
  for (std::int64_t c = 0; c < s.in_channels; ++c)
    for (std::int64_t ih = 0; ih < s.in_h; ++ih)
      std::copy(x + (c * s.in_h + ih) * s.in_w, x + (c * s.in_h + ih + 1) * s.in_w,
                padded + (c * p.h + ih + s.pad_h) * p.w + s.pad_w);
}

// col[(c, ki, kj), (oh, ow)] = padded[c, oh * sh + ki * dh, ow * sw + kj * dw]. One image.
void im2col(const Conv2dShape& s, const Geometry& g, const Padded& p, const float* padded,
            float* col) {
  for (std::int64_t c = 0; c < s.in_channels; ++c)
    for (std::int64_t ki = 0; ki < s.kernel_h; ++ki)
      for (std::int64_t kj = 0; kj < s.kernel_w; ++kj) {
        float* row = col + ((c * s.kernel_h + ki) * s.kernel_w + kj) * g.out_hw;
        for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
          const float* in =
              padded + (c * p.h + oh * s.stride_h + ki * s.dilation_h) * p.w + kj * s.dilation_w;
          float* out = row + oh * g.out_w;
          if (s.stride_w == 1)
            for (std::int64_t ow = 0; ow < g.out_w; ++ow) out[ow] = in[ow];
          else
            for (std::int64_t ow = 0; ow < g.out_w; ++ow) out[ow] = in[ow * s.stride_w];
        }
      }
}

// The transpose of im2col: padded = 0, then every col entry is added to the
// element it was read from. One image.
void col2im(const Conv2dShape& s, const Geometry& g, const Padded& p, const float* col,
            float* padded) {
  std::fill(padded, padded + s.in_channels * p.h * p.w, 0.0f);
  for (std::int64_t c = 0; c < s.in_channels; ++c)
    for (std::int64_t ki = 0; ki < s.kernel_h; ++ki)
      for (std::int64_t kj = 0; kj < s.kernel_w; ++kj) {
        const float* row = col + ((c * s.kernel_h + ki) * s.kernel_w + kj) * g.out_hw;
        for (std::int64_t oh = 0; oh < g.out_h; ++oh) {
          float* out =
              padded + (c * p.h + oh * s.stride_h + ki * s.dilation_h) * p.w + kj * s.dilation_w;
          const float* in = row + oh * g.out_w;
          if (s.stride_w == 1)
            for (std::int64_t ow = 0; ow < g.out_w; ++ow) out[ow] += in[ow];
          else
            for (std::int64_t ow = 0; ow < g.out_w; ++ow) out[ow * s.stride_w] += in[ow];
        }
      }
}

// dx = the interior of the padded gradient.
void unpad(const Conv2dShape& s, const Padded& p, const float* padded, float* dx) {
  for (std::int64_t c = 0; c < s.in_channels; ++c)
    for (std::int64_t ih = 0; ih < s.in_h; ++ih) {
      const float* in = padded + (c * p.h + ih + s.pad_h) * p.w + s.pad_w;
      std::copy(in, in + s.in_w, dx + (c * s.in_h + ih) * s.in_w);
    }
}

// C[m, n] (ldc n) = A op B + beta C on dense f32 row-major operands.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
           const float* a, const float* b, float beta, float* c) {
  GemmArgs args;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.m = m;
  args.n = n;
  args.k = k;
  args.beta = beta;
  args.a = a;
  args.lda = trans_a ? m : k;
  args.b = b;
  args.ldb = trans_b ? k : n;
  args.c = c;
  args.ldc = n;
  gemm(args);
}

// Note [conv scratch]: the per-call buffers (im2col columns, the padded image,
// widened 16-bit data) are kept per thread and reused, growing only. Fresh
// buffers of that size come from mmap and cost a page fault per 4 KiB on
// every call, as much as a fifth of a small convolution's time.
enum Slot { kWeight, kImage, kResult, kColumns, kPadded, kBatchSum, kSlots };

float* scratch(Slot slot, std::int64_t count) {
  thread_local std::vector<float> buffers[kSlots];
  std::vector<float>& b = buffers[slot];
  if (b.size() < static_cast<std::size_t>(count)) b.resize(static_cast<std::size_t>(count));
  return b.data();
}

// Image n of a [batch, channels, hw] buffer as f32: the buffer itself for f32,
// else widened into scratch (exactly: every 16-bit value is an f32).
const float* image_f32(const void* base, DType type, std::int64_t n, std::int64_t elements,
                       Slot slot) {
  if (type == DType::f32) return static_cast<const float*>(base) + n * elements;
  float* out = scratch(slot, elements);
  detail::widen(static_cast<const char*>(base) + n * elements * dtype_size(type), type, elements,
                out);
  return out;
}

// Image n of a [batch, channels, hw] buffer: where its f32 result is computed
// (the buffer itself for f32, else scratch), and store() rounds it there.
struct ImageOut {
  void* base;
  DType type;
  std::int64_t elements;
  float* at(std::int64_t n) const {
    return type == DType::f32 ? static_cast<float*>(base) + n * elements
                              : scratch(kResult, elements);
  }
  void store(std::int64_t n) const {
    if (type != DType::f32)
      detail::narrow(scratch(kResult, elements), elements, type,
                     static_cast<char*>(base) + n * elements * dtype_size(type));
  }
};

// y[c, :] += bias[c] on one image's f32 result. A 16-bit result is first
// rounded to its type, as the CUDA path adds the bias to cuDNN's 16-bit output
// (store() then rounds the sum again).
void add_bias(float* y, DType type, const float* bias, std::int64_t channels,
              std::int64_t spatial) {
  for (std::int64_t c = 0; c < channels; ++c) {
    float* channel = y + c * spatial;
    if (type == DType::f32)
      for (std::int64_t i = 0; i < spatial; ++i) channel[i] += bias[c];
    else
      for (std::int64_t i = 0; i < spatial; ++i)
        channel[i] = detail::round_to(type, channel[i]) + bias[c];
  }
}

// The weight as f32: itself, or widened into scratch.
const float* weight_f32(const Conv2dShape& s, const Geometry& g, DType type, const void* w) {
  return image_f32(w, type, 0, s.out_channels * g.k, kWeight);
}

// The image ready for im2col: padded into scratch when needed (Note [explicit padding]).
const float* source(const Conv2dShape& s, const Padded& pad, const float* image) {
  if (!pad.needed) return image;
  float* padded = scratch(kPadded, s.in_channels * pad.h * pad.w);
  pad_image(s, pad, image, padded);
  return padded;
}

// Note [channels-last on the CPU]: an NHWC pass transposes its activations
// (x, dy) to NCHW in scratch, runs the NCHW pass on them and transposes its
// activation result (y, dx) back; the weight and dw are KCRS in both modes.
// The permutations are exact and the NCHW pass is the same arithmetic, so
// NHWC results are bit for bit the NCHW results transposed: the CPU is the
// reference that CUDA's NHWC kernels are held to. It costs two passes over
// each activation (a few percent of a convolution's im2col and GEMM time).
enum LayoutSlot { kNchwIn, kNchwGrad, kNchwOut, kLayoutSlots };

void* layout_scratch(LayoutSlot slot, std::size_t bytes) {
  thread_local std::vector<float> buffers[kLayoutSlots];  // float: aligned for any DType
  std::vector<float>& b = buffers[slot];
  const std::size_t count = (bytes + sizeof(float) - 1) / sizeof(float);
  if (b.size() < count) b.resize(count);
  return b.data();
}

Conv2dShape as_nchw(const Conv2dShape& s) {
  Conv2dShape t = s;
  t.channels_last = false;
  return t;
}

// An NHWC activation of `channels` x h x w per image, transposed to NCHW in scratch.
const void* to_nchw(LayoutSlot slot, DType type, std::int64_t batch, std::int64_t channels,
                    std::int64_t h, std::int64_t w, const void* nhwc) {
  void* out =
      layout_scratch(slot, static_cast<std::size_t>(batch * channels * h * w) * dtype_size(type));
  nhwc_to_nchw(type, batch, channels, h, w, nhwc, out);
  return out;
}

std::size_t activation_bytes(DType type, std::int64_t batch, std::int64_t channels, std::int64_t h,
                             std::int64_t w) {
  return static_cast<std::size_t>(batch * channels * h * w) * dtype_size(type);
}

}  // namespace

void conv2d_forward(const Conv2dShape& s, DType type, const void* x, const void* w,
                    const float* bias, void* y) {
  validate_conv2d(s);
  detail::require_float(type, "conv2d_forward");
  if (s.channels_last) {  // Note [channels-last on the CPU]
    const std::int64_t oh = s.out_h(), ow = s.out_w();
    const void* x_nchw = to_nchw(kNchwIn, type, s.batch, s.in_channels, s.in_h, s.in_w, x);
    void* y_nchw =
        layout_scratch(kNchwOut, activation_bytes(type, s.batch, s.out_channels, oh, ow));
    conv2d_forward(as_nchw(s), type, x_nchw, w, bias, y_nchw);
    nchw_to_nhwc(type, s.batch, s.out_channels, oh, ow, y_nchw, y);
    return;
  }
  const Geometry g(s);
  const Padded pad(s);
  const float* weight = weight_f32(s, g, type, w);
  float* col = g.pointwise ? nullptr : scratch(kColumns, g.col_rows * g.out_hw);
  const ImageOut out{y, type, s.out_channels * g.out_hw};
  for (std::int64_t n = 0; n < s.batch; ++n) {
    const float* image = image_f32(x, type, n, s.in_channels * g.in_hw, kImage);
    if (!g.pointwise) im2col(s, g, pad, source(s, pad, image), col);
    const float* columns = g.pointwise ? image : col;
    float* result = out.at(n);
    for (std::int64_t grp = 0; grp < s.groups; ++grp)
      sgemm(false, false, g.out_per_group, g.out_hw, g.k, weight + grp * g.out_per_group * g.k,
            columns + grp * g.k * g.out_hw, 0.0f, result + grp * g.out_per_group * g.out_hw);
    if (bias) add_bias(result, type, bias, s.out_channels, g.out_hw);  // while in cache
    out.store(n);
  }
}

void conv2d_backward_data(const Conv2dShape& s, DType type, const void* dy, const void* w,
                          void* dx) {
  validate_conv2d(s);
  detail::require_float(type, "conv2d_backward_data");
  if (s.channels_last) {  // Note [channels-last on the CPU]
    const void* dy_nchw =
        to_nchw(kNchwGrad, type, s.batch, s.out_channels, s.out_h(), s.out_w(), dy);
    void* dx_nchw =
        layout_scratch(kNchwOut, activation_bytes(type, s.batch, s.in_channels, s.in_h, s.in_w));
    conv2d_backward_data(as_nchw(s), type, dy_nchw, w, dx_nchw);
    nchw_to_nhwc(type, s.batch, s.in_channels, s.in_h, s.in_w, dx_nchw, dx);
    return;
  }
  const Geometry g(s);
  const Padded pad(s);
  const float* weight = weight_f32(s, g, type, w);
  float* col = g.pointwise ? nullptr : scratch(kColumns, g.col_rows * g.out_hw);
  float* padded = pad.needed ? scratch(kPadded, s.in_channels * pad.h * pad.w) : nullptr;
  const ImageOut out{dx, type, s.in_channels * g.in_hw};
  for (std::int64_t n = 0; n < s.batch; ++n) {
    const float* grad = image_f32(dy, type, n, s.out_channels * g.out_hw, kImage);
    float* result = out.at(n);
    float* columns = g.pointwise ? result : col;
    for (std::int64_t grp = 0; grp < s.groups; ++grp)  // dcol_g = W_g^T dy_g
      sgemm(true, false, g.k, g.out_hw, g.out_per_group, weight + grp * g.out_per_group * g.k,
            grad + grp * g.out_per_group * g.out_hw, 0.0f, columns + grp * g.k * g.out_hw);
    if (!g.pointwise) col2im(s, g, pad, col, pad.needed ? padded : result);
    if (pad.needed) unpad(s, pad, padded, result);
    out.store(n);
  }
}

void conv2d_backward_filter(const Conv2dShape& s, DType type, const void* x, const void* dy,
                            float* dw, bool accumulate) {
  validate_conv2d(s);
  detail::require_float(type, "conv2d_backward_filter");
  if (s.channels_last) {  // Note [channels-last on the CPU]: dw is KCRS either way
    const void* x_nchw = to_nchw(kNchwIn, type, s.batch, s.in_channels, s.in_h, s.in_w, x);
    const void* dy_nchw =
        to_nchw(kNchwGrad, type, s.batch, s.out_channels, s.out_h(), s.out_w(), dy);
    conv2d_backward_filter(as_nchw(s), type, x_nchw, dy_nchw, dw, accumulate);
    return;
  }
  const Geometry g(s);
  const Padded pad(s);
  const std::int64_t weight_elements = s.out_channels * g.k;
  // f32 accumulates straight into dw (the first image's GEMM overwrites it
  // unless `accumulate`); 16-bit types sum the batch in f32 first and round
  // that once, as cuDNN writes a 16-bit weight gradient.
  float* acc = dw;
  bool first_adds = accumulate;
  if (type != DType::f32) {
    first_adds = false;
    acc = scratch(kBatchSum, weight_elements);
  }
  float* col = g.pointwise ? nullptr : scratch(kColumns, g.col_rows * g.out_hw);
  for (std::int64_t n = 0; n < s.batch; ++n) {
    const float* image = image_f32(x, type, n, s.in_channels * g.in_hw, kImage);
    const float* grad = image_f32(dy, type, n, s.out_channels * g.out_hw, kResult);
    if (!g.pointwise) im2col(s, g, pad, source(s, pad, image), col);
    const float* columns = g.pointwise ? image : col;
    for (std::int64_t grp = 0; grp < s.groups; ++grp)  // dW_g += dy_g col_g^T
      sgemm(false, true, g.out_per_group, g.k, g.out_hw, grad + grp * g.out_per_group * g.out_hw,
            columns + grp * g.k * g.out_hw, n == 0 && !first_adds ? 0.0f : 1.0f,
            acc + grp * g.out_per_group * g.k);
  }
  if (type != DType::f32)
    for (std::int64_t i = 0; i < weight_elements; ++i)
      dw[i] = (accumulate ? dw[i] : 0.0f) + detail::round_to(type, acc[i]);
}

// AVX2: the four f64 lanes are one vector (the same sums, in the same order).
namespace {

[[gnu::target_clones("avx2", "default")]] void channel_bias_grad_clones(const void* dy, DType type,
                                                                        std::int64_t batch,
                                                                        std::int64_t channels,
                                                                        std::int64_t spatial,
                                                                        float* db) {
  detail::require_float(type, "channel_bias_grad");
  for (std::int64_t c = 0; c < channels; ++c) {
    double acc = 0.0;
    for (std::int64_t n = 0; n < batch; ++n) {
      const float* plane = image_f32(dy, type, n * channels + c, spatial, kImage);
      double lanes[4] = {0.0, 0.0, 0.0, 0.0};  // four chains of f64 adds, not one
      std::int64_t i = 0;
      for (; i + 4 <= spatial; i += 4)
        for (int l = 0; l < 4; ++l) lanes[l] += plane[i + l];
      for (; i < spatial; ++i) lanes[0] += plane[i];
      acc += (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    }
    db[c] = static_cast<float>(db[c] + acc);
  }
}

// channel_bias_grad_clones' adds, channel by channel, over an NHWC dy: per
// (channel, lane) the same sequence of f64 adds as there (lane l takes
// positions l, l + 4, ... and lane 0 the tail), so the same bits.
[[gnu::target_clones("avx2", "default")]] void channel_bias_grad_nhwc_clones(
    const void* dy, DType type, std::int64_t batch, std::int64_t spatial, std::int64_t channels,
    float* db) {
  detail::require_float(type, "channel_bias_grad_nhwc");
  const auto c_count = static_cast<std::size_t>(channels);
  std::vector<double> acc(c_count, 0.0), lanes(4 * c_count);
  for (std::int64_t n = 0; n < batch; ++n) {
    const float* image = image_f32(dy, type, n, spatial * channels, kImage);
    std::fill(lanes.begin(), lanes.end(), 0.0);
    std::int64_t i = 0;
    for (; i + 4 <= spatial; i += 4)
      for (std::int64_t l = 0; l < 4; ++l) {
        const float* row = image + (i + l) * channels;
        double* lane = lanes.data() + l * channels;
        for (std::int64_t c = 0; c < channels; ++c) lane[c] += row[c];
      }
    for (; i < spatial; ++i) {
      const float* row = image + i * channels;
      for (std::int64_t c = 0; c < channels; ++c) lanes[c] += row[c];
    }
    for (std::int64_t c = 0; c < channels; ++c)
      acc[c] +=
          (lanes[c] + lanes[channels + c]) + (lanes[2 * channels + c] + lanes[3 * channels + c]);
  }
  for (std::int64_t c = 0; c < channels; ++c) db[c] = static_cast<float>(db[c] + acc[c]);
}

}  // namespace

// Note [clones behind the API] (kernels/cpu/activation.cpp).
void channel_bias_grad(const void* dy, DType type, std::int64_t batch, std::int64_t channels,
                       std::int64_t spatial, float* db) {
  channel_bias_grad_clones(dy, type, batch, channels, spatial, db);
}

void channel_bias_grad_nhwc(const void* dy, DType type, std::int64_t batch, std::int64_t spatial,
                            std::int64_t channels, float* db) {
  channel_bias_grad_nhwc_clones(dy, type, batch, spatial, channels, db);
}

}  // namespace cpu
}  // namespace lockstep::kernels
