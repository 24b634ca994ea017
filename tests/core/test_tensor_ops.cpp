// The custom-layer ops of engine/core/tensor_ops.h on the CPU, each against a
// float64 loop written here (broadcast indexing included), in f32, f16 and
// bf16, and the errors they give for shapes, dims and dtypes they refuse.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/core/tensor_ops.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

// A tensor of random values in [lo, hi] rounded to `type`, and those values.
struct Sample {
  Tensor tensor;
  std::vector<double> values;
};

std::vector<double> values_of(const Tensor& t) {
  const std::vector<float> f = t.cast(DType::f32).to_vector<float>();
  return {f.begin(), f.end()};
}

Sample sample(const Shape& shape, DType type, std::uint32_t seed, double lo = -1.0,
              double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(static_cast<float>(lo), static_cast<float>(hi));
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  Sample s;
  s.tensor = Tensor::from_vector(v, shape, DType::f32).cast(type);
  s.values = values_of(s.tensor);
  return s;
}

// Note [ops tolerance]: the kernels compute in f32 and round once to the
// output type, so a result may be off by `f32_ulps` f32 ulps (0.5 for one
// correctly rounded operation; libm's expf, logf, tanhf are within 1 ulp, and
// a formula adds its steps' errors) plus half an ulp of f16 (2^-11 relative)
// or bf16 (2^-8); f16 subnormals add half their spacing, 2^-25, absolute.
double tolerance(DType type, double reference, double f32_ulps) {
  double relative = f32_ulps * std::ldexp(1.0, -23);
  double absolute = 0.0;
  if (type == DType::f16) {
    relative += std::ldexp(1.0, -11);
    absolute = std::ldexp(1.0, -25);
  } else if (type == DType::bf16) {
    relative += std::ldexp(1.0, -8);
  }
  return relative * std::fabs(reference) + absolute;
}

void require_close(const Tensor& got, const std::vector<double>& reference, double f32_ulps,
                   const std::string& what) {
  const std::vector<double> g = values_of(got);
  REQUIRE(g.size() == reference.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(reference[i]) && std::isnan(g[i])) continue;
    const double tol = tolerance(got.dtype(), reference[i], f32_ulps);
    if (!(std::fabs(g[i] - reference[i]) <= tol))
      FAIL(what << " " << dtype_name(got.dtype()) << ": element " << i << " is " << g[i]
                << ", the float64 loop gives " << reference[i] << " (tolerance " << tol << ")");
  }
}

// The broadcast shape by NumPy's rule, for shapes known to broadcast.
Shape broadcast_shape(const Shape& a, const Shape& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank, 1);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const std::int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// The element of a tensor of `shape` that output element `flat` of `out` reads.
double broadcast_at(const std::vector<double>& values, const Shape& shape, const Shape& out,
                    std::int64_t flat) {
  std::vector<std::int64_t> coord(out.size());
  for (std::size_t i = out.size(); i-- > 0;) {
    coord[i] = flat % out[i];
    flat /= out[i];
  }
  std::int64_t index = 0;
  const std::size_t skip = out.size() - shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i)
    index = index * shape[i] + (shape[i] == 1 ? 0 : coord[skip + i]);
  return values[static_cast<std::size_t>(index)];
}

// [outer, dim, inner] around `dim`, for the reference loops.
struct Around {
  std::int64_t outer = 1, dim = 1, inner = 1;
};
Around around(const Shape& s, std::size_t dim) {
  Around a;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i < dim) a.outer *= s[i];
    if (i > dim) a.inner *= s[i];
  }
  a.dim = s[dim];
  return a;
}

}  // namespace

TEST_CASE("broadcasting binary ops match a float64 loop over the broadcast shape", "[core][ops]") {
  struct Pair {
    Shape a, b;
  };
  const Pair pairs[] = {
      {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}},    {{5, 1}, {1, 6}}, {{}, {3}},
      {{3, 1, 2}, {1, 4, 1}}, {{1}, {2, 2}},    {{2, 3, 4}, {2, 1, 4}}, {{0, 3}, {3}}};
  struct Op {
    const char* name;
    Tensor (*run)(const Tensor&, const Tensor&, const Stream&);
    double (*ref)(double, double);
  };
  const Op ops[] = {
      {"add", ops::add, [](double x, double y) { return x + y; }},
      {"sub", ops::sub, [](double x, double y) { return x - y; }},
      {"mul", ops::mul, [](double x, double y) { return x * y; }},
      {"div", ops::div, [](double x, double y) { return x / y; }},
      {"maximum", ops::maximum, [](double x, double y) { return std::max(x, y); }},
      {"minimum", ops::minimum, [](double x, double y) { return std::min(x, y); }},
  };
  for (DType type : kFloatTypes)
    for (const Pair& p : pairs)
      for (const Op& op : ops) {
        const Sample a = sample(p.a, type, 1);
        // Divisors in [0.5, 2]: away from 0, so that no quotient overflows f16.
        const Sample b =
            std::string(op.name) == "div" ? sample(p.b, type, 2, 0.5, 2.0) : sample(p.b, type, 2);
        const Tensor y = op.run(a.tensor, b.tensor, {});
        const Shape out = broadcast_shape(p.a, p.b);
        REQUIRE(y.shape() == out);
        REQUIRE(y.dtype() == type);
        std::vector<double> ref(static_cast<std::size_t>(shape_numel(out)));
        for (std::int64_t i = 0; i < shape_numel(out); ++i)
          ref[i] = op.ref(broadcast_at(a.values, p.a, out, i), broadcast_at(b.values, p.b, out, i));
        // One correctly rounded f32 operation: half an f32 ulp.
        require_close(y, ref, 0.5,
                      std::string(op.name) + " " + shape_str(p.a) + " " + shape_str(p.b));
      }
}

TEST_CASE("binary ops on two float dtypes compute and return f32", "[core][ops]") {
  const Sample h = sample({4, 3}, DType::f16, 3), b = sample({3}, DType::bf16, 4),
               f = sample({4, 1}, DType::f32, 5);
  for (const auto& [x, y] : {std::pair{&h, &b}, std::pair{&h, &f}, std::pair{&b, &f}}) {
    const Tensor z = ops::mul(x->tensor, y->tensor);
    CHECK(z.dtype() == DType::f32);
    const Shape out = broadcast_shape(x->tensor.shape(), y->tensor.shape());
    std::vector<double> ref(static_cast<std::size_t>(shape_numel(out)));
    for (std::int64_t i = 0; i < shape_numel(out); ++i)
      ref[i] = broadcast_at(x->values, x->tensor.shape(), out, i) *
               broadcast_at(y->values, y->tensor.shape(), out, i);
    require_close(z, ref, 0.5, "mixed mul");
  }
  const Sample b2 = sample({3}, DType::bf16, 6);
  CHECK(ops::add(b.tensor, b2.tensor).dtype() == DType::bf16);
}

TEST_CASE("scalar operands keep the tensor's dtype, on either side", "[core][ops]") {
  for (DType type : kFloatTypes) {
    const Sample x = sample({2, 5}, type, 7, 0.25, 2.0);
    struct Case {
      Tensor y;
      double (*ref)(double);
      const char* what;
    };
    const Case cases[] = {
        {ops::add(x.tensor, 1.0), [](double v) { return v + 1.0; }, "x + 1"},
        {ops::add(0.5, x.tensor), [](double v) { return 0.5 + v; }, "0.5 + x"},
        {ops::sub(x.tensor, 3.0), [](double v) { return v - 3.0; }, "x - 3"},
        {ops::sub(1.0, x.tensor), [](double v) { return 1.0 - v; }, "1 - x"},
        {ops::mul(x.tensor, 0.125), [](double v) { return v * 0.125; }, "x * 0.125"},
        {ops::mul(-2.0, x.tensor), [](double v) { return -2.0 * v; }, "-2 * x"},
        {ops::div(x.tensor, 4.0), [](double v) { return v / 4.0; }, "x / 4"},
        {ops::div(1.0, x.tensor), [](double v) { return 1.0 / v; }, "1 / x"},
        {ops::maximum(x.tensor, 1.0), [](double v) { return std::max(v, 1.0); }, "max(x, 1)"},
        {ops::minimum(x.tensor, 1.0), [](double v) { return std::min(v, 1.0); }, "min(x, 1)"},
    };
    for (const Case& c : cases) {
      CHECK(c.y.dtype() == type);
      CHECK(c.y.shape() == x.tensor.shape());
      std::vector<double> ref;
      for (double v : x.values) ref.push_back(c.ref(v));
      require_close(c.y, ref, 0.5, c.what);
    }
  }
}

TEST_CASE("unary ops match the float64 functions", "[core][ops]") {
  struct Op {
    const char* name;
    Tensor (*run)(const Tensor&, const Stream&);
    double (*ref)(double);
    double lo, hi;
    double f32_ulps;  // Note [ops tolerance]
  };
  const Op ops[] = {
      {"exp", ops::exp, [](double v) { return std::exp(v); }, -8, 8, 1},
      {"log", ops::log, [](double v) { return std::log(v); }, 1e-3, 50, 1},
      // expf (1 ulp), the sum and the quotient (half an ulp each).
      {"sigmoid", ops::sigmoid, [](double v) { return 1 / (1 + std::exp(-v)); }, -12, 12, 2},
      {"tanh", ops::tanh, [](double v) { return std::tanh(v); }, -5, 5, 1},
      {"relu", ops::relu, [](double v) { return v > 0 ? v : 0.0; }, -2, 2, 0},
      {"abs", ops::abs, [](double v) { return std::fabs(v); }, -2, 2, 0},
      {"sqrt", ops::sqrt, [](double v) { return std::sqrt(v); }, 0, 9, 0.5},
      {"neg", ops::neg, [](double v) { return -v; }, -2, 2, 0},
  };
  for (DType type : kFloatTypes)
    for (const Op& op : ops) {
      const Sample x = sample({3, 7, 5}, type, 11, op.lo, op.hi);
      const Tensor y = op.run(x.tensor, {});
      REQUIRE(y.shape() == x.tensor.shape());
      REQUIRE(y.dtype() == type);
      std::vector<double> ref;
      for (double v : x.values) ref.push_back(op.ref(v));
      require_close(y, ref, op.f32_ulps, op.name);
    }
}

TEST_CASE("relu, maximum, minimum and max propagate NaN as PyTorch does", "[core][ops]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::from_vector<float>({nan, 1.0f, -1.0f, 2.0f}, {2, 2}, DType::f32);
  const Tensor one = Tensor::from_vector<float>({1.0f}, {1}, DType::f32);
  CHECK(std::isnan(ops::relu(x).to_vector<float>()[0]));
  CHECK(std::isnan(ops::maximum(x, one).to_vector<float>()[0]));
  CHECK(std::isnan(ops::maximum(one, x).to_vector<float>()[0]));
  CHECK(std::isnan(ops::minimum(one, x).to_vector<float>()[0]));
  const std::vector<float> row_max = ops::max(x, 1).to_vector<float>();
  CHECK(std::isnan(row_max[0]));
  CHECK(row_max[1] == 2.0f);
  const std::vector<float> column_max = ops::max(x, 0).to_vector<float>();
  CHECK(std::isnan(column_max[0]));
  CHECK(column_max[1] == 2.0f);
}

TEST_CASE("where selects over the broadcast shape of condition and operands", "[core][ops]") {
  const std::vector<std::uint8_t> mask = {1, 0, 1};
  const Tensor cond = Tensor::from_vector(mask, {3, 1}, DType::u8);
  for (DType type : kFloatTypes) {
    const Sample a = sample({3, 4}, type, 21), b = sample({4}, type, 22);
    const Tensor y = ops::where(cond, a.tensor, b.tensor);
    REQUIRE(y.shape() == Shape{3, 4});
    std::vector<double> ref;
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 4; ++j)
        ref.push_back(mask[i] ? a.values[i * 4 + j] : b.values[j]);
    require_close(y, ref, 0, "where");  // a selection: exact
  }
  // A float condition: nonzero selects a.
  const Tensor fcond = Tensor::from_vector<float>({0.0f, -0.5f}, {2}, DType::f32);
  const Tensor a = Tensor::from_vector<float>({1, 2}, {2}, DType::f32);
  const Tensor b = Tensor::from_vector<float>({3, 4}, {2}, DType::f32);
  CHECK(ops::where(fcond, a, b).to_vector<float>() == std::vector<float>{3, 2});
}

TEST_CASE("softmax and log_softmax along each dim match the float64 formula", "[core][ops]") {
  const Shape shape = {3, 5, 4};
  for (DType type : kFloatTypes)
    for (int dim : {0, 1, 2, -1}) {
      const Sample x = sample(shape, type, 31, -4, 4);
      const Around a = around(shape, static_cast<std::size_t>(dim < 0 ? dim + 3 : dim));
      std::vector<double> soft(x.values.size()), log_soft(x.values.size());
      for (std::int64_t o = 0; o < a.outer; ++o)
        for (std::int64_t i = 0; i < a.inner; ++i) {
          auto at = [&](std::int64_t j) { return (o * a.dim + j) * a.inner + i; };
          double m = -INFINITY, s = 0;
          for (std::int64_t j = 0; j < a.dim; ++j) m = std::max(m, x.values[at(j)]);
          for (std::int64_t j = 0; j < a.dim; ++j) s += std::exp(x.values[at(j)] - m);
          for (std::int64_t j = 0; j < a.dim; ++j) {
            soft[at(j)] = std::exp(x.values[at(j)] - m) / s;
            log_soft[at(j)] = x.values[at(j)] - m - std::log(s);
          }
        }
      // x - m rounds by up to half an ulp of 8, which exp turns into 4 ulps
      // relative; expf adds 1; the sum carries the same 5 and the quotient
      // half an ulp: 10.5 f32 ulps at most, so 12.
      require_close(ops::softmax(x.tensor, dim), soft, 12, "softmax dim " + std::to_string(dim));
      require_close(ops::log_softmax(x.tensor, dim), log_soft, 12,
                    "log_softmax dim " + std::to_string(dim));
    }
}

TEST_CASE("sum, mean and max along a dim, with and without keepdim", "[core][ops]") {
  const Shape shape = {4, 3, 6};
  for (DType type : kFloatTypes)
    for (int dim : {0, 1, 2, -2})
      for (bool keepdim : {false, true}) {
        const Sample x = sample(shape, type, 41);
        const std::size_t d = static_cast<std::size_t>(dim < 0 ? dim + 3 : dim);
        const Around a = around(shape, d);
        Shape out = shape;
        if (keepdim)
          out[d] = 1;
        else
          out.erase(out.begin() + static_cast<std::ptrdiff_t>(d));
        std::vector<double> sum, mean, max;
        for (std::int64_t o = 0; o < a.outer; ++o)
          for (std::int64_t i = 0; i < a.inner; ++i) {
            double s = 0, m = -INFINITY;
            for (std::int64_t j = 0; j < a.dim; ++j) {
              const double v = x.values[(o * a.dim + j) * a.inner + i];
              s += v;
              m = std::max(m, v);
            }
            sum.push_back(s);
            mean.push_back(s / static_cast<double>(a.dim));
            max.push_back(m);
          }
        const std::string what = "dim " + std::to_string(dim) + (keepdim ? " keepdim" : "");
        const Tensor ts = ops::sum(x.tensor, dim, keepdim), tm = ops::mean(x.tensor, dim, keepdim),
                     tx = ops::max(x.tensor, dim, keepdim);
        CHECK(ts.shape() == out);
        CHECK(tm.shape() == out);
        CHECK(tx.shape() == out);
        // An f64 sum of a handful of f32 values is exact to far below an f32
        // ulp: only the final rounding remains (half an ulp).
        require_close(ts, sum, 0.5, "sum " + what);
        require_close(tm, mean, 0.5, "mean " + what);
        require_close(tx, max, 0, "max " + what);  // one of the inputs: exact
      }
}

TEST_CASE("slice and concat copy the elements a loop picks", "[core][ops]") {
  const Shape shape = {3, 5, 2};
  std::vector<std::int64_t> v(30);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>(i) * 7 - 40;
  const Tensor x = Tensor::from_vector(v, shape, DType::i64);

  const Tensor s = ops::slice(x, 1, 1, 4);
  REQUIRE(s.shape() == Shape{3, 3, 2});
  std::vector<std::int64_t> ref;
  for (int o = 0; o < 3; ++o)
    for (int j = 1; j < 4; ++j)
      for (int i = 0; i < 2; ++i) ref.push_back(v[(o * 5 + j) * 2 + i]);
  CHECK(s.to_vector<std::int64_t>() == ref);
  // Negative bounds count from the end, as in Python: [-2, -1) is [3, 4).
  CHECK(ops::slice(x, -2, -2, -1).to_vector<std::int64_t>() ==
        ops::slice(x, 1, 3, 4).to_vector<std::int64_t>());
  CHECK(ops::slice(x, 0, 2, 2).shape() == Shape{0, 5, 2});

  // concat(slices) rebuilds x, along each dim.
  for (int dim : {0, 1, 2}) {
    const std::int64_t size = shape[dim];
    const Tensor joined = ops::concat(
        {ops::slice(x, dim, 0, 1), ops::slice(x, dim, 1, size), ops::slice(x, dim, size, size)},
        dim);
    CHECK(joined.shape() == shape);
    CHECK(joined.to_vector<std::int64_t>() == v);
  }
  const Sample a = sample({2, 3}, DType::bf16, 51), b = sample({2, 1}, DType::bf16, 52);
  const Tensor ab = ops::concat({a.tensor, b.tensor}, -1);
  REQUIRE(ab.shape() == Shape{2, 4});
  const std::vector<double> got = values_of(ab);
  CHECK(got == std::vector<double>{a.values[0], a.values[1], a.values[2], b.values[0], a.values[3],
                                   a.values[4], a.values[5], b.values[1]});
}

TEST_CASE("ops name the op, the shapes and the fix when they refuse", "[core][ops]") {
  const Tensor a = Tensor::zeros({2, 3}, DType::f32), b = Tensor::zeros({4}, DType::f32);
  CHECK_THROWS_WITH(ops::add(a, b), Catch::Contains("add") && Catch::Contains("[2, 3]") &&
                                        Catch::Contains("[4]") && Catch::Contains("broadcast"));
  CHECK_THROWS_AS(ops::where(Tensor::zeros({5}, DType::u8), a, a), InvalidArgument);
  CHECK_THROWS_WITH(ops::softmax(a, 2), Catch::Contains("softmax") && Catch::Contains("dim 2") &&
                                            Catch::Contains("-2 to 1"));
  CHECK_THROWS_WITH(ops::sum(a, -3), Catch::Contains("sum") && Catch::Contains("[2, 3]"));
  const Tensor ints = Tensor::zeros({3}, DType::i32);
  CHECK_THROWS_WITH(ops::exp(ints),
                    Catch::Contains("exp") && Catch::Contains("i32") && Catch::Contains("cast"));
  CHECK_THROWS_WITH(ops::mul(a, ints), Catch::Contains("mul") && Catch::Contains("i32"));
  CHECK_THROWS_WITH(ops::where(Tensor::zeros({3}, DType::i64), a, a),
                    Catch::Contains("where") && Catch::Contains("i64"));
  CHECK_THROWS_WITH(ops::max(Tensor::zeros({2, 0}, DType::f32), 1),
                    Catch::Contains("max") && Catch::Contains("empty"));
  CHECK_THROWS_WITH(ops::slice(a, 1, 2, 5), Catch::Contains("slice") && Catch::Contains("[2, 5)") &&
                                                Catch::Contains("0..3"));
  CHECK_THROWS_WITH(ops::concat({a, b}, 0), Catch::Contains("concat") && Catch::Contains("part 1"));
  CHECK_THROWS_WITH(ops::concat({a, Tensor::zeros({2, 3}, DType::f16)}, 0), Catch::Contains("f16"));
  CHECK_THROWS_AS(ops::concat({}, 0), InvalidArgument);
  CHECK_THROWS_WITH(ops::exp(Tensor()), Catch::Contains("undefined"));
}
