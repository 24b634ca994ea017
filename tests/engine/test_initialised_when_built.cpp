// Note [initialised when built] (engine/nn/module.h): layers draw PyTorch's
// default initialisation when constructed, from a process-wide generator
// that manual_seed re-seeds; GPT applies its own scheme once; and
// engine::initialize(model, seed) still reproduces a model whatever was
// built before it. References: the uniform's bound and moments (PyTorch's
// kaiming_uniform with a = sqrt(5) gives U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
// and reset_parameters run by hand on a Philox generator of the same seed.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/models.h"
#include "engine/nn/conv.h"
#include "engine/nn/embedding.h"
#include "engine/nn/gpt.h"
#include "engine/nn/linear.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

std::vector<float> values_of(Module& m) {
  std::vector<float> out;
  for (Parameter* p : m.parameters()) {
    const float* x = p->value.data_as<float>();  // a CPU parameter, contiguous
    out.insert(out.end(), x, x + p->value.numel());
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("a Linear is initialised when built, with PyTorch's default bounds", "[engine][built]") {
  Linear fc(256, 128);
  const std::vector<float> w = values_of(fc);
  const double bound = 1.0 / std::sqrt(256.0);
  double sum = 0, squares = 0;
  for (const float x : w) {
    REQUIRE(std::abs(x) <= bound);
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(w.size());
  // U(-b, b): mean 0, variance b^2/3. Over 32896 draws the sample mean's
  // standard error is b/sqrt(3n) = 2e-4 and the variance's about 0.5%:
  // the tolerances are 5 standard errors.
  CHECK(std::abs(sum / n) < 5 * bound / std::sqrt(3 * n));
  CHECK(squares / n == Approx(bound * bound / 3).epsilon(0.03));
}

TEST_CASE("manual_seed reproduces the layers built after it", "[engine][built]") {
  manual_seed(5);
  Conv2d a(3, 8, 3);
  Embedding e(10, 4);
  manual_seed(5);
  Conv2d b(3, 8, 3);
  CHECK(same_bits(values_of(a), values_of(b)));
  Conv2d c(3, 8, 3);  // the stream goes on: another draw
  CHECK_FALSE(same_bits(values_of(a), values_of(c)));
  // The same as reset_parameters on a generator of that seed, by hand.
  Conv2d d(3, 8, 3);
  core::Generator rng(5);
  d.reset_parameters(rng);
  CHECK(same_bits(values_of(a), values_of(d)));
}

TEST_CASE("GPT draws its own scheme once when built, and initialize still reproduces a model",
          "[engine][built]") {
  const GptConfig config{2, 2, 16, 8, 32, 0.0f, false};
  manual_seed(11);
  GPT built(config);
  GPT by_hand(config);
  core::Generator rng(11);
  by_hand.reset_parameters(rng);  // GPT-2's scheme alone on Philox(11): nothing drawn before it
  CHECK(same_bits(values_of(built), values_of(by_hand)));

  // initialize(model, seed) gives the same bits whatever the build drew.
  manual_seed(1);
  auto first = make_model("cnn");
  manual_seed(2);
  auto second = make_model("cnn");
  CHECK_FALSE(same_bits(values_of(*first), values_of(*second)));
  initialize(*first, 7);
  initialize(*second, 7);
  CHECK(same_bits(values_of(*first), values_of(*second)));
}
