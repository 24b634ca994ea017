// CPU pooling in channels-last (Note [channels-last pooling]): max and
// average pooling, forward and backward, and global average pooling on NHWC
// buffers give the NCHW results transposed, bit for bit (ties, NaN and -inf
// included), in f32, f16 and bf16 at odd shapes; and NHWC max and average
// pooling agree with a window loop written straight on NHWC indices.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/error.h"
#include "kernels/pooling.h"
#include "support/pool_nhwc_cases.h"

using namespace lockstep;
namespace cpu = lockstep::kernels::cpu;
using test::bit_mismatches;
using test::transpose_images;

namespace {

constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

kernels::Pool2dShape nhwc(kernels::Pool2dShape s) {
  s.channels_last = true;
  return s;
}

}  // namespace

TEST_CASE("cpu max pooling in NHWC is the NCHW result transposed, argmax and gradient included",
          "[kernels][pooling]") {
  for (const DType type : kFloatTypes)
    for (const auto& s : test::pool_nhwc_cases()) {
      CAPTURE(dtype_name(type), s.batch, s.channels, s.in_h, s.in_w, s.kernel_h, s.kernel_w,
              s.stride_h, s.pad_h);
      const std::size_t e = dtype_size(type);
      const std::int64_t in_hw = s.in_h * s.in_w, out_hw = s.out_h() * s.out_w();
      const std::int64_t in_n = s.batch * s.channels * in_hw, out_n = s.batch * s.channels * out_hw;
      const auto x = test::raw_from_f32(test::tied_values(in_n, 11, true), type);
      const auto dy = test::raw_from_f32(test::random_values(out_n, 12), type);
      std::vector<char> y(out_n * e), dx(in_n * e);
      std::vector<std::int32_t> argmax(out_n);
      cpu::max_pool2d_forward(s, type, x.data(), y.data(), argmax.data());
      cpu::max_pool2d_backward(s, type, dy.data(), argmax.data(), dx.data());

      const auto x_nhwc = transpose_images(x, e, s.batch, s.channels, in_hw);
      const auto dy_nhwc = transpose_images(dy, e, s.batch, s.channels, out_hw);
      std::vector<char> y_nhwc(out_n * e), dx_nhwc(in_n * e);
      std::vector<std::int32_t> argmax_nhwc(out_n);
      cpu::max_pool2d_forward(nhwc(s), type, x_nhwc.data(), y_nhwc.data(), argmax_nhwc.data());
      cpu::max_pool2d_backward(nhwc(s), type, dy_nhwc.data(), argmax_nhwc.data(), dx_nhwc.data());

      CHECK(bit_mismatches(y_nhwc, transpose_images(y, e, s.batch, s.channels, out_hw), e) == 0);
      CHECK(bit_mismatches(test::as_raw(argmax_nhwc),
                           transpose_images(test::as_raw(argmax), 4, s.batch, s.channels, out_hw),
                           4) == 0);
      CHECK(bit_mismatches(dx_nhwc, transpose_images(dx, e, s.batch, s.channels, in_hw), e) == 0);

      // Inference (no argmax) gives the same outputs.
      std::vector<char> y_no_argmax(out_n * e);
      cpu::max_pool2d_forward(nhwc(s), type, x_nhwc.data(), y_no_argmax.data(), nullptr);
      CHECK(bit_mismatches(y_no_argmax, y_nhwc, e) == 0);
    }
}

TEST_CASE(
    "cpu average pooling in NHWC is the NCHW result transposed, with and without padding "
    "counted",
    "[kernels][pooling]") {
  for (const DType type : kFloatTypes)
    for (const bool count_include_pad : {true, false})
      for (const auto& s : test::pool_nhwc_cases()) {
        CAPTURE(dtype_name(type), count_include_pad, s.batch, s.channels, s.in_h, s.in_w,
                s.kernel_h, s.kernel_w, s.stride_h, s.pad_h);
        const std::size_t e = dtype_size(type);
        const std::int64_t in_hw = s.in_h * s.in_w, out_hw = s.out_h() * s.out_w();
        const std::int64_t in_n = s.batch * s.channels * in_hw;
        const std::int64_t out_n = s.batch * s.channels * out_hw;
        const auto x = test::raw_from_f32(test::random_values(in_n, 21), type);
        const auto dy = test::raw_from_f32(test::random_values(out_n, 22), type);
        std::vector<char> y(out_n * e), dx(in_n * e);
        cpu::avg_pool2d_forward(s, type, count_include_pad, x.data(), y.data());
        cpu::avg_pool2d_backward(s, type, count_include_pad, dy.data(), dx.data());

        const auto x_nhwc = transpose_images(x, e, s.batch, s.channels, in_hw);
        const auto dy_nhwc = transpose_images(dy, e, s.batch, s.channels, out_hw);
        std::vector<char> y_nhwc(out_n * e), dx_nhwc(in_n * e);
        cpu::avg_pool2d_forward(nhwc(s), type, count_include_pad, x_nhwc.data(), y_nhwc.data());
        cpu::avg_pool2d_backward(nhwc(s), type, count_include_pad, dy_nhwc.data(), dx_nhwc.data());
        CHECK(bit_mismatches(y_nhwc, transpose_images(y, e, s.batch, s.channels, out_hw), e) == 0);
        CHECK(bit_mismatches(dx_nhwc, transpose_images(dx, e, s.batch, s.channels, in_hw), e) == 0);
      }
}

// The reference scans each window in NHWC indices under Note [max pool ties]
// (exact: a maximum is one of the inputs) and averages in f64 (the kernel
// adds in f32: 1e-6 relative covers a 9-term f32 sum of O(1) values).
TEST_CASE("cpu NHWC max and average pooling match a window loop on NHWC indices",
          "[kernels][pooling]") {
  for (const auto& s : test::pool_nhwc_cases()) {
    CAPTURE(s.batch, s.channels, s.in_h, s.in_w, s.kernel_h, s.kernel_w, s.stride_h, s.pad_h);
    const std::int64_t C = s.channels, oh_n = s.out_h(), ow_n = s.out_w();
    const std::int64_t out_n = s.batch * oh_n * ow_n * C;
    const auto values = test::tied_values(s.batch * s.in_h * s.in_w * C, 31, true);
    std::vector<float> y(out_n), avg(out_n);
    std::vector<std::int32_t> argmax(out_n);
    cpu::max_pool2d_forward(nhwc(s), DType::f32, values.data(), y.data(), argmax.data());
    const auto finite = test::random_values(values.size(), 32);
    cpu::avg_pool2d_forward(nhwc(s), DType::f32, false, finite.data(), avg.data());
    std::int64_t wrong_max = 0, wrong_index = 0, wrong_avg = 0;
    for (std::int64_t n = 0; n < s.batch; ++n)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow)
          for (std::int64_t c = 0; c < C; ++c) {
            float best = -std::numeric_limits<float>::infinity();
            std::int64_t at = -1, count = 0;
            double sum = 0.0;
            for (std::int64_t ih = oh * s.stride_h - s.pad_h;
                 ih < oh * s.stride_h - s.pad_h + s.kernel_h; ++ih)
              for (std::int64_t iw = ow * s.stride_w - s.pad_w;
                   iw < ow * s.stride_w - s.pad_w + s.kernel_w; ++iw) {
                if (ih < 0 || iw < 0 || ih >= s.in_h || iw >= s.in_w) continue;
                const std::int64_t i = ((n * s.in_h + ih) * s.in_w + iw) * C + c;
                if (at < 0) at = ih * s.in_w + iw;  // an all -inf window keeps its first
                if (values[i] > best || std::isnan(values[i])) {
                  best = values[i];
                  at = ih * s.in_w + iw;
                }
                sum += finite[i];
                ++count;
              }
            const std::int64_t o = ((n * oh_n + oh) * ow_n + ow) * C + c;
            const bool same = std::isnan(best) ? std::isnan(y[o]) : y[o] == best;
            wrong_max += !same;
            wrong_index += argmax[o] != at;
            wrong_avg += std::fabs(avg[o] - sum / count) > 1e-6 * (1.0 + std::fabs(sum / count));
          }
    CHECK(wrong_max == 0);
    CHECK(wrong_index == 0);
    CHECK(wrong_avg == 0);
  }
}

TEST_CASE("cpu NHWC global average pooling is the plane form on transposed data, bit for bit",
          "[kernels][pooling]") {
  struct Case {
    std::int64_t batch, spatial, channels;
  };
  for (const DType type : kFloatTypes)
    for (const Case c : {Case{2, 49, 37}, Case{3, 1, 5}, Case{1, 17, 1}, Case{2, 9, 64}}) {
      CAPTURE(dtype_name(type), c.batch, c.spatial, c.channels);
      const std::size_t e = dtype_size(type);
      const std::int64_t n = c.batch * c.spatial * c.channels, planes = c.batch * c.channels;
      auto values = test::random_values(n, 41);
      if (c.channels > 1)  // NaN spreads to channel 0's mean in the first image
        values[0] = std::numeric_limits<float>::quiet_NaN();
      const auto x = test::raw_from_f32(values, type);
      const auto dy = test::raw_from_f32(test::random_values(planes, 42), type);
      std::vector<char> y(planes * e), dx(n * e), y_nhwc(planes * e), dx_nhwc(n * e);
      cpu::global_avg_pool_forward(type, planes, c.spatial,
                                   transpose_images(x, e, c.batch, c.spatial, c.channels).data(),
                                   y.data());
      cpu::global_avg_pool_backward(type, planes, c.spatial, dy.data(), dx.data());
      cpu::global_avg_pool_nhwc_forward(type, c.batch, c.spatial, c.channels, x.data(),
                                        y_nhwc.data());
      cpu::global_avg_pool_nhwc_backward(type, c.batch, c.spatial, c.channels, dy.data(),
                                         dx_nhwc.data());
      CHECK(bit_mismatches(y_nhwc, y, e) == 0);  // [batch, channels] in both forms
      CHECK(bit_mismatches(dx_nhwc, transpose_images(dx, e, c.batch, c.channels, c.spatial), e) ==
            0);
      if (type == DType::f32) {  // and a mean itself, in f64 (exact up to the f32 rounding)
        const std::int64_t last = c.channels - 1;
        double sum = 0.0;
        for (std::int64_t i = 0; i < c.spatial; ++i) sum += values[i * c.channels + last];
        CHECK(reinterpret_cast<const float*>(y_nhwc.data())[last] ==
              static_cast<float>(sum / static_cast<double>(c.spatial)));
      }
    }
}

TEST_CASE("cpu NHWC global average pooling rejects an empty plane, naming the sizes",
          "[kernels][pooling]") {
  float x = 0.0f, y = 0.0f;
  CHECK_THROWS_WITH(cpu::global_avg_pool_nhwc_forward(DType::f32, 1, 0, 1, &x, &y),
                    Catch::Contains("spatial 0"));
  CHECK_THROWS_AS(cpu::global_avg_pool_nhwc_backward(DType::f32, -1, 1, 1, &x, &y),
                  InvalidArgument);
}
