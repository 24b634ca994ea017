// A Linear with a fused GELU(tanh) (Note [fused activation] in
// engine/nn/linear.h) on the CPU: the bits of Linear then GELU(approximate=
// 'tanh') forward and backward, in f32 and under bf16 and f16 autocast, over
// two micro-batches (the gradients accumulate), alone and with the next layer
// taking its gradient (c_fc and c_proj); finite-difference gradients; and
// what it refuses. (GPT-2's names with it: tests/engine/test_gpt.cpp.)
#include <catch2/catch.hpp>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using lockstep::test::check_gradients;
using lockstep::test::random_f32;

namespace {

bool same_bits(const core::Tensor& a, const core::Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  std::vector<std::uint8_t> x(a.nbytes()), y(b.nbytes());
  a.copy_to_host(x.data());
  b.copy_to_host(y.data());
  return x == y;
}

}  // namespace

TEST_CASE("a Linear with fused GELU(tanh) gives Linear then GELU's bits on the CPU",
          "[engine][linear]") {
  for (std::optional<DType> autocast : {std::optional<DType>{}, std::optional<DType>{DType::bf16},
                                        std::optional<DType>{DType::f16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    Sequential unfused;
    unfused.emplace<Linear>("c_fc", 37, 24);
    unfused.emplace<GELU>("gelu", true);
    Linear fused(37, 24, true, kernels::Activation::gelu_tanh);
    initialize(unfused, 11);
    auto& reference = static_cast<Linear&>(*unfused.children().front());
    fused.weight().value.copy_from(reference.weight().value);
    fused.bias()->value.copy_from(reference.bias()->value);
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      const core::Tensor x = random_f32({7, 37}, 20 + micro_batch);
      const core::Tensor dy = random_f32({7, 24}, 30 + micro_batch);
      Context ctx;
      ctx.autocast = autocast;
      const core::Tensor y_ref = unfused.forward(x, ctx), y = fused.forward(x, ctx);
      REQUIRE(same_bits(y, y_ref));
      const core::Tensor dx_ref = unfused.backward(dy, ctx), dx = fused.backward(dy, ctx);
      REQUIRE(same_bits(dx, dx_ref));
      REQUIRE(same_bits(fused.weight().grad, reference.weight().grad));
      REQUIRE(same_bits(fused.bias()->grad, reference.bias()->grad));
    }
  }
}

TEST_CASE("c_fc with fused GELU and c_proj taking its gradient give the unfused MLP's bits",
          "[engine][linear]") {
  // Note [gelu gradient from the next layer]: c_proj's dX GEMM applies GELU's
  // derivative and sums c_fc's bias gradient; the values must be the unfused
  // layers' (Linear, GELU(tanh), Linear) bit for bit, gradients accumulating
  // over two micro-batches.
  for (std::optional<DType> autocast : {std::optional<DType>{}, std::optional<DType>{DType::bf16},
                                        std::optional<DType>{DType::f16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    Sequential unfused;
    unfused.emplace<Linear>("c_fc", 19, 24);
    unfused.emplace<GELU>("gelu", true);
    unfused.emplace<Linear>("c_proj", 24, 19);
    Sequential fused;
    auto& c_fc = fused.emplace<Linear>("c_fc", 19, 24, true, kernels::Activation::gelu_tanh);
    fused.emplace<Linear>("c_proj", 24, 19).take_gelu_gradient_from(c_fc);
    initialize(unfused, 12);
    const auto from = unfused.parameters(), to = fused.parameters();
    REQUIRE(from.size() == to.size());
    for (std::size_t i = 0; i < from.size(); ++i) to[i]->value.copy_from(from[i]->value);
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      const core::Tensor x = random_f32({7, 19}, 40 + micro_batch);
      const core::Tensor dy = random_f32({7, 19}, 50 + micro_batch);
      Context ctx;
      ctx.autocast = autocast;
      REQUIRE(same_bits(fused.forward(x, ctx), unfused.forward(x, ctx)));
      REQUIRE(same_bits(fused.backward(dy, ctx), unfused.backward(dy, ctx)));
      for (std::size_t i = 0; i < from.size(); ++i) {
        INFO(from[i]->name);
        REQUIRE(same_bits(to[i]->grad, from[i]->grad));
      }
    }
  }
  Linear plain(4, 3);
  CHECK_THROWS_WITH(Linear(3, 2).take_gelu_gradient_from(plain),
                    Catch::Contains("fused GELU") && Catch::Contains("without a fused activation"));
}

TEST_CASE("a Linear with fused GELU(tanh) has finite-difference gradients", "[engine][linear]") {
  for (auto [batch, in, out] : {std::tuple{1, 1, 1}, {3, 7, 5}, {13, 33, 17}}) {
    Linear fc(in, out, true, kernels::Activation::gelu_tanh);
    initialize(fc, 7);
    check_gradients(fc, random_f32({batch, in}, 3));
  }
}

TEST_CASE("a fused activation other than GELU(tanh) after a bias is refused, naming the fix",
          "[engine][linear]") {
  CHECK_THROWS_WITH(Linear(4, 3, true, kernels::Activation::relu),
                    Catch::Contains("GELU(tanh)") && Catch::Contains("its own layer"));
  CHECK_THROWS_WITH(Linear(4, 3, false, kernels::Activation::gelu_tanh),
                    Catch::Contains("after a bias"));
  CHECK(Linear(4, 3, true, kernels::Activation::gelu_tanh).activation() ==
        kernels::Activation::gelu_tanh);
  CHECK_FALSE(Linear(4, 3).activation().has_value());
}
