// SGD and AdamW against an independent float64 implementation of the update
// formulas in torch.optim's documentation, over several steps, with every
// option and two interleaved parameter groups; named state and resuming from
// it; gradient clipping against a float64 norm.
//
// Tolerance for the optimizers: the library computes in f32 (rounding 2^-24,
// about 6e-8, per operation) and the reference in f64. About ten roundings per
// element and step on values of magnitude up to ~5 (parameters, momentum
// buffers), over six steps, stay below 1e-5 (1 + |reference|); every option
// in these cases changes the result by more than 1e-3, so a wrong formula fails.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "engine/optim/adamw.h"
#include "engine/optim/clip.h"
#include "engine/optim/sgd.h"
#include "kernels/optimizer.h"
#include "support/optim_fixture.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

constexpr int kSteps = 6;
constexpr double kTolerance = 1e-5;

// torch.optim.SGD's documented algorithm for one parameter, in f64.
struct ReferenceSgd {
  double lr, weight_decay, momentum, dampening;
  bool nesterov;
  std::vector<double> p, buf;
  int t = 0;

  void step(const std::vector<float>& grad) {
    ++t;
    buf.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (weight_decay != 0) g += weight_decay * p[i];
      if (momentum != 0) {
        buf[i] = t > 1 ? momentum * buf[i] + (1 - dampening) * g : g;
        g = nesterov ? g + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * g;
    }
  }
};

// torch.optim.AdamW's documented algorithm (amsgrad off) for one parameter, in f64.
struct ReferenceAdamw {
  double lr, weight_decay, beta1, beta2, eps;
  std::vector<double> p, m, v;
  int t = 0;

  void step(const std::vector<float>& grad) {
    ++t;
    m.resize(p.size());
    v.resize(p.size());
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double g = grad[i];
      p[i] -= lr * weight_decay * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(beta1, t));
      const double v_hat = v[i] / (1 - std::pow(beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

void require_close(const std::vector<float>& got, const std::vector<double>& want,
                   const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << " element " << i << ": got " << got[i] << ", reference " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= kTolerance * (1 + std::fabs(want[i])));
  }
}

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// The elements of a flat buffer that belong to no parameter are all zero.
void require_zero_padding(const core::Tensor& flat, const ParameterStore& store) {
  const auto all = test::read(flat);
  std::vector<bool> used(all.size());
  for (const auto& s : store.slots())
    for (std::int64_t i = 0; i < s.numel; ++i) used[s.offset + i] = true;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!used[i]) REQUIRE(all[i] == 0.0f);
}

// Which group each slot of `store` is in.
std::vector<std::size_t> group_of_slots(const ParameterStore& store,
                                        const std::vector<ParamGroup>& groups) {
  std::vector<std::size_t> out(store.slots().size());
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (Parameter* p : groups[g].params) out[store.index_of(*p)] = g;
  return out;
}

// name -> (state -> view)
std::map<std::string, std::map<std::string, core::Tensor>> states_by_name(const Optimizer& opt) {
  std::map<std::string, std::map<std::string, core::Tensor>> out;
  for (const auto& s : opt.state_tensors()) out[s.parameter][s.state] = s.value;
  return out;
}

struct GroupSetup {
  bool two_groups;  // decay_groups() with its own lr for group 1, else single_group()
  double lr, lr_group1, weight_decay;
};

std::vector<ParamGroup> make_groups(const ParameterStore& store, const GroupSetup& g) {
  if (!g.two_groups) return single_group(store, g.lr, g.weight_decay);
  auto groups = decay_groups(store, g.lr, g.weight_decay);
  groups[1].lr = g.lr_group1;
  return groups;
}

}  // namespace

TEST_CASE("SGD follows torch.optim.SGD's formulas with every option", "[engine][optim]") {
  struct Case {
    const char* name;
    GroupSetup groups;
    SgdOptions options;
  };
  const Case cases[] = {
      {"plain", {false, 0.1, 0.1, 0.0}, {}},
      {"weight decay", {false, 0.1, 0.1, 0.05}, {}},
      {"momentum, two groups", {true, 0.1, 0.03, 0.01}, {0.9, 0.0, false}},
      {"momentum and dampening", {true, 0.05, 0.2, 0.1}, {0.8, 0.3, false}},
      {"nesterov", {true, 0.07, 0.01, 0.2}, {0.9, 0.0, true}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    auto bag = test::make_bag();
    ParameterStore store(*bag, core::Device::cpu());
    test::randomize_values(store, 1);
    const auto groups = make_groups(store, c.groups);
    const auto group_of = group_of_slots(store, groups);
    std::vector<ReferenceSgd> reference;
    for (std::size_t i = 0; i < store.slots().size(); ++i) {
      const ParamGroup& g = groups[group_of[i]];
      reference.push_back({g.lr,
                           g.weight_decay,
                           c.options.momentum,
                           c.options.dampening,
                           c.options.nesterov,
                           as_double(test::read(store.slots()[i].parameter->value)),
                           {}});
    }
    SGD sgd(store, groups, c.options);
    for (int step = 0; step < kSteps; ++step) {
      const auto grads = test::step_grads(store, step);
      test::set_grads(store, grads);
      sgd.step();
      const auto state = states_by_name(sgd);
      for (std::size_t i = 0; i < store.slots().size(); ++i) {
        Parameter& p = *store.slots()[i].parameter;
        reference[i].step(grads[i]);
        require_close(test::read(p.value), reference[i].p, p.name);
        REQUIRE(test::read(p.grad) == grads[i]);  // the gradient is not modified
        if (c.options.momentum != 0)
          require_close(test::read(state.at(p.name).at("momentum_buffer")), reference[i].buf,
                        p.name + " momentum_buffer");
      }
    }
    CHECK(sgd.steps() == kSteps);
    CHECK(sgd.state_tensors().size() == (c.options.momentum != 0 ? store.slots().size() : 0));
    require_zero_padding(store.values(), store);
  }
}

TEST_CASE("AdamW follows torch.optim.AdamW's formulas with every option", "[engine][optim]") {
  struct Case {
    const char* name;
    GroupSetup groups;
    AdamwOptions options;
  };
  const Case cases[] = {
      {"two groups, default betas", {true, 0.01, 0.03, 0.1}, {0.9, 0.999, 1e-8}},
      {"low betas, large eps", {false, 0.05, 0.05, 0.3}, {0.5, 0.9, 1e-3}},
      {"beta1 0, eps 0.1, no decay", {true, 0.02, 0.005, 0.0}, {0.0, 0.99, 0.1}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    auto bag = test::make_bag();
    ParameterStore store(*bag, core::Device::cpu());
    test::randomize_values(store, 2);
    const auto groups = make_groups(store, c.groups);
    const auto group_of = group_of_slots(store, groups);
    std::vector<ReferenceAdamw> reference;
    for (std::size_t i = 0; i < store.slots().size(); ++i) {
      const ParamGroup& g = groups[group_of[i]];
      reference.push_back({g.lr,
                           g.weight_decay,
                           c.options.beta1,
                           c.options.beta2,
                           c.options.eps,
                           as_double(test::read(store.slots()[i].parameter->value)),
                           {},
                           {}});
    }
    AdamW adamw(store, groups, c.options);
    for (int step = 0; step < kSteps; ++step) {
      const auto grads = test::step_grads(store, step);
      test::set_grads(store, grads);
      adamw.step();
      const auto state = states_by_name(adamw);
      for (std::size_t i = 0; i < store.slots().size(); ++i) {
        Parameter& p = *store.slots()[i].parameter;
        reference[i].step(grads[i]);
        require_close(test::read(p.value), reference[i].p, p.name);
        require_close(test::read(state.at(p.name).at("exp_avg")), reference[i].m,
                      p.name + " exp_avg");
        require_close(test::read(state.at(p.name).at("exp_avg_sq")), reference[i].v,
                      p.name + " exp_avg_sq");
      }
    }
    require_zero_padding(store.values(), store);
  }
}

TEST_CASE("a long parameter is split into segments and updated whole", "[engine][optim]") {
  // 70001 elements: three segments of at most kMaxSegmentLength.
  auto bag = test::make_bag(70001);
  ParameterStore store(*bag, core::Device::cpu());
  test::randomize_values(store, 3);
  const auto& big = store.slots().back();
  const auto before = test::read(big.parameter->value);
  SGD sgd(store, single_group(store, 0.5, 0.0));
  const auto grads = test::step_grads(store, 0);
  test::set_grads(store, grads);
  sgd.step();
  const auto after = test::read(big.parameter->value);
  for (std::size_t i = 0; i < after.size(); ++i)
    REQUIRE(after[i] == before[i] - 0.5f * grads.back()[i]);  // one f32 rounding, as computed
}

TEST_CASE("the usual groups decay weights only; one group decays everything", "[engine][optim]") {
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  const auto two = decay_groups(store, 0.1, 0.01);
  REQUIRE(two.size() == 2);
  CHECK(two[0].weight_decay == 0.01);
  CHECK(two[1].weight_decay == 0.0);
  for (Parameter* p : two[0].params) CHECK(p->role == ParamRole::weight);
  for (Parameter* p : two[1].params) CHECK(p->role != ParamRole::weight);
  CHECK(two[0].params.size() + two[1].params.size() == store.slots().size());
  const auto one = single_group(store, 0.1, 0.01);
  REQUIRE(one.size() == 1);
  CHECK(one[0].params.size() == store.slots().size());
  CHECK(one[0].weight_decay == 0.01);
}

TEST_CASE("an optimizer resumed from its named state continues bit for bit", "[engine][optim]") {
  for (bool adam : {false, true}) {
    INFO((adam ? "AdamW" : "SGD"));
    auto make = [&](ParameterStore& store) -> std::unique_ptr<Optimizer> {
      if (adam) return std::make_unique<AdamW>(store, decay_groups(store, 0.01, 0.1));
      return std::make_unique<SGD>(store, decay_groups(store, 0.1, 0.1), SgdOptions{0.9, 0.1});
    };
    auto bag_a = test::make_bag(), bag_b = test::make_bag();
    ParameterStore a(*bag_a, core::Device::cpu()), b(*bag_b, core::Device::cpu());
    test::randomize_values(a, 4);
    auto opt_a = make(a);
    for (int step = 0; step < 3; ++step) {
      test::set_grads(a, test::step_grads(a, step));
      opt_a->step();
    }
    // "Save" a and "load" into b: values, state tensors by name, scalar state.
    b.values().copy_from(a.values());
    auto opt_b = make(b);
    for (const auto& s : opt_a->state_tensors())
      opt_b->set_state_tensor(s.parameter, s.state, s.value);
    for (const auto& s : opt_a->scalar_state()) opt_b->set_scalar_state(s.name, s.value);
    CHECK(opt_b->steps() == 3);
    for (int step = 3; step < 6; ++step) {
      test::set_grads(a, test::step_grads(a, step));
      test::set_grads(b, test::step_grads(b, step));
      opt_a->step();
      opt_b->step();
    }
    CHECK(test::read(a.values()) == test::read(b.values()));
  }
}

TEST_CASE("a step bumps every parameter's version", "[engine][optim]") {
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  std::vector<std::uint64_t> before;
  for (const auto& s : store.slots()) before.push_back(s.parameter->version);
  AdamW adamw(store, single_group(store, 0.01, 0.0));
  adamw.step();
  for (std::size_t i = 0; i < before.size(); ++i)
    CHECK(store.slots()[i].parameter->version == before[i] + 1);
}

TEST_CASE("optimizer misuse is an error that says what to fix", "[engine][optim]") {
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  auto groups = decay_groups(store, 0.1, 0.0);
  SECTION("a parameter in two groups") {
    groups[1].params.push_back(groups[0].params[0]);
    CHECK_THROWS_WITH(SGD(store, groups), Catch::Contains("'p0' is in groups 0 and 1"));
  }
  SECTION("a parameter in no group") {
    groups[1].params.pop_back();
    CHECK_THROWS_WITH(AdamW(store, groups), Catch::Contains("'p4' is trainable but in no group"));
  }
  SECTION("too many groups") {
    CHECK_THROWS_WITH(SGD(store, std::vector<ParamGroup>(17)),
                      Catch::Contains("17 parameter groups"));
  }
  SECTION("bad hyper-parameters") {
    groups[0].lr = -1;
    CHECK_THROWS_WITH(SGD(store, groups), Catch::Contains("SGD: lr -1.000000 is invalid"));
    groups[0].lr = 0.1;
    CHECK_THROWS_WITH(SGD(store, groups, SgdOptions{0.0, 0.0, true}),
                      Catch::Contains("Nesterov momentum requires a momentum > 0"));
    CHECK_THROWS_WITH(AdamW(store, groups, AdamwOptions{0.9, 1.0, 1e-8}),
                      Catch::Contains("beta 1.000000 is outside [0, 1)"));
  }
  SECTION("state that does not fit") {
    AdamW adamw(store, groups);
    const core::Tensor wrong = core::Tensor::zeros({3}, DType::f32);
    CHECK_THROWS_WITH(adamw.set_state_tensor("p0", "exp_avg", wrong),
                      Catch::Contains("p0/exp_avg") && Catch::Contains("[3, 11]"));
    CHECK_THROWS_WITH(adamw.set_state_tensor("p0", "momentum_buffer", wrong),
                      Catch::Contains("no state 'momentum_buffer'"));
    CHECK_THROWS_WITH(adamw.set_state_tensor("nope", "exp_avg", wrong),
                      Catch::Contains("no trainable parameter named 'nope'"));
    CHECK_THROWS_WITH(adamw.set_scalar_state("lr", 1), Catch::Contains("no scalar state 'lr'"));
    CHECK_THROWS_WITH(adamw.set_lr(2, 0.1), Catch::Contains("no parameter group 2"));
  }
}

// The group check the CUDA kernels rely on (Note [device segment table]):
// before anything moves, it names the segment and the group it lacks.
TEST_CASE("a segment table naming a missing group is rejected before any update",
          "[engine][optim]") {
  const kernels::OptimizerSegment table[] = {{0, 4, 0, 0}, {4, 4, 2, 4}, {8, 4, -1, 8}};
  const kernels::SgdGroup groups[2] = {{0.1f, 0.0f, 0.0f, 1.0f, false, true},
                                       {0.2f, 0.0f, 0.0f, 1.0f, false, true}};
  std::vector<float> params(12, 1.0f), grads(12, 1.0f);
  CHECK_THROWS_WITH(
      kernels::cpu::sgd_step(table, 3, groups, 2, params.data(), grads.data(), nullptr),
      Catch::Contains("sgd_step: segment 1 at offset 4 names group 2") &&
          Catch::Contains("there are 2 groups"));
  CHECK(params == std::vector<float>(12, 1.0f));
  CHECK_THROWS_WITH(kernels::validate_segments(table + 2, 1, 2, "AdamW"),
                    Catch::Contains("AdamW: segment 0 at offset 8 names group -1"));
  CHECK_NOTHROW(kernels::validate_segments(table, 1, 2, "SGD"));
}

// Clipping: the norm is a float64 sum over the parameters; the library's is
// an f64 sum too, in another order. Squares of f32 values are exact in f64
// and every term is positive, so any order is within (n-1) x 2^-53 relative
// of the exact sum: 3e-14 for the bag's 266 values, halved by the square
// root, so 1e-12 relative holds the norm. Clipped gradients are one f32
// multiply by a coefficient rounded to f32: 1e-6 relative.
TEST_CASE("clip_grad_norm reports the global norm and scales like torch", "[engine][optim]") {
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  const auto grads = test::step_grads(store, 7);
  double sum = 0;
  for (const auto& g : grads)
    for (float x : g) sum += static_cast<double>(x) * x;
  const double norm = std::sqrt(sum);

  test::set_grads(store, grads);
  CHECK(grad_norm(store.grads()) == Approx(norm).epsilon(1e-12));
  CHECK(clip_grad_norm(store.grads(), 2 * norm) == Approx(norm).epsilon(1e-12));
  for (std::size_t i = 0; i < grads.size(); ++i)  // below the limit: untouched
    REQUIRE(test::read(store.slots()[i].parameter->grad) == grads[i]);

  const double max_norm = norm / 3;
  CHECK(clip_grad_norm(store.grads(), max_norm) == Approx(norm).epsilon(1e-12));
  const double coef = max_norm / (norm + 1e-6);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const auto got = test::read(store.slots()[i].parameter->grad);
    for (std::size_t j = 0; j < got.size(); ++j)
      REQUIRE(got[j] == Approx(grads[i][j] * coef).epsilon(1e-6).margin(1e-12));
  }
  CHECK(grad_norm(store.grads()) == Approx(max_norm).epsilon(1e-5));
  require_zero_padding(store.grads(), store);
  CHECK_THROWS_WITH(clip_grad_norm(store.grads(), 0.0),
                    Catch::Contains("max_norm 0.000000 must be > 0"));
}

// ZeRO-1's shard sums: over ranges (an empty one among them, and one that
// covers padding), in f64, each range's sum of squares added in order.
TEST_CASE("grad_sum_squares over ranges is the f64 sum of their squares", "[engine][optim]") {
  auto bag = test::make_bag();
  ParameterStore store(*bag, core::Device::cpu());
  test::set_grads(store, test::step_grads(store, 8));
  const auto flat = test::read(store.grads());
  const auto n = static_cast<std::int64_t>(flat.size());
  const std::vector<comm::FlatRange> ranges{{0, n / 4}, {n / 4, 0}, {n / 2, n - n / 2}};
  double expected = 0.0;
  for (const comm::FlatRange& r : ranges) {
    double range_sum = 0.0;
    for (std::int64_t i = r.offset; i < r.offset + r.numel; ++i)
      range_sum += static_cast<double>(flat[i]) * flat[i];
    expected += range_sum;
  }
  CHECK(grad_sum_squares(store.grads(), ranges) == Approx(expected).epsilon(1e-13));
  CHECK(grad_sum_squares(store.grads(), {}) == 0.0);
  CHECK(grad_sum_squares(store.grads(), {{3, 0}}) == 0.0);
}
