// The CPU layout permutations (kernels/layout.h): a hand-written small
// answer, the element-by-element definition at odd sizes (tiles with edges,
// a single channel, a single pixel) for every element size, and the round
// trip NCHW -> NHWC -> NCHW giving back every bit (NaN payloads included).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/error.h"
#include "kernels/layout.h"

using namespace lockstep;
namespace cpu = lockstep::kernels::cpu;

namespace {

// Random bytes: every bit pattern, NaNs and subnormals of any float type included.
std::vector<std::uint8_t> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::uint8_t> v(n);
  for (auto& b : v) b = static_cast<std::uint8_t>(gen());
  return v;
}

}  // namespace

TEST_CASE("nchw_to_nhwc puts channels last on a hand-worked example", "[kernels][layout]") {
  // x [n=1, c=2, h=2, w=3]: channel 0 holds 0..5, channel 1 holds 10..15.
  const std::vector<float> x = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
  const std::vector<float> nhwc = {0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15};
  std::vector<float> y(12), back(12);
  cpu::nchw_to_nhwc(DType::f32, 1, 2, 2, 3, x.data(), y.data());
  CHECK(y == nhwc);
  cpu::nhwc_to_nchw(DType::f32, 1, 2, 2, 3, y.data(), back.data());
  CHECK(back == x);
}

TEST_CASE("layout permutations follow the definition and round-trip bit for bit at odd sizes",
          "[kernels][layout]") {
  struct Sizes {
    std::int64_t n, c, h, w;
  };
  // Tile edges on both sides (33, 37 against 32-wide tiles), one channel, one
  // pixel, three channels (an RGB input), and a wide C x small HW (resnet's last stage).
  const Sizes sizes[] = {{2, 3, 5, 7}, {1, 33, 6, 7},  {3, 1, 4, 4},
                         {2, 5, 1, 1}, {1, 64, 37, 3}, {2, 2048, 1, 7}};
  for (const DType type : {DType::u8, DType::f16, DType::bf16, DType::f32, DType::i64}) {
    const std::size_t bytes = dtype_size(type);
    for (const Sizes& s : sizes) {
      const std::int64_t hw = s.h * s.w, count = s.n * s.c * hw;
      const auto x = random_bytes(static_cast<std::size_t>(count) * bytes, 7);
      std::vector<std::uint8_t> y(x.size()), back(x.size());
      cpu::nchw_to_nhwc(type, s.n, s.c, s.h, s.w, x.data(), y.data());
      bool ok = true;
      for (std::int64_t b = 0; b < s.n && ok; ++b)
        for (std::int64_t ch = 0; ch < s.c && ok; ++ch)
          for (std::int64_t p = 0; p < hw && ok; ++p)
            ok = std::memcmp(&y[static_cast<std::size_t>((b * hw + p) * s.c + ch) * bytes],
                             &x[static_cast<std::size_t>((b * s.c + ch) * hw + p) * bytes],
                             bytes) == 0;
      INFO(dtype_name(type) << " n " << s.n << " c " << s.c << " h " << s.h << " w " << s.w);
      CHECK(ok);
      cpu::nhwc_to_nchw(type, s.n, s.c, s.h, s.w, y.data(), back.data());
      CHECK(back == x);
    }
  }
}

TEST_CASE("batched_transpose turns a conv weight KCRS into KRSC", "[kernels][layout]") {
  // w [K=2, C=3, R*S=2]: w[k, c, r] = 100 k + 10 c + r.
  std::vector<float> w, krsc(12);
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < 3; ++c)
      for (int r = 0; r < 2; ++r) w.push_back(100.0f * k + 10.0f * c + r);
  cpu::batched_transpose(DType::f32, 2, 3, 2, w.data(), krsc.data());
  CHECK(krsc == std::vector<float>{0, 10, 20, 1, 11, 21, 100, 110, 120, 101, 111, 121});
}

TEST_CASE("layout permutations reject negative sizes naming them", "[kernels][layout]") {
  float x = 0, y = 0;
  CHECK_THROWS_AS(cpu::nchw_to_nhwc(DType::f32, 1, -2, 1, 1, &x, &y), InvalidArgument);
  cpu::nchw_to_nhwc(DType::f32, 0, 3, 4, 4, &x, &y);  // empty: nothing to do
}
