// The custom-layer ops of engine/core/tensor_ops.h on CUDA against their CPU
// reference, queued on a non-blocking stream (and on the synchronous CPU
// stream): bit for bit where both backends compute the same IEEE f32
// operations, within stated tolerances where CUDA's libm or the summation
// order differ.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "engine/core/tensor_ops.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const Device kGpu = Device::cuda(0);
const DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

Tensor random_tensor(const Shape& shape, DType type, std::uint32_t seed, float lo = -1.0f,
                     float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape, DType::f32).cast(type);
}

std::vector<float> values_of(const Tensor& t, const Stream& stream = {}) {
  return t.cast(DType::f32, stream).to_vector<float>(stream);
}

// CUDA within `f32_ulps` f32 ulps of the CPU, plus `low_ulps` ulps of the
// 16-bit output type (two nearby f32 values may round to neighbouring f16s;
// for an f16 subnormal that ulp is 2^-24 absolute). Zero for both: equal
// values (NaN equals NaN).
void require_match(const Tensor& gpu, const Tensor& cpu, double f32_ulps, double low_ulps,
                   const std::string& what, const Stream& stream) {
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.shape() == cpu.shape());
  REQUIRE(gpu.dtype() == cpu.dtype());
  const std::vector<float> g = values_of(gpu, stream), c = values_of(cpu);
  const double low_ulp = gpu.dtype() == DType::f16    ? std::ldexp(1.0, -10)
                         : gpu.dtype() == DType::bf16 ? std::ldexp(1.0, -7)
                                                      : 0.0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(c[i])) continue;
    const double subnormal_ulp = gpu.dtype() == DType::f16 ? std::ldexp(1.0, -24) : 0.0;
    const double tol = (f32_ulps * std::ldexp(1.0, -23) + low_ulps * low_ulp) * std::fabs(c[i]) +
                       low_ulps * subnormal_ulp;
    if (!(std::fabs(static_cast<double>(g[i]) - c[i]) <= tol))
      FAIL(what << " " << dtype_name(gpu.dtype()) << ": element " << i << " is " << g[i]
                << " on CUDA and " << c[i] << " on the CPU (tolerance " << tol << ")");
  }
}

}  // namespace

TEST_CASE("cuda pointwise ops match the cpu on a non-blocking stream", "[gpu][ops]") {
  const Stream stream = Stream::create(kGpu);
  using Binary = std::function<Tensor(const Tensor&, const Tensor&, const Stream&)>;
  const std::pair<const char*, Binary> binaries[] = {
      {"add", [](auto& a, auto& b, auto& s) { return ops::add(a, b, s); }},
      {"sub", [](auto& a, auto& b, auto& s) { return ops::sub(a, b, s); }},
      {"mul", [](auto& a, auto& b, auto& s) { return ops::mul(a, b, s); }},
      {"div", [](auto& a, auto& b, auto& s) { return ops::div(a, b, s); }},
      {"maximum", [](auto& a, auto& b, auto& s) { return ops::maximum(a, b, s); }},
      {"minimum", [](auto& a, auto& b, auto& s) { return ops::minimum(a, b, s); }},
      {"1 - a * 0.5",
       [](auto& a, auto&, auto& s) { return ops::sub(1.0, ops::mul(a, 0.5, s), s); }},
  };
  const std::pair<Shape, Shape> shapes[] = {
      {{64, 129}, {64, 129}}, {{64, 129}, {129}}, {{7, 1, 33}, {5, 1}}, {{3, 1, 2, 1}, {4, 1, 9}}};
  for (DType type : kFloatTypes)
    for (const auto& [sa, sb] : shapes) {
      const Tensor a = random_tensor(sa, type, 1), b = random_tensor(sb, type, 2, 0.5f, 2.0f);
      const Tensor ga = a.to(kGpu, stream), gb = b.to(kGpu, stream);
      for (const auto& [name, op] : binaries)  // IEEE f32 operations on both: equal
        require_match(op(ga, gb, stream), op(a, b, {}), 0, 0, name, stream);
      const Tensor cond = Tensor::from_vector<float>({1, 0, 0, 1, 1}, {5, 1}, DType::f32);
      if (sa == Shape{7, 1, 33})
        require_match(ops::where(cond.to(kGpu, stream), ga, gb, stream), ops::where(cond, a, b), 0,
                      0, "where", stream);
    }
  // Mixed dtypes promote the same way on both.
  const Tensor h = random_tensor({8, 16}, DType::f16, 3), f = random_tensor({16}, DType::f32, 4);
  require_match(ops::add(h.to(kGpu, stream), f.to(kGpu, stream), stream), ops::add(h, f), 0, 0,
                "f16 + f32", stream);

  struct Unary {
    const char* name;
    Tensor (*run)(const Tensor&, const Stream&);
    float lo, hi;
    // CUDA's expf and tanhf are within 2 ulps, logf 1, glibc's within 1; the
    // two may differ by the sum. sigmoid adds its sum and quotient (an ulp each).
    double f32_ulps;
  };
  const Unary unaries[] = {
      {"exp", ops::exp, -8, 8, 4},           {"log", ops::log, 1e-3f, 50, 3},
      {"sigmoid", ops::sigmoid, -12, 12, 6}, {"tanh", ops::tanh, -5, 5, 4},
      {"relu", ops::relu, -2, 2, 0},         {"abs", ops::abs, -2, 2, 0},
      {"sqrt", ops::sqrt, 0, 9, 0},          {"neg", ops::neg, -2, 2, 0},
  };
  for (DType type : kFloatTypes)
    for (const Unary& u : unaries) {
      const Tensor x = random_tensor({1000, 37}, type, 5, u.lo, u.hi);
      require_match(u.run(x.to(kGpu, stream), stream), u.run(x, {}), u.f32_ulps,
                    u.f32_ulps > 0 ? 1 : 0, u.name, stream);
    }
}

TEST_CASE("cuda softmax and reductions along a dim match the cpu", "[gpu][ops]") {
  const Stream stream = Stream::create(kGpu);
  // inner == 1 (one block per row) and inner > 1 (one thread per column);
  // rows longer than a block of 256 threads.
  const Shape shapes[] = {{33, 1000}, {4, 300, 17}, {2, 3, 5}};
  for (DType type : kFloatTypes)
    for (const Shape& shape : shapes)
      for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
        const Tensor x = random_tensor(shape, type, 11, -6, 6);
        const Tensor g = x.to(kGpu, stream);
        const std::string where = shape_str(shape) + " dim " + std::to_string(dim);
        // The two expf differ by up to 3 ulps, in the numerator and in each
        // term of the sum; the quotient's rounding adds 1: 7, so 10.
        require_match(ops::softmax(g, dim, stream), ops::softmax(x, dim), 10, 1, "softmax " + where,
                      stream);
        require_match(ops::log_softmax(g, dim, stream), ops::log_softmax(x, dim), 10, 1,
                      "log_softmax " + where, stream);
        // f64 sums in another order: the f32 result may round the other way.
        require_match(ops::sum(g, dim, false, stream), ops::sum(x, dim), 1, 1, "sum " + where,
                      stream);
        require_match(ops::mean(g, dim, true, stream), ops::mean(x, dim, true), 1, 1,
                      "mean " + where, stream);
        require_match(ops::max(g, dim, false, stream), ops::max(x, dim), 0, 0, "max " + where,
                      stream);
      }
}

TEST_CASE("cuda slice and concat copy what the cpu copies", "[gpu][ops]") {
  const Stream stream = Stream::create(kGpu);
  for (DType type : kFloatTypes) {
    const Tensor x = random_tensor({6, 10, 3}, type, 21);
    const Tensor g = x.to(kGpu, stream);
    for (int dim = 0; dim < 3; ++dim) {
      const std::int64_t size = x.dim(dim);
      const Tensor gs = ops::slice(g, dim, 1, size - 1, stream);
      require_match(gs, ops::slice(x, dim, 1, size - 1), 0, 0, "slice", stream);
      const Tensor joined =
          ops::concat({ops::slice(g, dim, 0, 1, stream), gs, ops::slice(g, dim, -1, size, stream)},
                      dim, stream);
      require_match(joined, x, 0, 0, "concat", stream);
    }
  }
}

TEST_CASE("cuda ops on the cpu stream are synchronous, and devices must agree", "[gpu][ops]") {
  const Tensor x = random_tensor({5, 7}, DType::f32, 31);
  const Tensor g = x.to(kGpu);
  require_match(ops::softmax(ops::mul(g, g), -1), ops::softmax(ops::mul(x, x), -1), 8, 0,
                "softmax(x * x) on the cpu stream", Stream());
  CHECK_THROWS_WITH(ops::add(g, x),
                    Catch::Contains("add") && Catch::Contains("cuda:0") && Catch::Contains("cpu"));
  CHECK_THROWS_WITH(ops::concat({g, x}, 0), Catch::Contains("concat") && Catch::Contains("cpu"));
}
