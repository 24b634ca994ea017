// The CPU's masked elementwise loops (ReLU's backward, kernels/activation.h;
// dropout's mask, kernels/dropout.h) against plain f64 selects: both load
// unconditionally and select without a branch, so the cases a select makes
// easy to get wrong (inf and NaN where the mask drops, tails shorter than a
// vector) are checked at every length up to a few vectors.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/half.h"

using namespace lockstep;
namespace cpu = lockstep::kernels::cpu;

namespace {

// Values in [-2, 2] with an inf, a -inf and a NaN spread through them.
std::vector<float> values_with_nonfinite(std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (std::int64_t i = 0; i < n; i += 5) v[i] = specials[(i / 5) % 3];
  return v;
}

// Compares bit patterns, so that +0 and -0 differ and NaN equals NaN.
std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

}  // namespace

TEST_CASE("dropout's mask keeps x * scale and gives +0 where it drops, inf and NaN too",
          "[kernels][dropout]") {
  const float scale = 1.0f / 0.7f;
  std::mt19937 rng(3);
  for (std::int64_t n = 1; n <= 37; ++n) {
    const std::vector<float> x = values_with_nonfinite(n, static_cast<std::uint32_t>(n));
    std::vector<std::uint8_t> mask(static_cast<std::size_t>(n));
    for (auto& m : mask) m = static_cast<std::uint8_t>(rng() % 2);
    std::vector<float> y(static_cast<std::size_t>(n));
    cpu::apply_mask(x.data(), mask.data(), y.data(), DType::f32, n, scale);
    for (std::int64_t i = 0; i < n; ++i) {
      // A product of two f32 values is exact in f64: rounding it once is the f32 product.
      const float expected = mask[i] ? static_cast<float>(double(x[i]) * scale) : 0.0f;
      INFO("n " << n << ", element " << i << ", x " << x[i] << ", mask " << int(mask[i]));
      if (expected != expected)
        REQUIRE(y[i] != y[i]);
      else
        REQUIRE(bits(y[i]) == bits(expected));
    }
  }
}

TEST_CASE("ReLU's backward passes dy where x > 0 and +0 elsewhere, inf and NaN too",
          "[kernels][activation]") {
  // f32 runs the vectorised loop; f16 and bf16 the generic one, which
  // multiplied dy by a 0/1 derivative until both selected (Note [relu
  // backward selects]): inf * 0 gave NaN where PyTorch gives 0.
  for (DType type : {DType::f32, DType::f16, DType::bf16}) {
    auto store = [type](float v) {
      return type == DType::f16 ? kernels::f32_to_f16_bits(v) : kernels::f32_to_bf16_bits(v);
    };
    auto load = [type](std::uint16_t b) {
      return type == DType::f16 ? kernels::f16_bits_to_f32(b) : kernels::bf16_bits_to_f32(b);
    };
    for (std::int64_t n = 1; n <= 37; ++n) {
      // Values exact in every type: round them through the 16-bit type first.
      std::vector<float> x = values_with_nonfinite(n, static_cast<std::uint32_t>(n));
      std::vector<float> dy = values_with_nonfinite(n, static_cast<std::uint32_t>(100 + n));
      std::vector<float> dx(static_cast<std::size_t>(n));
      if (type == DType::f32) {
        cpu::activation_backward(kernels::Activation::relu, dy.data(), x.data(), dx.data(), type,
                                 n);
      } else {
        std::vector<std::uint16_t> x16(x.size()), dy16(x.size()), dx16(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
          x16[i] = store(x[i]);
          dy16[i] = store(dy[i]);
          x[i] = load(x16[i]);
          dy[i] = load(dy16[i]);
        }
        cpu::activation_backward(kernels::Activation::relu, dy16.data(), x16.data(), dx16.data(),
                                 type, n);
        for (std::size_t i = 0; i < x.size(); ++i) dx[i] = load(dx16[i]);
      }
      for (std::int64_t i = 0; i < n; ++i) {
        const float expected = double(x[i]) > 0.0 ? dy[i] : 0.0f;  // NaN > 0 is false
        INFO(dtype_name(type) << ", n " << n << ", element " << i << ", x " << x[i] << ", dy "
                              << dy[i]);
        if (expected != expected)
          REQUIRE(dx[i] != dx[i]);
        else
          REQUIRE(bits(dx[i]) == bits(expected));
      }
    }
  }
}
