// The host side of the Embedding index checks and of the optimizer's weight
// copies, on the CPU: the step readback carrying a lookup's bad-index report
// (Note [deferred index check]), the step it refuses, the error's words; the
// CUDA gradient's order of additions against the CPU loop and a float64 sum
// (Note [embedding gradient order]); and AutocastWeight's use of a weight copy
// the optimizer published (Note [fused weight copy]). The CUDA sides are in
// tests/engine/gpu/test_embedding_gpu.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/data_parallel_step.h"
#include "engine/nn/containers.h"
#include "engine/nn/embedding.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "engine/step_readback.h"
#include "kernels/embedding.h"
#include "support/embedding_order.h"
#include "support/gradcheck.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

// What a CUDA lookup's kernel records for a bad index at `position` (Note
// [index report word]), written here on the host as the formula says.
void record_bad_index(const kernels::IndexReport& report, std::int64_t position) {
  const std::uint64_t value =
      ~(report.tag << kernels::kIndexReportPositionBits | static_cast<std::uint64_t>(position));
  *report.word = std::max(*report.word, value);
}

// A layer that looks its indices up as a CUDA Embedding does inside a step: it
// registers with Context::index_checks and records its bad indices into the
// report word (by hand: the CPU Embedding throws at once instead). It passes
// its input through.
class RecordingLookup : public Module {
 public:
  RecordingLookup(std::vector<std::int64_t> indices, std::int64_t vocab)
      : Module("RecordingLookup"), indices_(std::move(indices)), vocab_(vocab) {}
  core::Tensor forward(const core::Tensor& x, Context& ctx) override {
    REQUIRE(ctx.index_checks != nullptr);
    const core::Tensor indices = core::Tensor::from_vector(
        indices_, {static_cast<std::int64_t>(indices_.size())}, DType::i64);
    const kernels::IndexReport report = ctx.index_checks->add(describe(), indices, vocab_);
    REQUIRE(report.word != nullptr);
    for (std::size_t n = 0; n < indices_.size(); ++n)
      if (indices_[n] < 0 || indices_[n] >= vocab_)
        record_bad_index(report, static_cast<std::int64_t>(n));
    return x;
  }
  core::Tensor backward(const core::Tensor& dy, Context&) override { return dy; }
  std::vector<std::int64_t> indices_;

 private:
  std::int64_t vocab_;
};

}  // namespace

TEST_CASE("the step readback carries the first bad index of the step's lookups in its one copy",
          "[engine][readback][embedding]") {
  StepReadback readback(1, 0, core::Device::cpu(), {});
  readback.clear({});
  const core::Tensor good = core::Tensor::from_vector<std::int64_t>({1, 2, 3}, {3}, DType::i64);
  const core::Tensor bad =
      core::Tensor::from_vector<std::int64_t>({0, 1, 7, 99, 8, -3}, {6}, DType::i64);
  IndexChecks& checks = readback.index_checks();
  const kernels::IndexReport first = checks.add("Embedding 'wte'", good, 50);
  const kernels::IndexReport second = checks.add("Embedding 'other'", bad, 50);
  REQUIRE(first.word != nullptr);
  CHECK(second.word == first.word);
  CHECK(first.tag == 0);
  CHECK(second.tag == 1);
  record_bad_index(second, 5);  // the kernel's blocks record in any order
  record_bad_index(second, 3);
  const std::int64_t before = core::host_copies();
  const StepReadback::Values& v = readback.read({});
  CHECK(core::host_copies() == before + 1);
  REQUIRE(kernels::index_report_bad(v.bad_index));
  CHECK(kernels::index_report_tag(v.bad_index) == 1);
  CHECK(kernels::index_report_position(v.bad_index) == 3);
  CHECK_THROWS_WITH(
      checks.check(v.bad_index, {}),
      Catch::Contains("Embedding 'other': index 99 at position 3 is outside the vocabulary [0, "
                      "50)") &&
          Catch::Contains("tokenized with this model's tokenizer") &&
          Catch::Contains("the step was refused: no parameter was updated"));
  // An earlier lookup's bad index wins over a later one's, whatever the positions.
  record_bad_index(first, 2);
  CHECK(kernels::index_report_tag(readback.read({}).bad_index) == 0);
  readback.clear({});
  const StepReadback::Values& cleared = readback.read({});
  CHECK_FALSE(kernels::index_report_bad(cleared.bad_index));
  CHECK_NOTHROW(checks.check(cleared.bad_index, {}));
  CHECK(checks.add("Embedding 'wte'", good, 50).tag == 0);  // clear() forgot the lookups
}

TEST_CASE("a data-parallel step whose lookup reported a bad index throws it and updates nothing",
          "[engine][readback][embedding]") {
  const std::int64_t rows = 8;
  const core::Tensor x = test::random_f32({rows, 6}, 3);
  std::vector<std::int64_t> labels(rows);
  for (std::int64_t i = 0; i < rows; ++i) labels[static_cast<std::size_t>(i)] = i % 4;
  const MicroBatch batch{x, core::Tensor::from_vector(labels, {rows}, DType::i64)};
  struct Mode {
    const char* name;
    int zero_stage = 0;
    int accumulation = 1;
    bool rank_invariant = false;
  };
  for (const Mode mode : {Mode{"plain"}, Mode{"ZeRO-1", 1}, Mode{"accumulation 2", 0, 2},
                          Mode{"rank-invariant, accumulation 2", 0, 2, true}}) {
    INFO(mode.name);
    Sequential model;
    auto& lookup = model.emplace<RecordingLookup>("lookup", std::vector<std::int64_t>{3, 4, 60, 7},
                                                  std::int64_t{50});
    model.emplace<Linear>("fc", 6, 4);
    initialize(model, 5);
    ParameterStore store(model, core::Device::cpu());
    AdamW adamw(store, single_group(store, 0.01, 0.01));
    LossScaler scaler = LossScaler::for_autocast(std::nullopt);
    StepOptions o;
    o.sync.zero_stage = mode.zero_stage;
    o.accumulation = mode.accumulation;
    o.rank_invariant = mode.rank_invariant;
    DataParallelStep step(model, store, adamw, make_scheduler("constant", {}), scaler,
                          &test::world_of_one(), o, {});
    const std::vector<MicroBatch> batches(static_cast<std::size_t>(mode.accumulation), batch);
    const std::vector<float> before = store.values().to_vector<float>();
    CHECK_THROWS_WITH(step.run(batches),
                      Catch::Contains("RecordingLookup 'lookup': index 60 at position 2 is outside "
                                      "the vocabulary [0, 50)") &&
                          Catch::Contains("no parameter was updated"));
    CHECK(store.values().to_vector<float>() == before);
    CHECK(adamw.steps() == 0);
    CHECK(step.steps() == 0);
    // The same step with the index mended trains, from the same values.
    lookup.indices_[2] = 6;
    const StepResult r = step.run(batches);
    CHECK_FALSE(r.skipped);
    CHECK(adamw.steps() == 1);
    CHECK(store.values().to_vector<float>() != before);
  }
}

TEST_CASE("a cpu Embedding names itself, the index, its position and the fix",
          "[engine][embedding]") {
  Sequential model;
  model.emplace<Embedding>("wte", 50, 8);
  Context ctx;
  for (DType type : {DType::i64, DType::i32}) {
    INFO(dtype_name(type));
    const core::Tensor idx =
        core::Tensor::from_vector<std::int64_t>({3, 50, 0, -2, 49}, {5}, DType::i64).cast(type);
    CHECK_THROWS_WITH(
        model.forward(idx, ctx),
        Catch::Contains("Embedding 'wte': index 50 at position 1 is outside the vocabulary [0, "
                        "50)") &&
            Catch::Contains("build the model with a larger vocabulary"));
  }
}

namespace {

// Tolerance of an f32 sum of n terms in any order against the exact sum:
// gamma_n sum |x| with gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy
// and Stability of Numerical Algorithms, 4.2).
double sum_bound(std::int64_t terms, double sum_abs) {
  const double nu = static_cast<double>(terms) * std::ldexp(1.0, -24);
  return nu / (1.0 - nu) * sum_abs;
}

}  // namespace

TEST_CASE(
    "the cuda embedding gradient's order gives the cpu's bits for indices met at most "
    "kEmbeddingChunk times and a float64 sum's value within the f32 bound beyond",
    "[engine][embedding]") {
  struct Case {
    const char* name;
    std::int64_t count, vocab, dim;
    bool one_token;
  };
  for (const Case c : {Case{"random over 50304", 2048, 50304, 6, false},
                       Case{"random over 50 (runs of about 80)", 4096, 50, 7, false},
                       Case{"8192 copies of token 11", 8192, 20, 5, true},
                       Case{"a single token", 1, 7, 5, false}}) {
    INFO(c.name);
    std::mt19937 gen(17);
    std::uniform_int_distribution<std::int64_t> pick(0, c.vocab - 1);
    std::vector<std::int64_t> idx(static_cast<std::size_t>(c.count));
    for (auto& i : idx) i = c.one_token ? 11 : pick(gen);
    const std::vector<float> dout = test::random_f32({c.count * c.dim}, 52).to_vector<float>();
    const std::vector<float> dw0 = test::random_f32({c.vocab * c.dim}, 53).to_vector<float>();
    std::vector<float> cuda_order = dw0, cpu = dw0;
    test::embedding_backward_in_cuda_order(c.count, c.vocab, c.dim, dout.data(), idx.data(),
                                           cuda_order.data());
    kernels::cpu::embedding_backward({c.count, c.vocab, c.dim, DType::i64}, dout.data(), idx.data(),
                                     cpu.data());
    std::vector<std::int64_t> uses(static_cast<std::size_t>(c.vocab), 0);
    for (std::int64_t i : idx) ++uses[static_cast<std::size_t>(i)];
    std::vector<double> exact(dw0.begin(), dw0.end()), sum_abs(exact.size());
    for (std::size_t k = 0; k < exact.size(); ++k) sum_abs[k] = std::fabs(exact[k]);
    for (std::int64_t n = 0; n < c.count; ++n)
      for (std::int64_t d = 0; d < c.dim; ++d) {
        const auto k = static_cast<std::size_t>(idx[static_cast<std::size_t>(n)] * c.dim + d);
        exact[k] += dout[static_cast<std::size_t>(n * c.dim + d)];
        sum_abs[k] += std::fabs(dout[static_cast<std::size_t>(n * c.dim + d)]);
      }
    for (std::int64_t v = 0; v < c.vocab; ++v)
      for (std::int64_t d = 0; d < c.dim; ++d) {
        const auto k = static_cast<std::size_t>(v * c.dim + d);
        const std::int64_t n = uses[static_cast<std::size_t>(v)];
        if (n <= kernels::kEmbeddingChunk) {
          if (std::memcmp(&cuda_order[k], &cpu[k], sizeof(float)) == 0) continue;
          INFO("row " << v << " (" << n << " uses), channel " << d);
          REQUIRE(cuda_order[k] == cpu[k]);
        }
        const double bound = sum_bound(n + 1, sum_abs[k]);
        if (std::fabs(cuda_order[k] - exact[k]) <= bound && std::fabs(cpu[k] - exact[k]) <= bound)
          continue;
        INFO("row " << v << " (" << n << " uses), channel " << d << ": cuda order " << cuda_order[k]
                    << ", cpu " << cpu[k] << ", float64 " << exact[k]);
        REQUIRE(std::fabs(cuda_order[k] - exact[k]) <= bound);
        REQUIRE(std::fabs(cpu[k] - exact[k]) <= bound);
      }
  }
}

TEST_CASE(
    "AutocastWeight returns the optimizer's weight copy while it is current and casts otherwise",
    "[engine][autocast]") {
  Linear fc(4, 3);
  ParameterStore store(fc, core::Device::cpu());
  Parameter& w = fc.weight();
  AutocastWeight cache;
  const auto bits = [](const core::Tensor& t) { return t.cast(DType::f32).to_vector<float>(); };
  const std::vector<float> cast = bits(w.value.cast(DType::bf16));
  CHECK(bits(cache.get(w, DType::bf16, {})) == cast);
  CHECK(w.low_copy_wanted == DType::bf16);  // the optimizer's cue
  // A copy the optimizer published at the weight's version is returned as it is.
  w.low_copy = core::Tensor::zeros(w.value.shape(), DType::bf16);
  w.low_copy_version = w.version;
  CHECK(cache.get(w, DType::bf16, {}).data() == w.low_copy.data());
  CHECK(cache.get(w, DType::f16, {}).data() != w.low_copy.data());  // another type: a cast
  // A step on the CPU writes no copy (its casts and bits stay) and moves the version on.
  SGD sgd(store, single_group(store, 0.1, 0.0));
  fc.weight().grad.fill_(1.0);
  sgd.step();
  CHECK_FALSE(sgd.fused_weight_copy());
  const core::Tensor& after = cache.get(w, DType::bf16, {});
  CHECK(after.data() != w.low_copy.data());
  CHECK(bits(after) == bits(w.value.cast(DType::bf16)));
}
