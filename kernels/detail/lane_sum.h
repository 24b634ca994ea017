// Sums in f64 over eight interleaved lanes, for the CPU kernels' row
// reductions: a single in-order f64 sum is a chain of dependent adds that no
// compiler may vectorise, eight independent lanes GCC turns into vector adds
// (4 f64 per AVX2 register). The order is fixed (lanes, then lanes 0..7 in
// turn, then the tail), so every ISA clone gives the same bits.
#pragma once

#include <cstdint>

namespace lockstep::kernels::detail {

constexpr std::int64_t kSumLanes = 8;

// The sum of term(j) for j < n, term returning a double.
template <typename Term>
[[gnu::always_inline]] inline double lane_sum(std::int64_t n, Term&& term) {
  double lane[kSumLanes] = {};
  const std::int64_t whole = n - n % kSumLanes;
  for (std::int64_t j = 0; j < whole; j += kSumLanes)
    for (std::int64_t k = 0; k < kSumLanes; ++k) lane[k] += term(j + k);
  double sum = 0.0;
  for (std::int64_t k = 0; k < kSumLanes; ++k) sum += lane[k];
  for (std::int64_t j = whole; j < n; ++j) sum += term(j);
  return sum;
}

}  // namespace lockstep::kernels::detail
