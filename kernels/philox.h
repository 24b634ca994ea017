// Philox4x32-10 random numbers (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11), on CPU and CUDA with identical bits.
//
// Note [Philox stream]: a stream is named by a PhiloxKey (seed, stream id) and
// is a sequence of 32-bit words; word w is lane w % 4 of the Philox block with
// counter (w / 4 as 64 bits, stream id as 64 bits) and key (seed as 64 bits).
// A request for n values starts at word `offset` and uses
// philox_words_used(kind, n) words, so any element can be computed on its own:
// a Generator's whole state is (seed, offset) on stream 0, and keyed users
// (dropout: stream from (step, layer), offset from the global sample index)
// need no state at all.
#pragma once

#include <array>
#include <cstdint>

#include "kernels/stream.h"

namespace lockstep::kernels {

// One Philox4x32-10 block, for known-answer tests and for callers that key
// their own counters.
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter,
                                           std::array<std::uint32_t, 2> key);

struct PhiloxKey {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
};

enum class RandomKind { words, uniform, normal, bernoulli };

// Words of the stream consumed by a request of n values: n, except normal,
// which draws values in Box-Muller pairs (two words per pair).
constexpr std::int64_t philox_words_used(RandomKind kind, std::int64_t n) {
  return kind == RandomKind::normal ? (n + 1) / 2 * 2 : n;
}

// words: raw 32-bit words. uniform: [0, 1) from the top 24 bits of a word.
// normal: Box-Muller from two words. bernoulli: 1 where uniform < keep_prob.
namespace cpu {
void random_words(PhiloxKey key, std::uint64_t offset, std::uint32_t* out, std::int64_t n);
void uniform(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n);
void normal(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n, float mean,
            float stddev);
void bernoulli_mask(PhiloxKey key, std::uint64_t offset, std::uint8_t* out, std::int64_t n,
                    float keep_prob);
}  // namespace cpu

namespace cuda {
void random_words(PhiloxKey key, std::uint64_t offset, std::uint32_t* out, std::int64_t n,
                  CudaStream stream);
void uniform(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n, CudaStream stream);
void normal(PhiloxKey key, std::uint64_t offset, float* out, std::int64_t n, float mean,
            float stddev, CudaStream stream);
void bernoulli_mask(PhiloxKey key, std::uint64_t offset, std::uint8_t* out, std::int64_t n,
                    float keep_prob, CudaStream stream);
}  // namespace cuda

}  // namespace lockstep::kernels
