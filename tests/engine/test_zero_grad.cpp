// Lazy gradient zeroing (Note [lazy zero_grad] in engine/nn/module.h): after
// ParameterStore::zero_grad the first writer of each gradient overwrites it
// (a GEMM with beta 0, conv2d_backward_filter without accumulate) instead of a
// separate zero fill. Checked against the eager path (fill the flat gradient
// buffer with zeros, then accumulate) bit for bit, on stale garbage, over two
// micro-batches, in f32 and under bf16 autocast.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "engine/nn/activation.h"
#include "engine/nn/batchnorm.h"
#include "engine/nn/containers.h"
#include "engine/nn/conv.h"
#include "engine/nn/gpt.h"
#include "engine/nn/linear.h"
#include "engine/nn/loss.h"
#include "engine/nn/norm.h"
#include "engine/nn/pooling.h"
#include "engine/parameter_store.h"
#include "kernels/conv.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;
using lockstep::test::random_f32;

namespace {

// Every layer kind that writes a parameter gradient: Conv2d (weight GEMM and
// bias), BatchNorm2d, Linear (weight GEMM and bias), LayerNorm.
std::unique_ptr<Sequential> conv_net() {
  auto net = std::make_unique<Sequential>();
  net->emplace<Conv2d>("conv", 2, 4, 3, 1, 1);
  net->emplace<BatchNorm2d>("bn", 4);
  net->emplace<ReLU>("relu");
  net->emplace<MaxPool2d>("pool", 2);
  net->emplace<Flatten>("flatten");
  net->emplace<Linear>("fc1", 4 * 3 * 3, 8);
  net->emplace<LayerNorm>("ln", 8);
  net->emplace<Linear>("fc2", 8, 5);
  return net;
}

// The flat gradients after the micro-batches, starting either from an eager
// zero fill or from zero_grad over stale garbage.
std::vector<float> micro_batches(Module& model, ParameterStore& store, bool lazy,
                                 const std::vector<core::Tensor>& inputs,
                                 const std::vector<core::Tensor>& targets,
                                 std::optional<DType> autocast) {
  if (lazy) {
    // Stale values the first writers must not add to: NaN, as a skipped step
    // (an overflowed gradient) leaves behind.
    store.grads().fill_(std::numeric_limits<double>::quiet_NaN());
    store.zero_grad();
  } else {
    store.grads().fill_(0.0);
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    Context ctx;
    ctx.autocast = autocast;
    CrossEntropyLoss loss;
    loss.forward(model.forward(inputs[i], ctx), targets[i], ctx);
    model.backward(loss.backward(1.0f, ctx), ctx);
  }
  return store.grads().to_vector<float>();
}

void require_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

core::Tensor labels(std::vector<std::int64_t> v, const core::Shape& shape) {
  return core::Tensor::from_vector(v, shape, DType::i64);
}

}  // namespace

TEST_CASE("zero_grad then backward gives the bits of a zero fill then backward",
          "[engine][store]") {
  auto net = conv_net();
  initialize(*net, 3);
  ParameterStore store(*net, core::Device::cpu());
  const std::vector<core::Tensor> x{random_f32({3, 2, 6, 6}, 1), random_f32({3, 2, 6, 6}, 2)};
  const std::vector<core::Tensor> y{labels({0, 4, 2}, {3}), labels({1, 3, 3}, {3})};
  for (std::optional<DType> autocast : {std::optional<DType>{}, std::optional{DType::bf16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    const auto eager = micro_batches(*net, store, false, x, y, autocast);
    const auto lazy = micro_batches(*net, store, true, x, y, autocast);
    require_same_bits(lazy, eager);
    // Both are the sum of the micro-batches' gradients, each taken alone
    // (independent of how the second adds to the first). The sums differ
    // from it only in f32 rounding order: 1e-5 of the largest gradient.
    const auto first = micro_batches(*net, store, true, {x[0]}, {y[0]}, autocast);
    const auto second = micro_batches(*net, store, true, {x[1]}, {y[1]}, autocast);
    float largest = 0;
    for (float g : eager) largest = std::max(largest, std::abs(g));
    REQUIRE(largest > 0);
    for (std::size_t i = 0; i < eager.size(); ++i)
      CHECK(std::abs(eager[i] - (first[i] + second[i])) <= 1e-5f * largest);
  }
}

TEST_CASE("zero_grad then backward through tied weights gives the bits of a zero fill",
          "[engine][store][gpt]") {
  // The tied head writes the embedding's gradient first (a GEMM that
  // overwrites), then the embedding adds its scatter to it.
  GPT model({.layers = 2, .heads = 2, .embed_dim = 16, .block_size = 8, .vocab = 11});
  initialize(model, 5);
  ParameterStore store(model, core::Device::cpu());
  std::vector<std::int32_t> t(2 * 8);
  std::vector<std::int64_t> u(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = (i * 7) % 11, u[i] = (i * 5 + 3) % 11;
  const core::Tensor tokens = core::Tensor::from_vector(t, {2, 8}, DType::i32);
  const core::Tensor targets = labels(u, {2, 8});
  const auto eager =
      micro_batches(model, store, false, {tokens, tokens}, {targets, targets}, std::nullopt);
  const auto lazy =
      micro_batches(model, store, true, {tokens, tokens}, {targets, targets}, std::nullopt);
  require_same_bits(lazy, eager);
}

TEST_CASE("a gradient no backward wrote reads as zero after zero_grad", "[engine][store]") {
  auto net = conv_net();
  ParameterStore store(*net, core::Device::cpu());
  store.grads().fill_(7.0);
  store.zero_grad();
  int lazy = 0;  // Linear's and Conv2d's weights: marked, not filled
  for (const auto& slot : store.slots()) {
    CHECK(slot.parameter->grad_stale == slot.parameter->lazy_zero_grad);
    lazy += slot.parameter->grad_stale ? 1 : 0;
  }
  CHECK(lazy == 3);
  const auto g = store.grads().to_vector<float>();
  CHECK(g == std::vector<float>(g.size(), 0.0f));
  for (const auto& slot : store.slots()) CHECK_FALSE(slot.parameter->grad_stale);
}

TEST_CASE("conv2d_backward_filter without accumulate writes the bits of zero then accumulate",
          "[engine][conv]") {
  // The kernel contract behind Note [lazy zero_grad]: accumulate = false
  // ignores what dw held; f32 (the GEMM's beta 0) and bf16 (the rounded sum).
  const kernels::Conv2dShape s{.batch = 3,
                               .in_channels = 2,
                               .in_h = 7,
                               .in_w = 6,
                               .out_channels = 4,
                               .kernel_h = 3,
                               .kernel_w = 2,
                               .stride_h = 2,
                               .stride_w = 1,
                               .pad_h = 1,
                               .pad_w = 1};
  for (DType type : {DType::f32, DType::bf16}) {
    INFO(dtype_name(type));
    const core::Tensor x = random_f32({s.batch, s.in_channels, s.in_h, s.in_w}, 1).cast(type);
    const core::Tensor dy =
        random_f32({s.batch, s.out_channels, s.out_h(), s.out_w()}, 2).cast(type);
    const std::size_t n = static_cast<std::size_t>(s.out_channels * s.in_channels * 3 * 2);
    std::vector<float> zeroed(n, 0.0f), stale(n, std::numeric_limits<float>::quiet_NaN());
    kernels::cpu::conv2d_backward_filter(s, type, x.data(), dy.data(), zeroed.data(), true);
    kernels::cpu::conv2d_backward_filter(s, type, x.data(), dy.data(), stale.data(), false);
    require_same_bits(stale, zeroed);
    CHECK(zeroed != std::vector<float>(n, 0.0f));
    // A second micro-batch accumulates onto either alike.
    kernels::cpu::conv2d_backward_filter(s, type, x.data(), dy.data(), zeroed.data(), true);
    kernels::cpu::conv2d_backward_filter(s, type, x.data(), dy.data(), stale.data(), true);
    require_same_bits(stale, zeroed);
  }
}
