// The CUDA graph step (Note [step graph]) against the eager step on cuda:0:
// with deterministic kernels, the same batches give the same losses and the
// same parameters bit for bit, for gpt-tiny (bf16), resnet (bf16, BatchNorm's
// buffers) and mlp (f32, two micro-batches; f16, whose loss scale changes and
// is captured again); other shapes run eagerly and the graph comes back;
// Dropout refuses the capture; a bad token is still reported by the replay,
// also after an eager step of other shapes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/data_parallel_step.h"
#include "engine/models.h"
#include "engine/optim/adamw.h"
#include "kernels/conv.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

struct Run {
  core::Stream stream = core::Stream::create(kGpu);
  std::unique_ptr<Module> model;
  std::unique_ptr<ParameterStore> store;
  std::unique_ptr<AdamW> adamw;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<DataParallelStep> step;

  Run(const std::string& name, std::optional<DType> autocast, bool graph, int accumulation = 1,
      float dropout = 0.0f, LossScalerOptions scaling = {}) {
    ModelOptions mo;
    mo.width_divisor = name == "resnet" ? 8 : 1;
    mo.dropout = dropout;
    model = make_model(name, mo);
    initialize(*model, 11);
    store = std::make_unique<ParameterStore>(*model, kGpu, stream);
    adamw =
        std::make_unique<AdamW>(*store, single_group(*store, 1e-3, 0.01), AdamwOptions{}, stream);
    scaling.enabled = autocast == DType::f16;
    scaler = std::make_unique<LossScaler>(scaling);
    StepOptions o;
    o.autocast = autocast;
    o.accumulation = accumulation;
    o.cuda_graph = graph;
    step =
        std::make_unique<DataParallelStep>(*model, *store, *adamw, make_scheduler("constant", {}),
                                           *scaler, &test::gpu_world_of_one(), o, stream);
  }

  std::vector<float> parameters() { return store->values().to_vector<float>(stream); }
};

// Micro-batch `k` of step `s` for preset `name`, `rows` rows: different data every step.
MicroBatch batch(const std::string& name, int s, int k, std::int64_t rows, const Run& run) {
  const ModelPreset& preset = model_preset(name);
  core::Shape shape{rows};
  shape.insert(shape.end(), preset.sample_shape.begin(), preset.sample_shape.end());
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  const int seed = 31 * s + k;
  if (preset.language_model) {
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<std::int64_t>((i * 7 + 13 * seed) % preset.classes);
    const core::Tensor t = core::Tensor::from_vector(tokens, shape, DType::i64, kGpu, run.stream);
    return {t, t};
  }
  std::vector<float> pixels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.1f * i + 0.7f * seed);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int64_t>((i + seed) % preset.classes);
  return {core::Tensor::from_vector(pixels, shape, DType::f32, kGpu, run.stream),
          core::Tensor::from_vector(labels, {rows}, DType::i64, kGpu, run.stream)};
}

std::vector<double> train(Run& run, const std::string& name, int steps, int accumulation,
                          std::int64_t rows) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<MicroBatch> batches;
    for (int k = 0; k < accumulation; ++k) batches.push_back(batch(name, s, k, rows, run));
    losses.push_back(run.step->run(batches).loss);
  }
  return losses;
}

void same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Deterministic {
  Deterministic() { kernels::set_deterministic(true); }
  ~Deterministic() { kernels::set_deterministic(false); }
};

}  // namespace

TEST_CASE("the CUDA graph step gives the eager step's bits [gpu]", "[gpu][graph]") {
  Deterministic deterministic;
  struct Case {
    std::string name;
    std::optional<DType> autocast;
    int accumulation;
  };
  for (const Case& c : {Case{"gpt-tiny", DType::bf16, 1}, Case{"resnet", DType::bf16, 1},
                        Case{"mlp", std::nullopt, 2}}) {
    INFO(c.name);
    Run eager(c.name, c.autocast, false, c.accumulation);
    Run graph(c.name, c.autocast, true, c.accumulation);
    const int steps = 7;
    const std::vector<double> want = train(eager, c.name, steps, c.accumulation, 4);
    const std::vector<double> got = train(graph, c.name, steps, c.accumulation, 4);
    CHECK(got == want);
    same_bits(graph.parameters(), eager.parameters());
    const StepGraphCounts& n = *graph.step->graph_counts();
    CHECK(n.eager == StepGraph::kWarmupSteps);
    CHECK(n.captures == 1);
    CHECK(n.replays == steps - StepGraph::kWarmupSteps);
    CHECK(n.nodes > 10);
    CHECK(eager.step->graph_counts() == nullptr);
  }
}

TEST_CASE("a new f16 loss scale is captured again [gpu]", "[gpu][graph]") {
  Deterministic deterministic;
  LossScalerOptions scaling;
  scaling.init_scale = 1024.0f;
  scaling.growth_interval = 2;  // the scale doubles every two finite steps
  Run eager("mlp", DType::f16, false, 1, 0.0f, scaling);
  Run graph("mlp", DType::f16, true, 1, 0.0f, scaling);
  CHECK(train(graph, "mlp", 8, 1, 4) == train(eager, "mlp", 8, 1, 4));
  same_bits(graph.parameters(), eager.parameters());
  CHECK(graph.scaler->scale() > 1024.0f);
  CHECK(graph.step->graph_counts()->captures >= 2);
}

TEST_CASE("other shapes run eagerly and the graph comes back [gpu]", "[gpu][graph]") {
  Deterministic deterministic;
  Run eager("mlp", std::nullopt, false);
  Run graph("mlp", std::nullopt, true);
  for (Run* r : {&eager, &graph}) {
    train(*r, "mlp", 4, 1, 4);
    const MicroBatch odd = batch("mlp", 9, 0, 3, *r);  // 3 rows, not 4
    r->step->run({&odd, 1});
    train(*r, "mlp", 2, 1, 4);
  }
  same_bits(graph.parameters(), eager.parameters());
  const StepGraphCounts& n = *graph.step->graph_counts();
  CHECK(n.captures == 1);
  CHECK(n.eager == StepGraph::kWarmupSteps + 1);
  CHECK(n.last_eager_reason.find("shapes differ") != std::string::npos);
}

TEST_CASE("Dropout refuses the capture [gpu]", "[gpu][graph]") {
  Run graph("gpt-tiny", DType::bf16, true, 1, 0.1f);
  train(graph, "gpt-tiny", StepGraph::kWarmupSteps, 1, 2);
  const MicroBatch b = batch("gpt-tiny", 5, 0, 2, graph);
  REQUIRE_THROWS_WITH(graph.step->run({&b, 1}),
                      Catch::Contains("dropout p=") && Catch::Contains("Note [step graph]"));
}

TEST_CASE("a bad token is reported through the replayed graph [gpu]", "[gpu][graph]") {
  Run graph("gpt-tiny", DType::bf16, true);
  train(graph, "gpt-tiny", StepGraph::kWarmupSteps + 2, 1, 2);
  REQUIRE(graph.step->graph_counts()->replays == 2);
  // An eager step of other shapes between registers its own lookups; the
  // replay must still name the captured ones, with the bad token's value.
  const MicroBatch odd = batch("gpt-tiny", 7, 0, 3, graph);
  graph.step->run({&odd, 1});
  const ModelPreset& preset = model_preset("gpt-tiny");
  std::vector<std::int64_t> tokens(2 * static_cast<std::size_t>(preset.sample_shape[0]), 1);
  tokens[5] = preset.classes + 3;  // outside the vocabulary
  const core::Tensor x = core::Tensor::from_vector(tokens, {2, preset.sample_shape[0]}, DType::i64,
                                                   kGpu, graph.stream);
  const MicroBatch bad{x, x};
  REQUIRE_THROWS_WITH(
      graph.step->run({&bad, 1}),
      Catch::Contains("wte") && Catch::Contains(std::to_string(preset.classes + 3)));
  CHECK(graph.step->graph_counts()->replays == 3);
}
