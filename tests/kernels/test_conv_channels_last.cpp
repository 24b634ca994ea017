// Channels-last convolution on the CPU (Conv2dShape::channels_last, Note
// [channels-last on the CPU] in kernels/cpu/conv.cpp): every pass on NHWC
// activations gives, bit for bit, the NCHW pass's result transposed (dw:
// the same KCRS bits), in f32, f16 and bf16, at odd sizes with stride,
// padding, dilation, groups (depthwise too) and the 1x1 path; and the NHWC
// bias gradient gives the NCHW one's bits. The transposes here are the
// test's own index loops, not kernels/layout.h.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/conv.h"
#include "kernels/half.h"

using namespace lockstep;
namespace cpu = lockstep::kernels::cpu;
using kernels::Conv2dShape;

namespace {

using Bytes = std::vector<unsigned char>;

// `count` values uniform in [-1, 1], stored in `type`.
Bytes random_values(DType type, std::int64_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Bytes out(static_cast<std::size_t>(count) * dtype_size(type));
  for (std::int64_t i = 0; i < count; ++i) {
    const float v = dist(gen);
    if (type == DType::f32) {
      std::memcpy(&out[static_cast<std::size_t>(i) * 4], &v, 4);
    } else {
      const std::uint16_t h =
          type == DType::f16 ? kernels::f32_to_f16_bits(v) : kernels::f32_to_bf16_bits(v);
      std::memcpy(&out[static_cast<std::size_t>(i) * 2], &h, 2);
    }
  }
  return out;
}

// [n, c, h, w] -> [n, h, w, c] (to_nhwc) or back, element by element.
Bytes permute(const Bytes& in, std::size_t elem, std::int64_t n, std::int64_t c, std::int64_t hw,
              bool to_nhwc) {
  Bytes out(in.size());
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t p = 0; p < hw; ++p) {
        const std::size_t nchw = static_cast<std::size_t>((b * c + ch) * hw + p) * elem;
        const std::size_t nhwc = static_cast<std::size_t>((b * hw + p) * c + ch) * elem;
        if (to_nhwc)
          std::memcpy(&out[nhwc], &in[nchw], elem);
        else
          std::memcpy(&out[nchw], &in[nhwc], elem);
      }
  return out;
}

Conv2dShape shape(std::int64_t batch, std::int64_t in, std::int64_t h, std::int64_t w,
                  std::int64_t out, std::int64_t kh, std::int64_t kw, std::int64_t sh,
                  std::int64_t sw, std::int64_t ph, std::int64_t pw, std::int64_t dh,
                  std::int64_t dw, std::int64_t groups) {
  Conv2dShape s;
  s.batch = batch;
  s.in_channels = in;
  s.in_h = h;
  s.in_w = w;
  s.out_channels = out;
  s.kernel_h = kh;
  s.kernel_w = kw;
  s.stride_h = sh;
  s.stride_w = sw;
  s.pad_h = ph;
  s.pad_w = pw;
  s.dilation_h = dh;
  s.dilation_w = dw;
  s.groups = groups;
  return s;
}

bool same_bits(const void* a, const void* b, std::size_t bytes) {
  return std::memcmp(a, b, bytes) == 0;
}

}  // namespace

TEST_CASE("channels-last convolution equals the NCHW one transposed, bit for bit, every pass",
          "[kernels][conv][layout]") {
  const Conv2dShape cases[] = {
      shape(2, 3, 5, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1),     // 3x3, padding
      shape(2, 3, 5, 7, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1),     // stride 2
      shape(1, 2, 7, 5, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1),     // dilation 2
      shape(2, 4, 5, 7, 6, 3, 2, 2, 1, 1, 0, 1, 1, 2),     // groups, non-square kernel
      shape(3, 6, 6, 5, 3, 2, 3, 1, 2, 0, 2, 2, 1, 3),     // groups 3, mixed stride/dilation
      shape(2, 5, 3, 4, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1),     // the 1x1 path
      shape(2, 4, 6, 5, 8, 3, 3, 1, 1, 1, 1, 1, 1, 4),     // depthwise (multiplier 2)
      shape(1, 3, 11, 13, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1),   // resnet's stem at a small size
      shape(2, 16, 4, 3, 12, 1, 1, 2, 2, 0, 0, 1, 1, 1)};  // 1x1 stride 2 (a downsample)
  for (const DType type : {DType::f32, DType::f16, DType::bf16}) {
    const std::size_t elem = dtype_size(type);
    unsigned seed = 1;
    for (const Conv2dShape& nchw : cases) {
      Conv2dShape nhwc = nchw;
      nhwc.channels_last = true;
      const std::int64_t in_hw = nchw.in_h * nchw.in_w, out_hw = nchw.out_h() * nchw.out_w();
      const std::int64_t weights =
          nchw.out_channels * (nchw.in_channels / nchw.groups) * nchw.kernel_h * nchw.kernel_w;
      const Bytes x = random_values(type, nchw.batch * nchw.in_channels * in_hw, seed++);
      const Bytes w = random_values(type, weights, seed++);
      const Bytes dy = random_values(type, nchw.batch * nchw.out_channels * out_hw, seed++);
      std::vector<float> bias(static_cast<std::size_t>(nchw.out_channels));
      for (std::size_t c = 0; c < bias.size(); ++c) bias[c] = 0.125f * static_cast<float>(c) - 0.3f;
      const Bytes x_nhwc = permute(x, elem, nchw.batch, nchw.in_channels, in_hw, true);
      const Bytes dy_nhwc = permute(dy, elem, nchw.batch, nchw.out_channels, out_hw, true);
      INFO(dtype_name(type) << " case " << seed / 3 << ": x [" << nchw.batch << ", "
                            << nchw.in_channels << ", " << nchw.in_h << ", " << nchw.in_w
                            << "] out " << nchw.out_channels << " groups " << nchw.groups);

      Bytes y(dy.size()), y_nhwc(dy.size());
      cpu::conv2d_forward(nchw, type, x.data(), w.data(), bias.data(), y.data());
      cpu::conv2d_forward(nhwc, type, x_nhwc.data(), w.data(), bias.data(), y_nhwc.data());
      CHECK(permute(y_nhwc, elem, nchw.batch, nchw.out_channels, out_hw, false) == y);

      Bytes dx(x.size()), dx_nhwc(x.size());
      cpu::conv2d_backward_data(nchw, type, dy.data(), w.data(), dx.data());
      cpu::conv2d_backward_data(nhwc, type, dy_nhwc.data(), w.data(), dx_nhwc.data());
      CHECK(permute(dx_nhwc, elem, nchw.batch, nchw.in_channels, in_hw, false) == dx);

      for (const bool accumulate : {false, true}) {
        std::vector<float> dw(static_cast<std::size_t>(weights), 0.5f), dw_nhwc = dw;
        cpu::conv2d_backward_filter(nchw, type, x.data(), dy.data(), dw.data(), accumulate);
        cpu::conv2d_backward_filter(nhwc, type, x_nhwc.data(), dy_nhwc.data(), dw_nhwc.data(),
                                    accumulate);
        CHECK(same_bits(dw.data(), dw_nhwc.data(), dw.size() * sizeof(float)));
      }

      std::vector<float> db(bias.size(), 0.25f), db_nhwc = db;
      cpu::channel_bias_grad(dy.data(), type, nchw.batch, nchw.out_channels, out_hw, db.data());
      cpu::channel_bias_grad_nhwc(dy_nhwc.data(), type, nchw.batch, out_hw, nchw.out_channels,
                                  db_nhwc.data());
      CHECK(same_bits(db.data(), db_nhwc.data(), db.size() * sizeof(float)));
    }
  }
}

// The NHWC bias gradient against a float64 loop in row order: 252 values of
// magnitude <= 1 per channel, so the two f64 sums differ by a few units of
// 2^-45 at most and round to the same f32 unless one sits that close to a
// rounding boundary (none does for this seed).
TEST_CASE("the NHWC bias gradient matches a float64 loop", "[kernels][conv][layout]") {
  const std::int64_t batch = 4, spatial = 63, channels = 9;
  const Bytes dy = random_values(DType::f32, batch * spatial * channels, 99);
  std::vector<float> db(channels, 1.0f);
  cpu::channel_bias_grad_nhwc(dy.data(), DType::f32, batch, spatial, channels, db.data());
  const auto* v = reinterpret_cast<const float*>(dy.data());
  for (std::int64_t c = 0; c < channels; ++c) {
    double sum = 1.0;
    for (std::int64_t r = 0; r < batch * spatial; ++r) sum += v[r * channels + c];
    CHECK(db[static_cast<std::size_t>(c)] == static_cast<float>(sum));
  }
}
