// Every CUDA op against its CPU reference: bit for bit where both compute the
// same f32 operations (elementwise, casts, fills, Philox words, uniforms and
// masks, ReLU's and dropout's selects), within stated tolerances where they
// may not (GEMM, reductions, normals); and the optimizer kernels' guard on a
// segment's group.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/core/memory.h"
#include "engine/core/ops.h"
#include "engine/core/random.h"
#include "engine/core/tensor.h"
#include "kernels/activation.h"
#include "kernels/dropout.h"
#include "kernels/error.h"
#include "kernels/optimizer.h"
#include "support/reference.h"

using namespace lockstep;
using namespace lockstep::core;

namespace {

const Device kGpu = Device::cuda(0);

Tensor from_bytes(const std::vector<std::uint8_t>& bytes, const Shape& shape, DType type,
                  Device d) {
  return Tensor::from_host(bytes.data(), shape, type, d);
}

std::vector<std::uint8_t> bytes_of(const Tensor& t) {
  std::vector<std::uint8_t> out(t.nbytes());
  t.copy_to_host(out.data());
  return out;
}

// Equal bytes, except that any NaN equals any NaN (CUDA's conversion
// intrinsics and the CPU's PyTorch-style rounding pick different NaN bits).
void require_same_values(const std::vector<std::uint8_t>& gpu, const std::vector<std::uint8_t>& cpu,
                         DType type) {
  REQUIRE(gpu.size() == cpu.size());
  const std::int64_t n = static_cast<std::int64_t>(gpu.size() / dtype_size(type));
  for (std::int64_t i = 0; i < n; ++i) {
    if (is_floating(type)) {
      const float g = test::decode(gpu, type, i), c = test::decode(cpu, type, i);
      if (std::isnan(g) && std::isnan(c)) continue;
    }
    if (std::memcmp(&gpu[i * dtype_size(type)], &cpu[i * dtype_size(type)], dtype_size(type)) != 0)
      FAIL("element " << i << " of " << dtype_name(type) << " differs between CUDA and CPU");
  }
}

}  // namespace

TEST_CASE("cuda gemm matches the float64 loop like the cpu one", "[gpu][gemm]") {
  struct Types {
    DType ab, c;
  };
  const Types cases[] = {{DType::f32, DType::f32},
                         {DType::f16, DType::f32},
                         {DType::f16, DType::f16},
                         {DType::bf16, DType::f32},
                         {DType::bf16, DType::bf16}};
  const std::int64_t sizes[] = {1, 7, 33, 129};
  for (const Types& t : cases)
    for (std::int64_t m : sizes)
      for (std::int64_t n : sizes)
        for (std::int64_t k : sizes)
          for (int tr = 0; tr < 4; ++tr) {
            const bool ta = tr & 1, tb = tr & 2;
            const float alpha = 1.0f, beta = (m + n) % 2 ? 1.0f : 0.0f;
            const auto a = test::random_matrix(m * k, t.ab, 1),
                       b = test::random_matrix(k * n, t.ab, 2);
            const auto c0 = test::random_matrix(m * n, t.c, 3);
            const auto ref =
                test::reference_gemm(ta, tb, m, n, k, alpha, a.values, b.values, beta, c0.values);
            Tensor ga = from_bytes(a.bytes, ta ? Shape{k, m} : Shape{m, k}, t.ab, kGpu);
            Tensor gb = from_bytes(b.bytes, tb ? Shape{n, k} : Shape{k, n}, t.ab, kGpu);
            Tensor gc = from_bytes(c0.bytes, {m, n}, t.c, kGpu);
            ops::matmul(ga, gb, gc, {.trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta});
            const auto got = bytes_of(gc);
            for (std::int64_t i = 0; i < m * n; ++i) {
              const double tol = test::gemm_tolerance(ref.magnitude[i], ref.c[i], k, t.c);
              if (std::fabs(test::decode(got, t.c, i) - ref.c[i]) > tol)
                FAIL("m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb << " "
                          << dtype_name(t.ab) << "->" << dtype_name(t.c) << " element " << i);
            }
          }
}

TEST_CASE("cuda elementwise ops equal the cpu ones bit for bit", "[gpu][elementwise]") {
  const std::int64_t n = 100001;
  for (DType type : {DType::f32, DType::f16, DType::bf16}) {
    const auto a = test::random_matrix(n, type, 21), b = test::random_matrix(n, type, 22);
    Tensor ca = from_bytes(a.bytes, {n}, type, Device::cpu()),
           cb = from_bytes(b.bytes, {n}, type, Device::cpu());
    Tensor ga = ca.to(kGpu), gb = cb.to(kGpu);
    Tensor cout = Tensor::empty({n}, type), gout = Tensor::empty({n}, type, kGpu);
    ops::add(ca, cb, cout);
    ops::add(ga, gb, gout);
    require_same_values(bytes_of(gout), bytes_of(cout), type);
    ops::mul(ca, cb, cout);
    ops::mul(ga, gb, gout);
    require_same_values(bytes_of(gout), bytes_of(cout), type);
    ops::axpy(-0.3f, ca, cb);
    ops::axpy(-0.3f, ga, gb);
    require_same_values(bytes_of(gb), bytes_of(cb), type);
    ops::scale(ca, 1.7f);
    ops::scale(ga, 1.7f);
    require_same_values(bytes_of(ga), bytes_of(ca), type);
  }
}

TEST_CASE("cuda casts and fills equal the cpu ones for every dtype pair", "[gpu][elementwise]") {
  const DType all[] = {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8};
  std::vector<float> values;
  for (float v : {0.0f, -0.0f, 1.5f, -1.5f, 255.5f, 300.0f, -300.0f, 65520.0f, 1e10f, -1e10f, 3e38f,
                  INFINITY, -INFINITY, NAN, 1e-8f, 0.1f})
    values.push_back(v);
  Tensor source =
      Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}, DType::f32);
  for (DType from : all) {
    Tensor src_cpu = source.cast(from);
    Tensor src_gpu = src_cpu.to(kGpu);
    for (DType to : all) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      require_same_values(bytes_of(src_gpu.cast(to)), bytes_of(src_cpu.cast(to)), to);
    }
    Tensor filled_cpu = Tensor::empty({7}, from), filled_gpu = Tensor::empty({7}, from, kGpu);
    filled_cpu.fill_(-2.75);
    filled_gpu.fill_(-2.75);
    require_same_values(bytes_of(filled_gpu), bytes_of(filled_cpu), from);
  }
}

TEST_CASE("cuda reductions agree with the cpu ones", "[gpu][reduce]") {
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{3000017}}) {
    for (DType type : {DType::f32, DType::f16, DType::bf16}) {
      const auto x = test::random_matrix(n, type, 31);
      Tensor cx = from_bytes(x.bytes, {n}, type, Device::cpu());
      Tensor gx = cx.to(kGpu);
      // Both accumulate in f64 (in different orders, differing by < n 2^-53
      // relative), then round to f32: they may differ by one f32 rounding.
      const float cs = ops::sum(cx).to_vector<float>()[0], gs = ops::sum(gx).to_vector<float>()[0];
      CHECK(std::fabs(cs - gs) <= std::ldexp(std::fabs(cs), -23) + 1e-30);
      const float cq = ops::sum_squares(cx).to_vector<float>()[0];
      const float gq = ops::sum_squares(gx).to_vector<float>()[0];
      CHECK(std::fabs(cq - gq) <= std::ldexp(std::fabs(cq), -23));
      // Deterministic: the same input gives the same bits every time.
      CHECK(ops::sum(gx).to_vector<float>()[0] == gs);
    }
  }
  std::vector<float> data(5000, 1.0f);
  data[4321] = NAN;
  Tensor g = Tensor::from_vector(data, {5000}, DType::f32, kGpu);
  Tensor flag = Tensor::zeros({1}, DType::i32, kGpu);
  ops::flag_nonfinite(g.view(0, {4000}), flag);
  CHECK(flag.to_vector<std::int32_t>()[0] == 0);
  ops::flag_nonfinite(g, flag);
  CHECK(flag.to_vector<std::int32_t>()[0] == 1);
}

TEST_CASE("cuda philox gives the cpu's bits for words, uniforms and masks", "[gpu][philox]") {
  for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{1} << 33}) {
    const std::int64_t n = 100003;
    Generator cpu_gen(77), gpu_gen(77);
    cpu_gen.set_state({77, offset});
    gpu_gen.set_state({77, offset});
    Tensor cw = Tensor::empty({n}, DType::i32), gw = Tensor::empty({n}, DType::i32, kGpu);
    cpu_gen.words(cw);
    gpu_gen.words(gw);
    CHECK(bytes_of(gw) == bytes_of(cw));
    Tensor cu = Tensor::empty({n}, DType::f32), gu = Tensor::empty({n}, DType::f32, kGpu);
    cpu_gen.uniform(cu);
    gpu_gen.uniform(gu);
    CHECK(bytes_of(gu) == bytes_of(cu));
    Tensor cm = Tensor::empty({n}, DType::u8), gm = Tensor::empty({n}, DType::u8, kGpu);
    cpu_gen.bernoulli_mask(cm, 0.7f);
    gpu_gen.bernoulli_mask(gm, 0.7f);
    CHECK(bytes_of(gm) == bytes_of(cm));
    // Normals: libm and CUDA's logf/cosf/sinf differ by a few ulps; |z| < 6
    // here, so 1e-5 absolute is tens of ulps of headroom.
    Tensor cn = Tensor::empty({n}, DType::f32), gn = Tensor::empty({n}, DType::f32, kGpu);
    cpu_gen.normal(cn);
    gpu_gen.normal(gn);
    const auto cv = cn.to_vector<float>(), gv = gn.to_vector<float>();
    for (std::int64_t i = 0; i < n; ++i) REQUIRE(std::fabs(cv[i] - gv[i]) <= 1e-5f);
    CHECK(cpu_gen.state().offset == gpu_gen.state().offset);
  }
}

// inf, -inf and NaN in dy and x, at units that are active (x > 0) and not.
TEST_CASE("cuda relu backward and dropout select like the cpu, inf and NaN too",
          "[gpu][activation][dropout]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const std::vector<float> x = {1.0f, -1.0f, 0.0f, -0.0f, nan, inf, -inf, 2.0f, -2.0f, 0.5f};
  const std::vector<float> dy = {inf, inf, -inf, nan, inf, nan, nan, -inf, nan, 3.0f};
  const std::vector<std::uint8_t> mask = {1, 0, 1, 0, 1, 0, 0, 1, 0, 1};
  const auto n = static_cast<std::int64_t>(x.size());
  const Tensor mask_cpu = Tensor::from_vector(mask, {n}, DType::u8), mask_gpu = mask_cpu.to(kGpu);
  for (DType type : {DType::f32, DType::f16, DType::bf16}) {
    INFO(dtype_name(type));
    const Tensor x_cpu = Tensor::from_vector(x, {n}, DType::f32).cast(type);
    const Tensor dy_cpu = Tensor::from_vector(dy, {n}, DType::f32).cast(type);
    const Tensor x_gpu = x_cpu.to(kGpu), dy_gpu = dy_cpu.to(kGpu);
    Tensor dx_cpu = Tensor::empty({n}, type), dx_gpu = Tensor::empty({n}, type, kGpu);
    kernels::cpu::activation_backward(kernels::Activation::relu, dy_cpu.data(), x_cpu.data(),
                                      dx_cpu.data(), type, n);
    kernels::cuda::activation_backward(kernels::Activation::relu, dy_gpu.data(), x_gpu.data(),
                                       dx_gpu.data(), type, n, nullptr);
    require_same_values(bytes_of(dx_gpu), bytes_of(dx_cpu), type);
    // PyTorch's threshold_backward: only x > 0 passes dy, whatever dy holds.
    const auto dx = dx_gpu.cast(DType::f32).to_vector<float>();
    for (std::int64_t i = 0; i < n; ++i)
      if (!(x[i] > 0.0f)) CHECK(dx[i] == 0.0f);
    kernels::cpu::apply_mask(dy_cpu.data(), mask_cpu.data_as<std::uint8_t>(), dx_cpu.data(), type,
                             n, 1.25f);
    kernels::cuda::apply_mask(dy_gpu.data(), mask_gpu.data_as<std::uint8_t>(), dx_gpu.data(), type,
                              n, 1.25f, nullptr);
    require_same_values(bytes_of(dx_gpu), bytes_of(dx_cpu), type);
  }
}

// A device segment table naming a group the step was not given (Note [device
// segment table]): the kernels leave those segments as they were instead of
// reading past the group table, and step the others as the cpu does. nvcc
// contracts p - lr * d into one FMA where the cpu rounds twice: 1e-6 relative
// holds a rounding or two on values of order 1.
TEST_CASE("cuda optimizer steps leave a segment with an unknown group untouched", "[gpu][optim]") {
  const std::vector<kernels::OptimizerSegment> segments = {
      {0, 5, 0, 0}, {5, 5, 3, 5}, {10, 5, -1, 10}};
  std::vector<float> values(15), grads(15);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = 0.1f * static_cast<float>(i);
    grads[i] = 1.0f - 0.05f * static_cast<float>(i);
  }
  const auto table_bytes = static_cast<std::int64_t>(segments.size() * sizeof segments[0]);
  const Tensor table = Tensor::from_host(segments.data(), {table_bytes}, DType::u8, kGpu);
  const auto* device_segments = static_cast<const kernels::OptimizerSegment*>(table.data());
  const Tensor g = Tensor::from_vector(grads, {15}, DType::f32).to(kGpu);
  auto check_step = [&](const Tensor& stepped, const std::vector<float>& reference) {
    const auto got = stepped.to_vector<float>();
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      if (i < 5)
        CHECK(std::fabs(got[i] - reference[i]) <= 1e-6 * (1 + std::fabs(reference[i])));
      else
        CHECK(got[i] == values[i]);
    }
  };
  // The cpu steps the first segment alone: it rejects the whole table.
  const kernels::SgdGroup sgd{0.5f, 0.0f, 0.0f, 1.0f, false, true};
  std::vector<float> expected = values;
  kernels::cpu::sgd_step(segments.data(), 1, &sgd, 1, expected.data(), grads.data(), nullptr);
  std::vector<float> untouched = values;
  CHECK_THROWS_AS(
      kernels::cpu::sgd_step(segments.data(), 3, &sgd, 1, untouched.data(), grads.data(), nullptr),
      InvalidArgument);
  CHECK(untouched == values);
  Tensor p = Tensor::from_vector(values, {15}, DType::f32).to(kGpu);
  kernels::cuda::sgd_step(device_segments, 3, &sgd, 1, p.data_as<float>(), g.data_as<float>(),
                          nullptr, nullptr);
  check_step(p, expected);
  const kernels::AdamwGroup adamw{1.0f, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, 0.01f, 0.0316f};
  expected = values;
  std::vector<float> m(15, 0.0f), v(15, 0.0f);
  kernels::cpu::adamw_step(segments.data(), 1, &adamw, 1, expected.data(), grads.data(), m.data(),
                           v.data());
  p = Tensor::from_vector(values, {15}, DType::f32).to(kGpu);
  Tensor gm = Tensor::zeros({15}, DType::f32, kGpu), gv = Tensor::zeros({15}, DType::f32, kGpu);
  kernels::cuda::adamw_step(device_segments, 3, &adamw, 1, p.data_as<float>(), g.data_as<float>(),
                            gm.data_as<float>(), gv.data_as<float>(), nullptr);
  check_step(p, expected);
  const auto moments = gm.to_vector<float>();
  for (std::size_t i = 5; i < moments.size(); ++i) CHECK(moments[i] == 0.0f);
}

// ZeRO-1's packed state (Note [sharded state]): a segment's state sits at its
// state_offset, not at its offset. The reference is the cpu step over the
// same runs with state in the flat layout (state_offset == offset); the
// packed state must hold the same values at the packed places. 1e-6 relative
// as above (FMA contraction).
TEST_CASE("cuda optimizer steps keep state at each segment's state_offset", "[gpu][optim]") {
  const std::vector<kernels::OptimizerSegment> packed = {{0, 5, 0, 3}, {8, 3, 0, 0}};
  const std::vector<kernels::OptimizerSegment> flat = {{0, 5, 0, 0}, {8, 3, 0, 8}};
  const std::vector<std::pair<std::size_t, std::size_t>> packed_of = {{0, 3},
                                                                      {8, 0}};  // flat, packed
  std::vector<float> values(12), grads(12);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = 0.1f * static_cast<float>(i) - 0.3f;
    grads[i] = 1.0f - 0.15f * static_cast<float>(i);
  }
  const auto table_bytes = static_cast<std::int64_t>(packed.size() * sizeof packed[0]);
  const Tensor table = Tensor::from_host(packed.data(), {table_bytes}, DType::u8, kGpu);
  const auto* device_segments = static_cast<const kernels::OptimizerSegment*>(table.data());
  const Tensor g = Tensor::from_vector(grads, {12}, DType::f32).to(kGpu);
  auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("element " << i);
      CHECK(std::fabs(got[i] - want[i]) <= 1e-6 * (1 + std::fabs(want[i])));
    }
  };
  // The packed state, moved to the flat places of the reference's state.
  auto unpack = [&](const Tensor& state) {
    const auto s = state.to_vector<float>();
    std::vector<float> out(12, 0.0f);
    for (std::size_t k = 0; k < flat.size(); ++k)
      for (std::int64_t i = 0; i < flat[k].length; ++i)
        out[packed_of[k].first + static_cast<std::size_t>(i)] =
            s[packed_of[k].second + static_cast<std::size_t>(i)];
    return out;
  };
  std::vector<float> expected = values, momentum(12, 0.0f);
  Tensor p = Tensor::from_vector(values, {12}, DType::f32).to(kGpu);
  Tensor buf = Tensor::zeros({8}, DType::f32, kGpu);
  for (bool first : {true, false}) {
    const kernels::SgdGroup sgd{0.5f, 0.01f, 0.9f, 1.0f, false, first};
    kernels::cpu::sgd_step(flat.data(), 2, &sgd, 1, expected.data(), grads.data(), momentum.data());
    kernels::cuda::sgd_step(device_segments, 2, &sgd, 1, p.data_as<float>(), g.data_as<float>(),
                            buf.data_as<float>(), nullptr);
  }
  close(p.to_vector<float>(), expected);
  close(unpack(buf), momentum);
  const kernels::AdamwGroup adamw{0.99f, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, 0.01f, 0.0316f};
  expected = values;
  std::vector<float> m(12, 0.0f), v(12, 0.0f);
  kernels::cpu::adamw_step(flat.data(), 2, &adamw, 1, expected.data(), grads.data(), m.data(),
                           v.data());
  p = Tensor::from_vector(values, {12}, DType::f32).to(kGpu);
  Tensor gm = Tensor::zeros({8}, DType::f32, kGpu), gv = Tensor::zeros({8}, DType::f32, kGpu);
  kernels::cuda::adamw_step(device_segments, 2, &adamw, 1, p.data_as<float>(), g.data_as<float>(),
                            gm.data_as<float>(), gv.data_as<float>(), nullptr);
  close(p.to_vector<float>(), expected);
  close(unpack(gm), m);
  close(unpack(gv), v);
}

TEST_CASE("device memory comes from the pool and is counted", "[gpu][memory]") {
  reset_peak_memory(kGpu);
  const std::size_t before = memory_stats(kGpu).current_bytes;
  {
    Stream s = Stream::create(kGpu);
    Tensor t = Tensor::zeros({1 << 20}, DType::f32, kGpu, s);
    CHECK(memory_stats(kGpu).current_bytes == before + (4u << 20));
    Event done;
    done.record(s);
    done.synchronize();
    CHECK(done.ready());
    CHECK(t.to_vector<float>(s)[12345] == 0.0f);
  }
  CHECK(memory_stats(kGpu).current_bytes == before);
  CHECK(memory_stats(kGpu).peak_bytes >= before + (4u << 20));
  auto pinned = allocate_pinned(1 << 16);
  CHECK(pinned->pinned());
}
