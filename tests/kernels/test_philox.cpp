// Philox4x32-10 against the Random123 known-answer vectors (kat_vectors), the
// stream layout of Note [Philox stream], and the distributions' statistics.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/philox.h"

using namespace lockstep::kernels;

TEST_CASE("philox4x32-10 reproduces the Random123 known-answer vectors", "[kernels][philox]") {
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
        std::array<std::uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        std::array<std::uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        std::array<std::uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("the word stream is the Philox blocks laid end to end", "[kernels][philox]") {
  const std::uint64_t seed = 0x123456789abcdefull, stream = 0xfedcba9876543210ull;
  std::vector<std::uint32_t> words(13);
  cpu::random_words({seed, stream}, 5, words.data(), 13);  // starts mid-block, ends mid-block
  for (std::uint64_t w = 5; w < 18; ++w) {
    const std::uint64_t block = w / 4;
    const auto r = philox4x32_10(
        {static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
         static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
        {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
    CHECK(words[w - 5] == r[w % 4]);
  }
}

TEST_CASE("consecutive requests continue one stream", "[kernels][philox]") {
  std::vector<float> whole(1000), first(333), rest(667);
  cpu::uniform({9, 0}, 0, whole.data(), 1000);
  cpu::uniform({9, 0}, 0, first.data(), 333);
  cpu::uniform({9, 0}, philox_words_used(RandomKind::uniform, 333), rest.data(), 667);
  first.insert(first.end(), rest.begin(), rest.end());
  CHECK(first == whole);

  std::vector<float> normals(100), head(40), tail(60);
  cpu::normal({9, 0}, 0, normals.data(), 100, 0.0f, 1.0f);
  cpu::normal({9, 0}, 0, head.data(), 40, 0.0f, 1.0f);
  cpu::normal({9, 0}, philox_words_used(RandomKind::normal, 40), tail.data(), 60, 0.0f, 1.0f);
  head.insert(head.end(), tail.begin(), tail.end());
  CHECK(head == normals);
  CHECK(philox_words_used(RandomKind::normal, 41) == 42);
}

// Statistical checks with n = 2^20 samples: the standard error of a mean is
// sigma / 1024, and each bound below is over 6 standard errors, so a correct
// generator fails with probability < 1e-8 (and the seed is fixed anyway).
TEST_CASE("uniforms, normals and masks have the right moments", "[kernels][philox]") {
  const std::int64_t n = 1 << 20;
  std::vector<float> u(n), z(n);
  cpu::uniform({42, 0}, 0, u.data(), n);
  cpu::normal({42, 0}, 7, z.data(), n, 2.0f, 3.0f);
  double su = 0, su2 = 0, sz = 0, sz2 = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    REQUIRE(u[i] >= 0.0f);
    REQUIRE(u[i] < 1.0f);
    su += u[i], su2 += double(u[i]) * u[i];
    sz += z[i], sz2 += double(z[i]) * z[i];
  }
  const double mean_u = su / n, var_u = su2 / n - mean_u * mean_u;
  CHECK(std::fabs(mean_u - 0.5) < 6 * std::sqrt(1.0 / 12) / 1024);
  CHECK(std::fabs(var_u - 1.0 / 12) < 6 * 0.0745 / 1024);  // sd of (u - 1/2)^2 is 0.0745
  const double mean_z = sz / n, var_z = sz2 / n - mean_z * mean_z;
  CHECK(std::fabs(mean_z - 2.0) < 6 * 3.0 / 1024);
  CHECK(std::fabs(var_z - 9.0) < 6 * 9.0 * std::sqrt(2.0) / 1024);

  std::vector<std::uint8_t> mask(n);
  cpu::bernoulli_mask({42, 0}, 0, mask.data(), n, 0.9f);
  double kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    REQUIRE(mask[i] <= 1);
    kept += mask[i];
  }
  CHECK(std::fabs(kept / n - 0.9) < 6 * 0.3 / 1024);
  // The mask is the uniform stream thresholded.
  for (std::int64_t i = 0; i < 1000; ++i) CHECK(mask[i] == (u[i] < 0.9f ? 1 : 0));
}
