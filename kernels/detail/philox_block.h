// The Philox4x32-10 block function and the word-to-value transforms, shared by
// the CPU and CUDA generators so that both produce the same bits by
// construction (see Note [Philox stream] in kernels/philox.h).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define LOCKSTEP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LOCKSTEP_HOST_DEVICE inline
#endif

namespace lockstep::kernels::detail {

struct PhiloxBlock {
  std::uint32_t v[4];
};

LOCKSTEP_HOST_DEVICE PhiloxBlock philox_block(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                              std::uint32_t c3, std::uint32_t k0,
                                              std::uint32_t k1) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32),
                        lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32),
                        lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// Block b of stream (seed, stream) (Note [Philox stream] in kernels/philox.h).
LOCKSTEP_HOST_DEVICE PhiloxBlock philox_stream_block(std::uint64_t seed, std::uint64_t stream,
                                                     std::uint64_t block) {
  return philox_block(static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                      static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32),
                      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// Word w of stream (seed, stream).
LOCKSTEP_HOST_DEVICE std::uint32_t philox_word(std::uint64_t seed, std::uint64_t stream,
                                               std::uint64_t w) {
  return philox_stream_block(seed, stream, w >> 2).v[w & 3];
}

// [0, 1): exact in f32, so CPU and CUDA agree bit for bit.
LOCKSTEP_HOST_DEVICE float word_to_uniform(std::uint32_t word) {
  return static_cast<float>(word >> 8) * 5.9604644775390625e-8f;  // 2^-24
}

// (0, 1]: the Box-Muller radius takes its log.
LOCKSTEP_HOST_DEVICE float word_to_uniform_open0(std::uint32_t word) {
  return static_cast<float>((word >> 8) + 1u) * 5.9604644775390625e-8f;
}

}  // namespace lockstep::kernels::detail
