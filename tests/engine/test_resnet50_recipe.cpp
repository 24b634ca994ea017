// The optimizer side of NVIDIA's ResNet-50 v1.5 recipe (docs/recipes.md) on
// the resnet50 preset at a sixteenth of its widths: decay_groups() leaves
// exactly the BatchNorm weights and biases and every bias (fc.bias) out of
// weight decay, as the recipe's "no weight decay on BN and bias" does, and
// SGD with its momentum 0.875 and weight decay 3.0517578125e-05 over those
// two groups follows torch.optim.SGD's formula, computed here in float64.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "engine/models.h"
#include "engine/optim/sgd.h"
#include "support/optim_fixture.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr std::int64_t kWidthDivisor = 16;
constexpr double kLr = 0.256, kMomentum = 0.875, kWeightDecay = 3.0517578125e-05;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// torchvision's names say what a parameter is, independently of ParamRole:
// a BatchNorm is bn1..bn3 (the stem's "bn1" too) or a downsample's second
// module, and a bias ends in ".bias".
bool is_batch_norm_or_bias(const std::string& name) {
  return ends_with(name, ".bias") || name.rfind("bn", 0) == 0 ||
         name.find(".bn") != std::string::npos || name.find("downsample.1.") != std::string::npos;
}

void write_grad(Parameter& p, const std::vector<float>& values) {
  test::write(p.grad, values);
  p.grad_stale = false;  // Note [lazy zero_grad]: these values are the gradient
}

}  // namespace

TEST_CASE("decay_groups leaves exactly resnet50's BatchNorm parameters and biases undecayed",
          "[engine][optim][resnet50]") {
  auto model = make_model("resnet50", ModelOptions{.width_divisor = kWidthDivisor});
  initialize(*model, 1);
  ParameterStore store(*model, core::Device::cpu());
  const std::vector<ParamGroup> groups = decay_groups(store, kLr, kWeightDecay);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].weight_decay == kWeightDecay);
  CHECK(groups[1].weight_decay == 0.0);
  std::size_t batch_norms = 0, biases = 0;
  for (std::size_t g = 0; g < 2; ++g)
    for (const Parameter* p : groups[g].params) {
      INFO(p->name << " in group " << g);
      // By name (torchvision's), and by shape: every 1-D parameter of
      // ResNet-50 is a BatchNorm's or a bias, every other a conv or fc weight.
      CHECK(is_batch_norm_or_bias(p->name) == (g == 1));
      CHECK((p->value.shape().size() == 1) == (g == 1));
      if (g == 1 && p->name == "fc.bias") ++biases;
      if (g == 1 && ends_with(p->name, ".weight")) ++batch_norms;
    }
  // 53 BatchNorms (the stem's, 3 per each of 16 blocks, 4 downsamples), a
  // weight and a bias each; fc.bias is the only other bias.
  CHECK(batch_norms == 53);
  CHECK(biases == 1);
  CHECK(groups[1].params.size() == 2 * batch_norms + biases);
  CHECK(groups[0].params.size() + groups[1].params.size() == store.slots().size());
  CHECK(groups[0].params.size() == 53 + 1);  // 53 convolutions and fc
}

TEST_CASE("SGD over resnet50's two groups follows torch.optim.SGD's formula in float64",
          "[engine][optim][resnet50]") {
  auto model = make_model(
      "resnet50",
      ModelOptions{.width_divisor = kWidthDivisor, .zero_init_residual = true, .classes = 10});
  initialize(*model, 2);
  ParameterStore store(*model, core::Device::cpu());
  test::randomize_values(store, 3);  // zero-init BatchNorm weights would hide their decay
  const std::vector<ParamGroup> groups = decay_groups(store, kLr, kWeightDecay);
  std::vector<bool> decayed(store.slots().size());
  for (const Parameter* p : groups[0].params) decayed[store.index_of(*p)] = true;
  SGD sgd(store, groups, SgdOptions{.momentum = kMomentum});

  // The reference, per element: torch.optim.SGD (dampening 0, no Nesterov)
  // with weight_decay 3.0517578125e-05 in group 0 and 0 in group 1.
  std::vector<std::vector<double>> p, buf(store.slots().size());
  for (const auto& s : store.slots()) {
    const std::vector<float> v = test::read(s.parameter->value);
    p.emplace_back(v.begin(), v.end());
  }
  // Step 1 with zero gradients: a decayed parameter shrinks by lr x wd
  // (7.8e-6 of itself, over 100 f32 roundings: visible), an undecayed one
  // stays bit for bit. Step 2 with gradients: momentum and decay together.
  for (int step = 1; step <= 2; ++step) {
    const auto grads = test::step_grads(store, step);
    for (std::size_t i = 0; i < store.slots().size(); ++i) {
      std::vector<float> g = grads[i];
      if (step == 1) std::fill(g.begin(), g.end(), 0.0f);
      write_grad(*store.slots()[i].parameter, g);
      const double wd = decayed[i] ? kWeightDecay : 0.0;
      buf[i].resize(g.size());
      for (std::size_t e = 0; e < g.size(); ++e) {
        const double d = g[e] + wd * p[i][e];
        buf[i][e] = step == 1 ? d : kMomentum * buf[i][e] + d;
        p[i][e] -= kLr * buf[i][e];
      }
    }
    const std::vector<std::vector<double>> before = [&] {
      std::vector<std::vector<double>> out;
      for (const auto& s : store.slots()) {
        const std::vector<float> v = test::read(s.parameter->value);
        out.emplace_back(v.begin(), v.end());
      }
      return out;
    }();
    sgd.step();
    for (std::size_t i = 0; i < store.slots().size(); ++i) {
      const Parameter& param = *store.slots()[i].parameter;
      const std::vector<float> got = test::read(param.value);
      for (std::size_t e = 0; e < got.size(); ++e) {
        INFO(param.name << " element " << e << " step " << step << ": got " << got[e]
                        << ", reference " << p[i][e]);
        if (step == 1 && !decayed[i]) {
          REQUIRE(got[e] == before[i][e]);  // no decay, no gradient: unchanged
        } else if (step == 1) {
          // The change itself, against lr x wd x p: f32 rounds p (|p| <= 1)
          // to 6e-8, the change is 7.8e-6 |p|; 1e-7 absolute is a tenth of
          // the smallest change that matters and holds a wrong group out.
          REQUIRE(std::fabs((got[e] - before[i][e]) - (p[i][e] - before[i][e])) <= 1e-7);
          if (std::fabs(before[i][e]) > 0.1) REQUIRE(got[e] != before[i][e]);
        } else {
          // As tests/engine/test_optim.cpp: about ten f32 roundings of values
          // up to ~5 stay below 1e-5 (1 + |reference|).
          REQUIRE(std::fabs(got[e] - p[i][e]) <= 1e-5 * (1 + std::fabs(p[i][e])));
        }
      }
    }
  }
}
