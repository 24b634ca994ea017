// CUDA pooling in channels-last (Note [channels-last pooling]) against the
// CPU twin and against the CUDA NCHW kernels on the transposed data: max and
// average pooling forward and backward (argmax included) and global average
// pooling, f32/f16/bf16, at odd shapes full of ties, NaN and -inf and at
// resnet50's shapes (the 3x3 stride-2 stem pool at 112x112x64, the 7x7x2048
// global pool at batch 256). Both comparisons are bit for bit: every thread
// does the CPU loop's f32 arithmetic in the same order. The one exception is
// a NaN's payload, which the CPU keeps and the GPU makes canonical, so
// against the CPU a NaN matches any NaN.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/half.h"
#include "kernels/pooling.h"
#include "support/pool_nhwc_cases.h"

using namespace lockstep;
using namespace lockstep::core;
using test::bit_mismatches;
using test::transpose_images;

namespace {

const Device kGpu = Device::cuda(0);
constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

kernels::Pool2dShape nhwc(kernels::Pool2dShape s) {
  s.channels_last = true;
  return s;
}

Tensor on_gpu(const std::vector<char>& bytes, std::size_t element_bytes, DType type) {
  return Tensor::from_host(bytes.data(), {static_cast<std::int64_t>(bytes.size() / element_bytes)},
                           type, kGpu);
}
Tensor gpu_buffer(std::int64_t n, DType type) { return Tensor::empty({n}, type, kGpu); }
std::vector<char> to_host(const Tensor& t) {
  std::vector<char> out(static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
  t.copy_to_host(out.data());
  return out;
}

float value_at(const std::vector<char>& bytes, DType type, std::size_t i) {
  if (type == DType::f32) {
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
  std::uint16_t b;
  std::memcpy(&b, bytes.data() + 2 * i, 2);
  return type == DType::f16 ? kernels::f16_bits_to_f32(b) : kernels::bf16_bits_to_f32(b);
}

// Elements whose bits differ, a NaN against any NaN counting as equal.
std::int64_t mismatches_but_nan(const std::vector<char>& gpu, const std::vector<char>& cpu,
                                DType type) {
  if (gpu.size() != cpu.size()) return -1;
  const std::size_t e = dtype_size(type);
  std::int64_t count = 0;
  for (std::size_t i = 0; i < gpu.size() / e; ++i) {
    if (std::memcmp(gpu.data() + i * e, cpu.data() + i * e, e) == 0) continue;
    count += !(std::isnan(value_at(gpu, type, i)) && std::isnan(value_at(cpu, type, i)));
  }
  return count;
}

// The odd cases, plus resnet50's stem pool (3x3, stride 2, pad 1, 64 channels)
// at 112x112 and a batch of 4, and its 2x2 fast path at 56x56.
std::vector<kernels::Pool2dShape> gpu_cases() {
  auto cases = test::pool_nhwc_cases();
  cases.push_back(test::pool_case(4, 64, 112, 112, 3, 3, 2, 2, 1, 1));
  cases.push_back(test::pool_case(2, 256, 56, 56, 2, 2, 2, 2, 0, 0));
  return cases;
}

}  // namespace

TEST_CASE("cuda NHWC max pooling matches the cpu and the cuda NCHW kernels, argmax included",
          "[gpu][pooling][nhwc]") {
  for (const DType type : kFloatTypes)
    for (const auto& s : gpu_cases()) {
      CAPTURE(dtype_name(type), s.batch, s.channels, s.in_h, s.in_w, s.kernel_h, s.kernel_w,
              s.stride_h, s.pad_h);
      const std::size_t e = dtype_size(type);
      const std::int64_t in_hw = s.in_h * s.in_w, out_hw = s.out_h() * s.out_w();
      const std::int64_t in_n = s.batch * s.channels * in_hw, out_n = s.batch * s.channels * out_hw;
      const auto x = test::raw_from_f32(test::tied_values(in_n, 51, true), type);  // NHWC
      const auto dy = test::raw_from_f32(test::random_values(out_n, 52), type);    // NHWC

      std::vector<char> cpu_y(out_n * e), cpu_dx(in_n * e);
      std::vector<std::int32_t> cpu_argmax(out_n);
      kernels::cpu::max_pool2d_forward(nhwc(s), type, x.data(), cpu_y.data(), cpu_argmax.data());
      kernels::cpu::max_pool2d_backward(nhwc(s), type, dy.data(), cpu_argmax.data(), cpu_dx.data());

      const Tensor gx = on_gpu(x, e, type), gdy = on_gpu(dy, e, type);
      Tensor gy = gpu_buffer(out_n, type), gdx = gpu_buffer(in_n, type);
      Tensor gargmax = gpu_buffer(out_n, DType::i32);
      kernels::cuda::max_pool2d_forward(nhwc(s), type, gx.data(), gy.data(),
                                        gargmax.data_as<std::int32_t>(), nullptr);
      kernels::cuda::max_pool2d_backward(nhwc(s), type, gdy.data(), gargmax.data_as<std::int32_t>(),
                                         gdx.data(), nullptr);
      const auto y = to_host(gy), dx = to_host(gdx), argmax = to_host(gargmax);
      CHECK(mismatches_but_nan(y, cpu_y, type) == 0);
      CHECK(bit_mismatches(argmax, test::as_raw(cpu_argmax), 4) == 0);
      CHECK(bit_mismatches(dx, cpu_dx, e) == 0);

      // The NCHW kernels on the transposed data, transposed back: the same bits.
      const Tensor px = on_gpu(transpose_images(x, e, s.batch, in_hw, s.channels), e, type);
      const Tensor pdy = on_gpu(transpose_images(dy, e, s.batch, out_hw, s.channels), e, type);
      Tensor py = gpu_buffer(out_n, type), pdx = gpu_buffer(in_n, type);
      Tensor pargmax = gpu_buffer(out_n, DType::i32);
      kernels::cuda::max_pool2d_forward(s, type, px.data(), py.data(),
                                        pargmax.data_as<std::int32_t>(), nullptr);
      kernels::cuda::max_pool2d_backward(s, type, pdy.data(), pargmax.data_as<std::int32_t>(),
                                         pdx.data(), nullptr);
      CHECK(bit_mismatches(y, transpose_images(to_host(py), e, s.batch, s.channels, out_hw), e) ==
            0);
      CHECK(bit_mismatches(argmax,
                           transpose_images(to_host(pargmax), 4, s.batch, s.channels, out_hw),
                           4) == 0);
      CHECK(bit_mismatches(dx, transpose_images(to_host(pdx), e, s.batch, s.channels, in_hw), e) ==
            0);
    }
}

TEST_CASE("cuda NHWC average pooling matches the cpu and the cuda NCHW kernels",
          "[gpu][pooling][nhwc]") {
  for (const DType type : kFloatTypes)
    for (const bool count_include_pad : {true, false})
      for (const auto& s : gpu_cases()) {
        CAPTURE(dtype_name(type), count_include_pad, s.batch, s.channels, s.in_h, s.in_w,
                s.kernel_h, s.kernel_w, s.stride_h, s.pad_h);
        const std::size_t e = dtype_size(type);
        const std::int64_t in_hw = s.in_h * s.in_w, out_hw = s.out_h() * s.out_w();
        const std::int64_t in_n = s.batch * s.channels * in_hw;
        const std::int64_t out_n = s.batch * s.channels * out_hw;
        const auto x = test::raw_from_f32(test::random_values(in_n, 61), type);
        const auto dy = test::raw_from_f32(test::random_values(out_n, 62), type);
        std::vector<char> cpu_y(out_n * e), cpu_dx(in_n * e);
        kernels::cpu::avg_pool2d_forward(nhwc(s), type, count_include_pad, x.data(), cpu_y.data());
        kernels::cpu::avg_pool2d_backward(nhwc(s), type, count_include_pad, dy.data(),
                                          cpu_dx.data());

        const Tensor gx = on_gpu(x, e, type), gdy = on_gpu(dy, e, type);
        Tensor gy = gpu_buffer(out_n, type), gdx = gpu_buffer(in_n, type);
        kernels::cuda::avg_pool2d_forward(nhwc(s), type, count_include_pad, gx.data(), gy.data(),
                                          nullptr);
        kernels::cuda::avg_pool2d_backward(nhwc(s), type, count_include_pad, gdy.data(), gdx.data(),
                                           nullptr);
        const auto y = to_host(gy), dx = to_host(gdx);
        CHECK(bit_mismatches(y, cpu_y, e) == 0);
        CHECK(bit_mismatches(dx, cpu_dx, e) == 0);

        const Tensor px = on_gpu(transpose_images(x, e, s.batch, in_hw, s.channels), e, type);
        const Tensor pdy = on_gpu(transpose_images(dy, e, s.batch, out_hw, s.channels), e, type);
        Tensor py = gpu_buffer(out_n, type), pdx = gpu_buffer(in_n, type);
        kernels::cuda::avg_pool2d_forward(s, type, count_include_pad, px.data(), py.data(),
                                          nullptr);
        kernels::cuda::avg_pool2d_backward(s, type, count_include_pad, pdy.data(), pdx.data(),
                                           nullptr);
        CHECK(bit_mismatches(y, transpose_images(to_host(py), e, s.batch, s.channels, out_hw), e) ==
              0);
        CHECK(bit_mismatches(dx, transpose_images(to_host(pdx), e, s.batch, s.channels, in_hw),
                             e) == 0);
      }
}

TEST_CASE("cuda NHWC global average pooling matches the cpu and the cuda plane form",
          "[gpu][pooling][nhwc]") {
  struct Case {
    std::int64_t batch, spatial, channels;
  };
  // resnet50's head at batch 256, resnet18's at 7x7x512, and odd sizes.
  for (const DType type : kFloatTypes)
    for (const Case c :
         {Case{256, 49, 2048}, Case{3, 49, 512}, Case{2, 9, 37}, Case{5, 1, 3}, Case{1, 17, 1}}) {
      CAPTURE(dtype_name(type), c.batch, c.spatial, c.channels);
      const std::size_t e = dtype_size(type);
      const std::int64_t n = c.batch * c.spatial * c.channels, planes = c.batch * c.channels;
      const auto x = test::raw_from_f32(test::random_values(n, 71), type);  // NHWC
      const auto dy = test::raw_from_f32(test::random_values(planes, 72), type);
      std::vector<char> cpu_y(planes * e), cpu_dx(n * e);
      kernels::cpu::global_avg_pool_nhwc_forward(type, c.batch, c.spatial, c.channels, x.data(),
                                                 cpu_y.data());
      kernels::cpu::global_avg_pool_nhwc_backward(type, c.batch, c.spatial, c.channels, dy.data(),
                                                  cpu_dx.data());
      const Tensor gx = on_gpu(x, e, type), gdy = on_gpu(dy, e, type);
      Tensor gy = gpu_buffer(planes, type), gdx = gpu_buffer(n, type);
      kernels::cuda::global_avg_pool_nhwc_forward(type, c.batch, c.spatial, c.channels, gx.data(),
                                                  gy.data(), nullptr);
      kernels::cuda::global_avg_pool_nhwc_backward(type, c.batch, c.spatial, c.channels, gdy.data(),
                                                   gdx.data(), nullptr);
      const auto y = to_host(gy), dx = to_host(gdx);
      CHECK(bit_mismatches(y, cpu_y, e) == 0);
      CHECK(bit_mismatches(dx, cpu_dx, e) == 0);

      const Tensor px = on_gpu(transpose_images(x, e, c.batch, c.spatial, c.channels), e, type);
      Tensor py = gpu_buffer(planes, type), pdx = gpu_buffer(n, type);
      kernels::cuda::global_avg_pool_forward(type, planes, c.spatial, px.data(), py.data(),
                                             nullptr);
      kernels::cuda::global_avg_pool_backward(type, planes, c.spatial, gdy.data(), pdx.data(),
                                              nullptr);
      CHECK(bit_mismatches(y, to_host(py), e) == 0);
      CHECK(bit_mismatches(dx, transpose_images(to_host(pdx), e, c.batch, c.channels, c.spatial),
                           e) == 0);
    }
}
