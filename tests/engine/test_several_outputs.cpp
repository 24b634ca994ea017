// Several inputs and outputs (Note [several inputs and outputs]) and a loss
// of several terms (Note [loss of several terms]): a two-head model's
// gradients against central differences, WeightedLosses against float64
// formulas, the one-tensor defaults against the one-tensor calls, and the
// step under f16 and bf16 autocast against the same step in f32.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/data_parallel_step.h"
#include "engine/nn/loss.h"
#include "engine/optim/sgd.h"
#include "support/gradcheck.h"
#include "support/two_heads.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// sum(logits * r1) + sum(value * r2), accumulated in f64.
double objective(test::TwoHeads& m, const core::Tensor& x, const core::Tensor& r1,
                 const core::Tensor& r2, Context& ctx) {
  const core::NamedTensors y = m.forward_named({{"inputs", x}}, ctx);
  double sum = 0.0;
  for (const auto& [name, r] : {std::pair{"logits", r1}, std::pair{"value", r2}}) {
    const auto yv = y.at(name, "test").to_vector<float>();
    const auto rv = r.to_vector<float>();
    for (std::size_t i = 0; i < yv.size(); ++i) sum += static_cast<double>(yv[i]) * rv[i];
  }
  return sum;
}

}  // namespace

TEST_CASE("a two-head model's gradients match central differences", "[engine][several]") {
  test::TwoHeads m(5, 8, 3);
  initialize(m, 4);
  const core::Tensor x = test::random_f32({6, 5}, 1);
  const core::Tensor r1 = test::random_f32({6, 3}, 2), r2 = test::random_f32({6, 1}, 3);
  Context ctx;
  m.forward_named({{"inputs", x}}, ctx);
  for (Parameter* p : m.parameters()) p->grad.fill_(0.0);
  std::vector<std::string> ready;
  ctx.on_grad_ready = [&](Parameter& p) { ready.push_back(p.name); };
  const core::NamedTensors dx = m.backward_named({{"logits", r1}, {"value", r2}}, ctx);
  m.report_ready(ctx);
  ctx.on_grad_ready = nullptr;
  // Reported in the static ready order the synchroniser's buckets follow.
  std::vector<std::string> order;
  for (Parameter* p : m.ready_order()) order.push_back(p->name);
  CHECK(ready == order);

  // gradcheck.h's step and tolerances (its header says why they are that size).
  const test::GradCheckOptions opt;
  auto check = [&](const std::string& what, core::Tensor target,
                   const std::vector<float>& analytic) {
    float* data = target.data_as<float>();
    for (std::int64_t i = 0; i < target.numel(); ++i) {
      const float saved = data[i];
      data[i] = saved + opt.step;
      const double plus = objective(m, x, r1, r2, ctx);
      data[i] = saved - opt.step;
      const double minus = objective(m, x, r1, r2, ctx);
      data[i] = saved;
      const double numeric = (plus - minus) / (2.0 * opt.step);
      INFO(what << " element " << i << ": analytic " << analytic[i] << ", numeric " << numeric);
      REQUIRE(std::fabs(analytic[i] - numeric) <= opt.abs_tol + opt.rel_tol * std::fabs(numeric));
    }
  };
  check("input", x, dx.at("inputs", "test").to_vector<float>());
  for (Parameter* p : m.parameters()) check(p->name, p->value, p->grad.to_vector<float>());
}

TEST_CASE("WeightedLosses is the weighted sum of its terms, its gradient theirs",
          "[engine][several][loss]") {
  const std::int64_t rows = 4, classes = 3;
  const core::Tensor logits = test::random_f32({rows, classes}, 7, 2.0f);
  const core::Tensor value = test::random_f32({rows, 1}, 8);
  const core::Tensor target = test::random_f32({rows, 1}, 9);
  const std::vector<std::int64_t> labels{2, 0, 1, 2};
  const core::NamedTensors outputs{{"logits", logits}, {"value", value}};
  const core::NamedTensors batch{{"targets", core::Tensor::from_vector(labels, {rows}, DType::i64)},
                                 {"age", target}};
  WeightedLosses loss({{std::make_shared<CrossEntropyLoss>(), "logits", "targets", 1.0f},
                       {std::make_shared<MSELoss>(), "value", "age", 0.5f}});
  Context ctx;
  const double total = loss.forward_named(outputs, batch, ctx).to_vector<float>()[0];
  CHECK(loss.counted_rows().to_vector<float>()[0] == rows);  // the first term's

  // float64 references: PyTorch's cross_entropy and mse_loss, mean reduction.
  const auto l = logits.to_vector<float>(), v = value.to_vector<float>(),
             t = target.to_vector<float>();
  double ce = 0, mse = 0;
  std::vector<double> dlogits(rows * classes), dvalue(rows);
  const float dloss = 3.0f;
  for (std::int64_t i = 0; i < rows; ++i) {
    double z = 0;
    for (std::int64_t c = 0; c < classes; ++c)
      z += std::exp(static_cast<double>(l[i * classes + c]));
    ce -= (l[i * classes + labels[i]] - std::log(z)) / rows;
    for (std::int64_t c = 0; c < classes; ++c)
      dlogits[i * classes + c] =
          dloss * (std::exp(static_cast<double>(l[i * classes + c])) / z - (c == labels[i])) / rows;
    mse += (v[i] - t[i]) * static_cast<double>(v[i] - t[i]) / rows;
    dvalue[i] = dloss * 0.5 * 2.0 * (v[i] - t[i]) / rows;
  }
  // f32 kernels on O(1) values: a few roundings, 1e-5 relative.
  CHECK(total == Approx(ce + 0.5 * mse).epsilon(1e-5));
  REQUIRE(loss.term_losses().size() == 2);
  CHECK(loss.term_losses()[1].to_vector<float>()[0] == Approx(mse).epsilon(1e-5));
  const core::NamedTensors grads = loss.backward_named(dloss, ctx);
  const auto gl = grads.at("logits", "test").to_vector<float>();
  const auto gv = grads.at("value", "test").to_vector<float>();
  for (std::size_t i = 0; i < gl.size(); ++i) CHECK(gl[i] == Approx(dlogits[i]).margin(1e-6));
  for (std::size_t i = 0; i < gv.size(); ++i) CHECK(gv[i] == Approx(dvalue[i]).margin(1e-6));
  // Its metric is the cross-entropy term's accuracy (engine::count_correct).
  CHECK(loss.count_correct_named(outputs, batch, {}).to_vector<float>()[0] ==
        count_correct(logits, batch.at("targets", "test"), {}).to_vector<float>()[0]);
}

TEST_CASE(
    "the one-tensor defaults of forward_named and a loss's named forms are the one-tensor calls",
    "[engine][several]") {
  Sequential seq;
  seq.emplace<Linear>("fc", 4, 3);
  initialize(seq, 2);
  const core::Tensor x = test::random_f32({5, 4}, 3);
  Context ctx;
  const auto direct = seq.forward(x, ctx).to_vector<float>();
  const core::NamedTensors out = seq.forward_named({{"inputs", x}}, ctx);
  CHECK(out.at("output", "test").to_vector<float>() == direct);
  const std::vector<std::int64_t> labels{0, 1, 2, 0, 1};
  const core::NamedTensors batch{{"targets", core::Tensor::from_vector(labels, {5}, DType::i64)}};
  CrossEntropyLoss ce;
  const float named = ce.forward_named(out, batch, ctx).to_vector<float>()[0];
  CHECK(
      named ==
      ce.forward(out.at("output", "test"), batch.at("targets", "test"), ctx).to_vector<float>()[0]);
  // A one-output loss over a two-output model names what there is.
  test::TwoHeads m(4, 6, 3);
  CHECK_THROWS_WITH(ce.forward_named(m.forward_named({{"inputs", x}}, ctx), batch, ctx),
                    Catch::Contains("no tensor named 'output'; there are 'logits', 'value'"));
  CHECK_THROWS_WITH(m.forward(x, ctx), Catch::Contains("call forward_named"));
}

TEST_CASE("a two-head model's step under f16 and bf16 autocast follows the f32 step",
          "[engine][several][autocast]") {
  const std::int64_t rows = 16;
  const core::Tensor x = test::random_f32({rows, 5}, 11);
  const core::Tensor value = test::random_f32({rows, 1}, 12);
  std::vector<std::int64_t> labels(rows);
  for (std::int64_t i = 0; i < rows; ++i) labels[i] = i % 3;
  const MicroBatch batch{
      x, core::Tensor::from_vector(labels, {rows}, DType::i64), {{"value", value}}};
  // Two steps from the same start; the losses and parameters after them.
  auto run = [&](std::optional<DType> autocast) {
    test::TwoHeads m(5, 8, 3);
    m.set_input_grad(false);
    initialize(m, 6);
    ParameterStore store(m, core::Device::cpu());
    SGD sgd(store, single_group(store, 0.1, 0.0));
    LossScaler scaler = LossScaler::for_autocast(autocast);
    StepOptions o;
    o.loss = std::make_shared<WeightedLosses>(std::vector<WeightedLosses::Term>{
        {std::make_shared<CrossEntropyLoss>(), "logits", "targets", 1.0f},
        {std::make_shared<MSELoss>(), "value", "value", 0.5f}});
    o.autocast = autocast;
    DataParallelStep step(m, store, sgd, make_scheduler("constant", {}), scaler, nullptr, o, {});
    std::vector<double> losses;
    for (int i = 0; i < 2; ++i) {
      const StepResult r = step.run({&batch, 1});
      REQUIRE_FALSE(r.skipped);
      losses.push_back(r.loss);
    }
    return std::pair{losses, store.values().to_vector<float>()};
  };
  const auto [f32_losses, f32_values] = run(std::nullopt);
  for (DType low : {DType::f16, DType::bf16}) {
    INFO(dtype_name(low));
    const auto [losses, values] = run(low);
    // bf16 keeps 8 bits of mantissa (relative rounding 2^-9, about 2e-3) in
    // the GEMM inputs; over layers of 5 and 8 inputs with O(1) values the
    // loss moves by well under 2e-2 relative, and one step of lr 0.1 moves
    // each weight by under 2e-3 from the f32 step's.
    for (std::size_t i = 0; i < losses.size(); ++i)
      CHECK(losses[i] == Approx(f32_losses[i]).epsilon(2e-2));
    for (std::size_t i = 0; i < values.size(); ++i)
      REQUIRE(std::fabs(values[i] - f32_values[i]) <= 2e-3);
  }
}
