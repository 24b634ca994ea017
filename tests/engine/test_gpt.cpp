// The GPT model on the CPU: nanoGPT's parameter names and shapes, GPT-2's
// initialisation, the tied head (stored once, gradient of both users checked
// against finite differences) and the language-model loss over B x T.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "engine/models.h"
#include "engine/nn/gpt.h"
#include "engine/nn/loss.h"
#include "engine/parameter_store.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

core::Tensor tokens(std::int64_t batch, std::int64_t seq, std::int64_t vocab, std::uint32_t seed) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(batch * seq));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int32_t>((i * 7 + seed) % vocab);
  return core::Tensor::from_vector(t, {batch, seq}, DType::i32);
}

}  // namespace

TEST_CASE("gpt-tiny has nanoGPT's parameter names and shapes, the head stored once",
          "[engine][gpt]") {
  auto model = make_model("gpt-tiny");
  std::map<std::string, core::Shape> shapes;
  for (Parameter* p : model->parameters()) {
    INFO(p->name);
    REQUIRE(shapes.emplace(p->name, p->value.shape()).second);
  }
  const std::int64_t c = 128, l = 4;
  REQUIRE(shapes.size() == 4 + 12 * l);  // wte, wpe, ln_f (2); 12 per block
  CHECK(shapes.at("transformer.wte.weight") == core::Shape{256, c});
  CHECK(shapes.at("transformer.wpe.weight") == core::Shape{128, c});
  CHECK(shapes.at("transformer.h.3.ln_1.weight") == core::Shape{c});
  CHECK(shapes.at("transformer.h.0.attn.c_attn.weight") == core::Shape{3 * c, c});
  CHECK(shapes.at("transformer.h.0.attn.c_attn.bias") == core::Shape{3 * c});
  CHECK(shapes.at("transformer.h.1.attn.c_proj.weight") == core::Shape{c, c});
  CHECK(shapes.at("transformer.h.2.ln_2.bias") == core::Shape{c});
  CHECK(shapes.at("transformer.h.2.mlp.c_fc.weight") == core::Shape{4 * c, c});
  CHECK(shapes.at("transformer.h.2.mlp.c_proj.weight") == core::Shape{c, 4 * c});
  CHECK(shapes.at("transformer.ln_f.weight") == core::Shape{c});
  CHECK(shapes.count("lm_head.weight") == 0);
  // The store holds each trainable parameter once, the tied table last
  // (its ready report follows both users' backward: Note [tied weights]).
  ParameterStore store(*model, core::Device::cpu());
  REQUIRE(store.slots().size() == shapes.size());
  CHECK(store.slots().back().parameter->name == "transformer.wte.weight");
}

TEST_CASE("GPT-2 initialisation: normal(0, 0.02), scaled c_proj, zero biases, unit LN",
          "[engine][gpt]") {
  auto model = make_model("gpt-tiny");
  initialize(*model, 1);
  auto stddev = [](const Parameter& p) {
    const auto v = p.value.to_vector<float>();
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double{x} * x;
    const double mean = sum / v.size();
    return std::sqrt(sq / v.size() - mean * mean);
  };
  for (Parameter* p : model->parameters()) {
    INFO(p->name);
    const auto v = p->value.to_vector<float>();
    if (p->role == ParamRole::norm && p->name.ends_with("weight"))
      CHECK((v.front() == 1.0f && v.back() == 1.0f));
    else if (p->name.ends_with("bias"))
      CHECK((v.front() == 0.0f && v.back() == 0.0f));
    // Sample standard deviations over >= 16k values: within 5% of the target.
    else if (p->name.ends_with("c_proj.weight"))
      CHECK(stddev(*p) == Approx(0.02 / std::sqrt(8.0)).epsilon(0.05));
    else
      CHECK(stddev(*p) == Approx(0.02).epsilon(0.05));
  }
}

TEST_CASE("GPT gradients, the tied table's included, match finite differences", "[engine][gpt]") {
  // Small sizes, and weights of O(0.5) instead of GPT-2's 0.02 so that every
  // gradient is well above gradcheck's absolute tolerance.
  GPT model({.layers = 2, .heads = 2, .embed_dim = 8, .block_size = 6, .vocab = 11});
  std::uint32_t seed = 1;
  for (Parameter* p : model.parameters())
    p->value = test::random_f32(p->value.shape(), ++seed, 0.5f);
  test::check_gradients(model, tokens(2, 5, 11, 3));
}

TEST_CASE("the language-model loss is the mean cross-entropy over every position",
          "[engine][gpt]") {
  GPT model({.layers = 1, .heads = 2, .embed_dim = 8, .block_size = 4, .vocab = 7});
  initialize(model, 3);
  Context ctx;
  const core::Tensor logits = model.forward(tokens(3, 4, 7, 1), ctx);
  REQUIRE(logits.shape() == core::Shape{3, 4, 7});
  const core::Tensor targets = tokens(3, 4, 7, 2);
  CrossEntropyLoss loss;
  const double got = loss.forward(logits, targets, ctx).to_vector<float>()[0];
  const auto z = logits.to_vector<float>();
  const auto y = targets.to_vector<std::int32_t>();
  double expected = 0;  // float64: -log softmax(z)[y], averaged over 12 positions
  for (int r = 0; r < 12; ++r) {
    double sum = 0;
    for (int j = 0; j < 7; ++j) sum += std::exp(double{z[r * 7 + j]});
    expected += std::log(sum) - z[r * 7 + y[r]];
  }
  CHECK(got == Approx(expected / 12).epsilon(1e-6));
  CHECK_THROWS_WITH(model.forward(tokens(1, 5, 7, 1), ctx), Catch::Contains("block_size 4"));
  CHECK_THROWS_WITH(make_model("mlp", ModelOptions{.dropout = 0.1f}),
                    Catch::Contains("no dropout"));
}

TEST_CASE("gpt-tiny under f16 and bf16 autocast with a loss scale matches f32 gradients",
          "[engine][gpt][autocast]") {
  // GEMMs in the low type (f32 accumulation), softmax, LayerNorm and the loss
  // in f32; the loss gradient is scaled by 2^12 (f16 gradients of gpt-tiny's
  // small logits would underflow without it) and the f32 gradients unscaled.
  // Each low-type rounding is 2^-11 (f16) or 2^-8 (bf16) relative, a few
  // dozen of them chained through 4 blocks: the whole gradient vector agrees
  // with f32 to 1% (f16) and 5% (bf16) of its norm; a missing unscale or a
  // wrong cast is off by orders of magnitude.
  auto model = make_model("gpt-tiny");
  initialize(*model, 4);
  ParameterStore store(*model, core::Device::cpu());
  const core::Tensor x = tokens(2, 32, 256, 1), y = tokens(2, 32, 256, 5);
  auto gradients = [&](std::optional<DType> autocast, float scale) {
    store.zero_grad();
    Context ctx;
    ctx.autocast = autocast;
    CrossEntropyLoss loss;
    loss.forward(model->forward(x, ctx), y, ctx);
    model->backward(loss.backward(scale, ctx), ctx);
    auto g = store.grads().to_vector<float>();
    for (float& v : g) v /= scale;
    return g;
  };
  const auto reference = gradients(std::nullopt, 1.0f);
  double norm = 0;
  for (float v : reference) norm += double{v} * v;
  for (auto [type, tol] : {std::pair{DType::f16, 0.01}, std::pair{DType::bf16, 0.05}}) {
    INFO(dtype_name(type));
    const auto g = gradients(type, 4096.0f);
    double diff = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      REQUIRE(std::isfinite(g[i]));
      diff += (double{g[i]} - reference[i]) * (double{g[i]} - reference[i]);
    }
    CHECK(std::sqrt(diff / norm) < tol);
  }
}
