// The CUDA layout permutations (kernels/layout.h, Note [transpose tiles] in
// kernels/cuda/layout.cu) against the CPU twin, bit for bit: every element
// size, sizes off the 32 x 32 tile on both sides, the narrow kernel's
// matrices (at most 8 rows or columns, either side), one channel and one pixel,
// resnet50's stem input and its widest activations, on a non-blocking
// stream; and the f32 transpose-add of channels-last weight gradients
// against a host loop of the same single f32 add (bit for bit too).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "kernels/half.h"
#include "kernels/layout.h"

using namespace lockstep;

namespace {

const core::Device kGpu = core::Device::cuda(0);

std::vector<std::uint8_t> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(gen());
  return v;
}

// `bytes` copied to the GPU and back after `launch(device_in, device_out)`.
template <typename Launch>
std::vector<std::uint8_t> on_gpu(const std::vector<std::uint8_t>& in, Launch&& launch) {
  const std::int64_t n = static_cast<std::int64_t>(in.size());
  const core::Tensor x = core::Tensor::from_host(in.data(), {n}, DType::u8, kGpu);
  const core::Tensor y = core::Tensor::zeros({n}, DType::u8, kGpu);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const core::Stream stream = core::Stream::create(kGpu);
  launch(x.data(), y.data(), stream.handle());
  REQUIRE(cudaStreamSynchronize(stream.handle()) == cudaSuccess);
  return y.to_vector<std::uint8_t>();
}

}  // namespace

TEST_CASE("cuda layout permutations equal the cpu's bit for bit", "[gpu][layout][nhwc]") {
  struct Sizes {
    std::int64_t n, c, h, w;
  };
  // Tiled (Note [transpose tiles]) and narrow (at most 8 rows or columns)
  // matrices, both ways round, and the identity (one channel or one pixel).
  const Sizes sizes[] = {{2, 3, 5, 7},    {1, 33, 6, 7},   {3, 1, 4, 4},     {2, 5, 1, 1},
                         {1, 64, 37, 3},  {2, 2048, 7, 7}, {2, 3, 224, 224}, {1, 64, 112, 112},
                         {3, 31, 33, 65}, {4, 256, 1, 1},  {2, 1000, 1, 17}, {2, 8, 9, 9},
                         {2, 9, 5, 5},    {3, 40, 2, 3}};
  for (const DType type : {DType::u8, DType::f16, DType::bf16, DType::f32, DType::i64}) {
    for (const Sizes& s : sizes) {
      INFO(dtype_name(type) << " n " << s.n << " c " << s.c << " h " << s.h << " w " << s.w);
      const std::size_t bytes = static_cast<std::size_t>(s.n * s.c * s.h * s.w) * dtype_size(type);
      const auto x = random_bytes(bytes, 5);
      std::vector<std::uint8_t> nhwc(bytes), nchw(bytes);
      kernels::cpu::nchw_to_nhwc(type, s.n, s.c, s.h, s.w, x.data(), nhwc.data());
      kernels::cpu::nhwc_to_nchw(type, s.n, s.c, s.h, s.w, x.data(), nchw.data());
      CHECK(on_gpu(x, [&](const void* in, void* out, kernels::CudaStream st) {
              kernels::cuda::nchw_to_nhwc(type, s.n, s.c, s.h, s.w, in, out, st);
            }) == nhwc);
      CHECK(on_gpu(x, [&](const void* in, void* out, kernels::CudaStream st) {
              kernels::cuda::nhwc_to_nchw(type, s.n, s.c, s.h, s.w, in, out, st);
            }) == nchw);
    }
  }
}

TEST_CASE("cuda transpose-add folds a KRSC gradient into KCRS f32 exactly", "[gpu][layout][nhwc]") {
  // [batch = K, rows = R*S, cols = C/g] -> [K, C/g, R*S]: resnet50's 3x3
  // 512-channel weight, a 7x7 stem, and a 1x1 (rows 1) with odd widths.
  struct Sizes {
    std::int64_t k, rs, c;
  };
  const Sizes sizes[] = {{512, 9, 512}, {64, 49, 3}, {37, 1, 45}, {5, 9, 33}, {16, 4, 300}};
  for (const DType type : {DType::f32, DType::f16, DType::bf16}) {
    for (const bool accumulate : {false, true}) {
      for (const Sizes& s : sizes) {
        INFO(dtype_name(type) << (accumulate ? " accumulate" : " write") << " k " << s.k << " rs "
                              << s.rs << " c " << s.c);
        const std::int64_t n = s.k * s.rs * s.c;
        std::mt19937 gen(9);
        std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
        std::vector<float> values(static_cast<std::size_t>(n)), dw(values.size());
        for (auto& v : values) v = dist(gen);
        for (auto& v : dw) v = dist(gen);
        // x in `type`, and its exact f32 value.
        std::vector<std::uint8_t> x(static_cast<std::size_t>(n) * dtype_size(type));
        std::vector<float> exact(values.size());
        for (std::size_t i = 0; i < values.size(); ++i) {
          if (type == DType::f32) {
            exact[i] = values[i];
            std::memcpy(&x[i * 4], &values[i], 4);
            continue;
          }
          const std::uint16_t h = type == DType::f16 ? kernels::f32_to_f16_bits(values[i])
                                                     : kernels::f32_to_bf16_bits(values[i]);
          exact[i] =
              type == DType::f16 ? kernels::f16_bits_to_f32(h) : kernels::bf16_bits_to_f32(h);
          std::memcpy(&x[i * 2], &h, 2);
        }
        std::vector<float> want = dw;
        for (std::int64_t b = 0; b < s.k; ++b)
          for (std::int64_t i = 0; i < s.rs; ++i)
            for (std::int64_t j = 0; j < s.c; ++j) {
              float& out = want[static_cast<std::size_t>((b * s.c + j) * s.rs + i)];
              out = (accumulate ? out : 0.0f) +
                    exact[static_cast<std::size_t>((b * s.rs + i) * s.c + j)];
            }
        const core::Tensor x_dev = core::Tensor::from_host(
            x.data(), {static_cast<std::int64_t>(x.size())}, DType::u8, kGpu);
        const core::Tensor dw_dev = core::Tensor::from_vector(dw, {n}, DType::f32, kGpu);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        const core::Stream stream = core::Stream::create(kGpu);
        kernels::cuda::batched_transpose_add_f32(type, s.k, s.rs, s.c, x_dev.data(),
                                                 dw_dev.data_as<float>(), accumulate,
                                                 stream.handle());
        REQUIRE(cudaStreamSynchronize(stream.handle()) == cudaSuccess);
        const std::vector<float> got = dw_dev.to_vector<float>();
        CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
      }
    }
  }
}
