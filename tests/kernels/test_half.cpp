// f16 and bf16 conversions against the independent references of
// tests/support/half_reference.h: decoding by std::ldexp of the IEEE fields,
// rounding by a nearest-even search over the patterns in f64.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "kernels/half.h"
#include "support/half_reference.h"

using namespace lockstep::kernels;
using lockstep::test::decode_fields;
using lockstep::test::nearest_even_bits;

namespace {

bool same_float(float a, double b) {
  if (std::isnan(b)) return std::isnan(a);
  return static_cast<double>(a) == b && std::signbit(a) == std::signbit(b);
}

std::uint16_t f16_reference(float f) { return nearest_even_bits(f, 5, 10); }
std::uint16_t bf16_reference(float f) { return nearest_even_bits(f, 8, 7); }

// Inputs that probe rounding around pattern `bits`: its value, the midpoint to
// the next pattern, and the f32 neighbours of that midpoint.
std::vector<float> probes(float value, float next) {
  std::vector<float> out{value};
  if (!std::isfinite(value) || !std::isfinite(next)) return out;
  const float mid = static_cast<float>((static_cast<double>(value) + next) / 2);
  out.push_back(mid);
  out.push_back(std::nextafter(mid, -INFINITY));
  out.push_back(std::nextafter(mid, INFINITY));
  return out;
}

}  // namespace

TEST_CASE("f16 patterns decode to the value their IEEE fields give", "[kernels][half]") {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    INFO("f16 bits 0x" << std::hex << bits);
    REQUIRE(same_float(f16_bits_to_f32(h), decode_fields(h, 5, 10)));
  }
}

TEST_CASE("f32 to f16 rounds to nearest even like IEEE binary16", "[kernels][half]") {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float value = f16_bits_to_f32(h);
    if (std::isnan(value)) {
      REQUIRE(f32_to_f16_bits(value) == ((h & 0x8000) | 0x7e00));  // PyTorch's canonical NaN
      continue;
    }
    const float next = f16_bits_to_f32(static_cast<std::uint16_t>(h + 1));
    const bool next_in_binade = ((h + 1) & 0x8000) == (h & 0x8000);
    for (float probe : probes(value, next_in_binade ? next : INFINITY)) {
      INFO("f16 bits 0x" << std::hex << bits << " probe " << probe);
      REQUIRE(f32_to_f16_bits(probe) == f16_reference(probe));
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 1000000; ++i) {
    const float f = bits_float(any_bits(rng));
    if (std::isnan(f)) continue;
    INFO("f32 bits 0x" << std::hex << float_bits(f));
    REQUIRE(f32_to_f16_bits(f) == f16_reference(f));
  }
}

TEST_CASE("f16 overflow, infinities and signed zeros", "[kernels][half]") {
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65519.99f) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);  // the tie rounds to even: inf
  CHECK(f32_to_f16_bits(-1e10f) == 0xfc00);
  CHECK(f32_to_f16_bits(-0.0f) == 0x8000);
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24
  CHECK(f32_to_f16_bits(std::ldexp(1.5f, -25)) == 0x0001);
}

TEST_CASE("bf16 patterns decode to the value their fields give", "[kernels][half]") {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    INFO("bf16 bits 0x" << std::hex << bits);
    REQUIRE(same_float(bf16_bits_to_f32(b), decode_fields(b, 8, 7)));
  }
}

TEST_CASE("f32 to bf16 rounds to nearest even", "[kernels][half]") {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float value = bf16_bits_to_f32(b);
    if (std::isnan(value)) {
      REQUIRE(f32_to_bf16_bits(value) == 0x7fc0);  // PyTorch's canonical NaN
      continue;
    }
    const float next = bf16_bits_to_f32(static_cast<std::uint16_t>(b + 1));
    const bool next_in_binade = ((b + 1) & 0x8000) == (b & 0x8000);
    for (float probe : probes(value, next_in_binade ? next : INFINITY)) {
      INFO("bf16 bits 0x" << std::hex << bits << " probe " << probe);
      REQUIRE(f32_to_bf16_bits(probe) == bf16_reference(probe));
    }
  }
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds up to inf
  CHECK(f32_to_bf16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
}
