// The 16-bit sums (comm/detail/half_sum.h): portable loops on kernels/half.h,
// and x86-64 vector versions selected by the CPU the process runs on (the
// build targets baseline x86-64, so they are compiled for their extension
// alone with target attributes).
#include "comm/detail/half_sum.h"

#include "kernels/half.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace lockstep::comm::detail {

void sum_f16_portable(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    inout[i] = kernels::f32_to_f16_bits(kernels::f16_bits_to_f32(in[i]) +
                                        kernels::f16_bits_to_f32(inout[i]));
}

void sum_bf16_portable(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    inout[i] = kernels::f32_to_bf16_bits(kernels::bf16_bits_to_f32(in[i]) +
                                         kernels::bf16_bits_to_f32(inout[i]));
}

#if defined(__x86_64__)
namespace {

// F16C converts eight values each way, rounding to nearest even (overflow to
// inf, subnormals kept), as kernels/half.h does.
__attribute__((target("avx,f16c"))) void sum_f16_f16c(const std::uint16_t* in, std::uint16_t* inout,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i),
                     _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
  sum_f16_portable(in + i, inout + i, n - i);
}

// Eight bf16 values as f32: the bits move to the high half.
__attribute__((target("avx2"))) __m256 widen_bf16(const std::uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// kernels::f32_to_bf16_bits on eight lanes: add 0x7fff plus the lowest kept
// bit (nearest even), keep the high half; NaN becomes 0x7fc0.
__attribute__((target("avx2"))) void sum_bf16_avx2(const std::uint16_t* in, std::uint16_t* inout,
                                                   std::int64_t n) {
  const __m256i round = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i nan = _mm256_set1_epi32(0x7fc0);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_add_ps(widen_bf16(in + i), widen_bf16(inout + i)));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, round), lsb), 16);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i bits = _mm256_blendv_epi8(rounded, nan, is_nan);
    // Lanes hold values below 2^16: pack them, then gather the two halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0xd8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i), _mm256_castsi256_si128(packed));
  }
  sum_bf16_portable(in + i, inout + i, n - i);
}

// F16C is CPUID.1:ECX bit 29; clang 14's __builtin_cpu_supports does not know
// "f16c" (the fuzzing build compiles this file with clang).
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

}  // namespace

void sum_f16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  static const bool f16c = __builtin_cpu_supports("avx") && cpu_has_f16c();
  f16c ? sum_f16_f16c(in, inout, n) : sum_f16_portable(in, inout, n);
}

void sum_bf16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  avx2 ? sum_bf16_avx2(in, inout, n) : sum_bf16_portable(in, inout, n);
}
#else
void sum_f16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  sum_f16_portable(in, inout, n);
}

void sum_bf16(const std::uint16_t* in, std::uint16_t* inout, std::int64_t n) {
  sum_bf16_portable(in, inout, n);
}
#endif

}  // namespace lockstep::comm::detail
