// CPU Philox generators (kernels/philox.h); the block function and transforms
// are shared with the CUDA ones through kernels/detail/philox_block.h.
#include <cmath>

#include "kernels/detail/philox_block.h"
#include "kernels/philox.h"

namespace lockstep::kernels {

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key) {
  const detail::PhiloxBlock r =
      detail::philox_block(counter[0], counter[1], counter[2], counter[3], key[0], key[1]);
  return {r.v[0], r.v[1], r.v[2], r.v[3]};
}

namespace cpu {
namespace {
std::uint32_t word(PhiloxKey key, std::uint64_t w) {
  return detail::philox_word(key.seed, key.stream, w);
}
}  // namespace

void random_words(PhiloxKey key, std::uint64_t offset, std::uint32_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = word(key, offset + i);
}

void uniform(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = detail::word_to_uniform(word(key, offset + i));
}

void normal(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n, float mean,
            float stddev) {
  constexpr float kTwoPi = 6.283185307179586f;
  for (std::int64_t pair = 0; 2 * pair < n; ++pair) {
    const float u1 = detail::word_to_uniform_open0(word(key, offset + 2 * pair));
    const float u2 = detail::word_to_uniform(word(key, offset + 2 * pair + 1));
    const float radius = std::sqrt(-2.0f * std::log(u1));
    out[2 * pair] = mean + stddev * radius * std::cos(kTwoPi * u2);
    if (2 * pair + 1 < n) out[2 * pair + 1] = mean + stddev * radius * std::sin(kTwoPi * u2);
  }
}

void bernoulli_mask(PhiloxKey key, std::uint64_t offset, std::uint8_t* out, std::int64_t n,
                    float keep_prob) {
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = detail::word_to_uniform(word(key, offset + i)) < keep_prob ? 1 : 0;
}

}  // namespace cpu
}  // namespace lockstep::kernels
