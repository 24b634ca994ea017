// The tree of Note [chunk tree] (comm/ordered_reduce.h) against its
// definition written as a plain recursion over the chunks in one process:
// tree_sum, the ChunkTree over gradients that arrive one chunk at a time, a
// world size's rank partials combined over the ranks, and which world sizes
// a chunk count supports (Note [invariant world sizes]). Every comparison is
// of bits: the values span 40 binades, so another association rounds apart.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/ordered_reduce.h"

using namespace lockstep;

namespace {

constexpr std::int64_t kNumel = 257;

float leaf_value(std::int64_t leaf, std::int64_t i) {
  std::mt19937 rng(static_cast<unsigned>(leaf * 104729 + i));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  return std::ldexp(mantissa(rng), static_cast<int>(rng() % 40) - 20);
}

// The definition: one leaf; halves of a power of two; else the largest power
// of two first, then the rest.
float reference(std::int64_t first, std::int64_t n, std::int64_t i) {
  if (n == 1) return leaf_value(first, i);
  std::int64_t left = 1;
  while (left * 2 < n) left *= 2;
  return reference(first, left, i) + reference(first + left, n - left, i);
}

std::vector<float> reference(std::int64_t first, std::int64_t n) {
  std::vector<float> sum(kNumel);
  for (std::int64_t i = 0; i < kNumel; ++i) sum[i] = reference(first, n, i);
  return sum;
}

// The ChunkTree's sum of leaves [first, first + n), given one at a time.
std::vector<float> chunk_tree(std::int64_t first, std::int64_t n) {
  core::Tensor leaf = core::Tensor::empty({kNumel}, DType::f32);
  comm::ChunkTree tree(leaf, n, core::Stream());
  CHECK(tree.partial_buffers() == static_cast<std::size_t>(std::ceil(std::log2(n))));
  for (std::int64_t j = first; j < first + n; ++j) {
    float* x = leaf.data_as<float>();
    for (std::int64_t i = 0; i < kNumel; ++i) x[i] = leaf_value(j, i);
    tree.add(core::Stream());
  }
  return leaf.to_vector<float>();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("tree_sum and the ChunkTree are the tree's definition, bit for bit", "[comm][tree]") {
  for (std::int64_t n = 1; n <= 13; ++n) {
    INFO(n << " leaves");
    const std::vector<float> want = reference(0, n);
    std::vector<float> got(kNumel);
    for (std::int64_t i = 0; i < kNumel; ++i)
      got[i] = comm::tree_sum<float>(
          n, [&](std::int64_t j) { return leaf_value(j, i); },
          [](float a, float b) { return a + b; });
    CHECK(same_bits(got, want));
    CHECK(same_bits(chunk_tree(0, n), want));
  }
  // Reused for a second step, the tree starts empty again.
  core::Tensor leaf = core::Tensor::empty({kNumel}, DType::f32);
  comm::ChunkTree tree(leaf, 3, core::Stream());
  for (int step = 0; step < 2; ++step)
    for (std::int64_t j = 0; j < 3; ++j) {
      float* x = leaf.data_as<float>();
      for (std::int64_t i = 0; i < kNumel; ++i) x[i] = leaf_value(j, i);
      tree.add(core::Stream());
    }
  CHECK(same_bits(leaf.to_vector<float>(), reference(0, 3)));
}

TEST_CASE(
    "ranks' trees over K chunks, then the tree over the ranks, are the tree over all "
    "chunks exactly when the world size is supported",
    "[comm][tree]") {
  const std::int64_t chunks = 12;
  const std::vector<float> all = reference(0, chunks);
  for (int world = 1; world <= static_cast<int>(chunks); ++world) {
    if (chunks % world != 0) continue;
    const std::int64_t k = chunks / world;
    std::vector<std::vector<float>> partials;
    for (int r = 0; r < world; ++r) partials.push_back(chunk_tree(r * k, k));
    std::vector<float> got(kNumel);
    for (std::int64_t i = 0; i < kNumel; ++i)
      got[i] = comm::tree_sum<float>(
          world, [&](std::int64_t r) { return partials[r][i]; },
          [](float a, float b) { return a + b; });
    INFO(world << " ranks of " << k << " chunks");
    CHECK(same_bits(got, all) == comm::invariant_world_size(chunks, world));
  }
}

TEST_CASE("the world sizes a chunk count supports", "[comm][tree]") {
  CHECK(comm::invariant_world_sizes(12) == std::vector<int>{1, 3, 6, 12});
  CHECK(comm::invariant_world_sizes(8) == std::vector<int>{1, 2, 4, 8});
  CHECK(comm::invariant_world_sizes(7) == std::vector<int>{1, 7});
  CHECK(comm::world_sizes_text({1, 3, 6, 12}) == "1, 3, 6 or 12");
  CHECK(comm::world_sizes_text({1}) == "1");
  CHECK_FALSE(comm::invariant_world_size(12, 5));
}
