// The 16-bit sums behind the MPI reduction ops for f16 and bf16, both the
// portable loops and the vector code this CPU selects, against the exact sum
// of the decoded inputs rounded by the independent references in
// comm_test_support.h. Decoding uses std::ldexp on the IEEE fields.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <random>
#include <vector>

#include "comm/comm_test_support.h"
#include "comm/detail/half_sum.h"

using namespace lockstep;
using lockstep::test::round_bf16;
using lockstep::test::round_f16;

namespace {

double decode_f16(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * (exp == 0 ? std::ldexp(mant, -24) : std::ldexp(mant + 1024, exp - 25));
}

double decode_bf16(std::uint16_t b) {
  const int exp = (b >> 7) & 0xff, mant = b & 0x7f;
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (exp == 0xff) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * (exp == 0 ? std::ldexp(mant, -133) : std::ldexp(mant + 128, exp - 134));
}

bool same(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

}  // namespace

using SumFunction = void (*)(const std::uint16_t*, std::uint16_t*, std::int64_t);

// Specials first, so that the vector code (not the scalar tail) meets them.
// 200007 elements leave a tail of odd length after the 8-wide loops.
template <typename Random>
void inputs(std::vector<std::uint16_t>& a, std::vector<std::uint16_t>& b,
            const std::vector<std::array<std::uint16_t, 2>>& specials, Random&& random) {
  for (const auto& s : specials) {
    a.push_back(s[0]);
    b.push_back(s[1]);
  }
  while (a.size() < 200007) {
    a.push_back(random());
    b.push_back(random());
  }
}

// Runs `sum` (b += a) and compares each element with the reference rounding of
// the exact sum of the decoded inputs; returns the sums for the special cases.
template <typename Decode, typename Round>
std::vector<std::uint16_t> checked_sum(SumFunction sum, const std::vector<std::uint16_t>& a,
                                       const std::vector<std::uint16_t>& b, Decode decode,
                                       Round round) {
  std::vector<std::uint16_t> out = b;
  sum(a.data(), out.data(), static_cast<std::int64_t>(a.size()));
  std::size_t wrong = 0, first_wrong = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (same(decode(out[i]), round(decode(a[i]) + decode(b[i])))) continue;
    if (wrong++ == 0) first_wrong = i;
  }
  INFO(wrong << " wrong sums, the first at element " << first_wrong << ": 0x" << std::hex
             << a[first_wrong] << " + 0x" << b[first_wrong] << " gave 0x" << out[first_wrong]);
  CHECK(wrong == 0);
  return out;
}

TEST_CASE("f16 sums are the correctly rounded sums of the inputs", "[comm][half]") {
  // Every f16 value is a multiple of 2^-24 below 2^16, so the f64 sum of two
  // is exact and the reference rounds it once.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  std::vector<std::uint16_t> a, b;
  inputs(a, b,
         {
             {0x7bff, 0x7bff},  // 65504 + 65504 overflows to inf
             {0x7c00, 0xfc00},  // inf + -inf is NaN
             {0x8000, 0x8000},  // -0 + -0 = -0
             {0x0000, 0x8000},  // 0 + -0 = +0
             {0x0001, 0x0001},  // subnormals add exactly
             {0x3c00, 0x1000},  // 1 + 2^-11: a tie, to even
         },
         [&] { return static_cast<std::uint16_t>(bits(rng)); });
  for (SumFunction sum_f16 : {&comm::detail::sum_f16, &comm::detail::sum_f16_portable}) {
    INFO((sum_f16 == &comm::detail::sum_f16 ? "selected for this CPU" : "portable"));
    const auto sum = checked_sum(sum_f16, a, b, decode_f16, round_f16);
    CHECK(sum[0] == 0x7c00);
    CHECK(std::isnan(decode_f16(sum[1])));
    CHECK(sum[2] == 0x8000);
    CHECK(sum[3] == 0x0000);
  }
}

TEST_CASE("bf16 sums are the correctly rounded sums of the inputs", "[comm][half]") {
  // Exponents within 2^-20..2^20 keep the f64 sum of two bf16 values exact
  // (8 + 40 bits < 53), so the reference rounds it once.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> exponent(127 - 20, 127 + 20), mantissa(0, 127), sign(0, 1);
  std::vector<std::uint16_t> a, b;
  inputs(
      a, b,
      {
          {0x7f7f, 0x7f7f},  // the largest finite value twice overflows to inf
          {0x7f80, 0xff80},  // inf + -inf is NaN
          {0x0001, 0x0001},  // subnormals
          {0x3f80, 0x3b80},  // 1 + 2^-8: a tie, to even (1)
          {0x3f81, 0x3b80},  // (1 + 2^-7) + 2^-8: a tie, to even (1 + 2^-6)
          {0x7fc1, 0x3f80},  // NaN + 1 is NaN, 0x7fc0 as PyTorch
      },
      [&] {
        return static_cast<std::uint16_t>((sign(rng) << 15) | (exponent(rng) << 7) | mantissa(rng));
      });
  for (SumFunction sum_bf16 : {&comm::detail::sum_bf16, &comm::detail::sum_bf16_portable}) {
    INFO((sum_bf16 == &comm::detail::sum_bf16 ? "selected for this CPU" : "portable"));
    const auto sum = checked_sum(sum_bf16, a, b, decode_bf16, round_bf16);
    CHECK(sum[0] == 0x7f80);
    CHECK(std::isnan(decode_bf16(sum[1])));
    CHECK(sum[3] == 0x3f80);
    CHECK(sum[4] == 0x3f82);
    CHECK(sum[5] == 0x7fc0);
  }
}
