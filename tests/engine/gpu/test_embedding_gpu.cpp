// The CUDA Embedding without a host wait of its own, its gradient over the
// whole GPU, and the optimizer's fused weight copies: the lookup's bad-index
// report carried home by the step's readback (Note [deferred index check]);
// the gradient held bit for bit to its order written on the host
// (tests/support/embedding_order.h, Note [embedding gradient order]) and
// within the f32 summation bound of the CPU loop, at gpt2's shape with random
// tokens and with one token 8192 times, repeating its bits; the copies the
// optimizer writes in its pass equal casts of the updated weights (Note
// [fused weight copy]).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/data_parallel_step.h"
#include "engine/nn/containers.h"
#include "engine/nn/embedding.h"
#include "engine/nn/gpt.h"
#include "engine/nn/linear.h"
#include "engine/optim/adamw.h"
#include "engine/optim/sgd.h"
#include "kernels/embedding.h"
#include "support/embedding_order.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

core::Tensor tokens(const std::vector<std::int64_t>& values, const core::Stream& stream) {
  return core::Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}, DType::i64,
                                   kGpu, stream);
}

std::vector<std::uint16_t> halves(const core::Tensor& t, const core::Stream& stream) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(t.numel()));
  t.copy_to_host(out.data(), stream);
  return out;
}

}  // namespace

TEST_CASE("cuda lookups record the first bad index in tag order, read no row for it",
          "[gpu][embedding]") {
  core::Stream stream = core::Stream::create(kGpu);
  const std::int64_t vocab = 40, dim = 33;
  const std::vector<float> table = random_floats(vocab * dim, 1);
  const core::Tensor weight =
      core::Tensor::from_vector(table, {vocab * dim}, DType::f32, kGpu, stream);
  core::Tensor word = core::Tensor::zeros({1}, DType::i64, kGpu, stream);
  auto* report_word = static_cast<std::uint64_t*>(word.data());
  const std::vector<std::vector<std::int64_t>> lookups = {
      {1, 2, 3}, {0, 5, 7, 8, 9, 40, 6, 7, 8, -1}, {-5, 1}};
  std::vector<core::Tensor> outputs;
  for (std::size_t tag = 0; tag < lookups.size(); ++tag) {
    const auto count = static_cast<std::int64_t>(lookups[tag].size());
    const core::Tensor idx = tokens(lookups[tag], stream);
    core::Tensor out = core::Tensor::empty({count * dim}, DType::f32, kGpu, stream);
    kernels::cuda::embedding_forward({count, vocab, dim, DType::i64}, weight.data_as<float>(),
                                     idx.data(), out.data_as<float>(), {report_word, tag},
                                     stream.handle());
    outputs.push_back(out);
  }
  const auto recorded = static_cast<std::uint64_t>(word.to_vector<std::int64_t>(stream)[0]);
  REQUIRE(kernels::index_report_bad(recorded));
  CHECK(kernels::index_report_tag(recorded) == 1);  // tag 2's bad index came later
  CHECK(kernels::index_report_position(recorded) == 5);
  for (std::size_t tag = 0; tag < lookups.size(); ++tag) {
    const std::vector<float> out = outputs[tag].to_vector<float>(stream);
    for (std::size_t n = 0; n < lookups[tag].size(); ++n) {
      const std::int64_t index = lookups[tag][n];
      const bool valid = index >= 0 && index < vocab;
      for (std::int64_t d = 0; d < dim; ++d)
        REQUIRE(out[n * dim + d] == (valid ? table[index * dim + d] : 0.0f));
    }
  }
  // Without a word nothing is recorded, and the rows are the same.
  word.fill_(0.0, stream);
  const core::Tensor idx = tokens(lookups[1], stream);
  core::Tensor out = core::Tensor::empty({10 * dim}, DType::f32, kGpu, stream);
  kernels::cuda::embedding_forward({10, vocab, dim, DType::i64}, weight.data_as<float>(),
                                   idx.data(), out.data_as<float>(), kernels::IndexReport{},
                                   stream.handle());
  CHECK(out.to_vector<float>(stream) == outputs[1].to_vector<float>(stream));
  CHECK(word.to_vector<std::int64_t>(stream)[0] == 0);
}

TEST_CASE("a data-parallel step on a GPU reads a bad token back with its loss and refuses the step",
          "[gpu][embedding][step]") {
  comm::World& world = test::gpu_world_of_one();
  core::Stream stream = core::Stream::create(kGpu);
  Sequential model;
  model.emplace<Embedding>("wte", 50, 8);
  model.emplace<Linear>("fc", 8, 4);
  initialize(model, 3);
  ParameterStore store(model, kGpu, stream);
  SGD sgd(store, single_group(store, 0.1, 0.0), {}, stream);
  LossScaler scaler = LossScaler::for_autocast(std::nullopt);
  DataParallelStep step(model, store, sgd, make_scheduler("constant", {}), scaler, &world, {},
                        stream);
  std::vector<std::int64_t> good(16), labels(16);
  for (std::size_t i = 0; i < good.size(); ++i) good[i] = static_cast<std::int64_t>(i * 7 % 50);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>(i % 4);
  const core::Tensor targets = tokens(labels, stream);
  const std::int64_t copies = core::host_copies();
  CHECK_FALSE(step.run(std::vector<MicroBatch>{{tokens(good, stream), targets}}).skipped);
  CHECK(core::host_copies() == copies + 1);  // the readback's: no wait of the lookup's own
  std::vector<std::int64_t> bad = good;
  bad[3] = 50;
  bad[9] = -7;
  const std::vector<float> before = store.values().to_vector<float>(stream);
  CHECK_THROWS_WITH(step.run(std::vector<MicroBatch>{{tokens(bad, stream), targets}}),
                    Catch::Contains("Embedding 'wte': index 50 at position 3 is outside the "
                                    "vocabulary [0, 50)") &&
                        Catch::Contains("no parameter was updated"));
  CHECK(store.values().to_vector<float>(stream) == before);
  CHECK(sgd.steps() == 1);
  CHECK_FALSE(step.run(std::vector<MicroBatch>{{tokens(good, stream), targets}}).skipped);
  CHECK(sgd.steps() == 2);
}

TEST_CASE("a gpt step on a GPU waits for the device once: wte reports through the readback",
          "[gpu][embedding][step]") {
  comm::World& world = test::gpu_world_of_one();
  core::Stream stream = core::Stream::create(kGpu);
  GPT model(GptConfig{.layers = 1, .heads = 2, .embed_dim = 16, .block_size = 8, .vocab = 33});
  ParameterStore store(model, kGpu, stream);
  AdamW adamw(store, decay_groups(store, 1e-3, 0.1), {}, stream);
  LossScaler scaler = LossScaler::for_autocast(DType::bf16);
  StepOptions o;
  o.autocast = DType::bf16;
  DataParallelStep step(model, store, adamw, make_scheduler("constant", {}), scaler, &world, o,
                        stream);
  std::vector<std::int64_t> x(16), y(16);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int64_t>(i * 5 % 33);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int64_t>((i * 5 + 1) % 33);
  const MicroBatch batch{core::Tensor::from_vector(x, {2, 8}, DType::i64, kGpu, stream),
                         core::Tensor::from_vector(y, {2, 8}, DType::i64, kGpu, stream)};
  for (int s = 0; s < 3; ++s) {
    const std::int64_t copies = core::host_copies();
    CHECK_FALSE(step.run(std::vector<MicroBatch>{batch}).skipped);
    CHECK(core::host_copies() == copies + 1);
  }
  // Note [fused weight copy]: lm_head (wte's table) and the blocks' Linears read the copy
  // the optimizer wrote, the bits of a cast of the updated weight.
  CHECK(adamw.fused_weight_copy() == DType::bf16);
  int copied = 0;
  for (const ParameterStore::Slot& s : store.slots()) {
    const Parameter& p = *s.parameter;
    if (!p.low_copy_wanted) continue;
    INFO(p.name);
    REQUIRE(p.low_copy.defined());
    CHECK(p.low_copy_version == p.version);
    CHECK(halves(p.low_copy, stream) == halves(p.value.cast(DType::bf16, stream), stream));
    ++copied;
  }
  CHECK(copied >= 3);  // c_attn, c_proj, c_fc, c_proj of the MLP, lm_head
}

namespace {

struct GradientCase {
  const char* name;
  std::int64_t count, vocab, dim;
  // Index n of the batch.
  std::function<std::int64_t(std::int64_t, std::mt19937&)> token;
};

}  // namespace

TEST_CASE(
    "cuda embedding gradient: the host transcription's bits, the cpu loop's value within the f32 "
    "bound, the same bits twice, at gpt2's shape and odd ones",
    "[gpu][embedding]") {
  core::Stream stream = core::Stream::create(kGpu);
  const auto uniform = [](std::int64_t vocab) {
    return [vocab](std::int64_t, std::mt19937& g) {
      return static_cast<std::int64_t>(g() % static_cast<std::uint32_t>(vocab));
    };
  };
  const std::vector<GradientCase> cases = {
      {"gpt2: 8192 random tokens of 50304, 768", 8192, 50304, 768, uniform(50304)},
      {"gpt2: 8192 copies of token 11", 8192, 50304, 768,
       [](std::int64_t, std::mt19937&) { return std::int64_t{11}; }},
      {"gpt2: half token 11, a quarter 12, the rest random (two long runs meet in a chunk)", 8192,
       50304, 768,
       [](std::int64_t, std::mt19937& g) {
         const std::uint32_t r = g() % 4;
         return r < 2 ? std::int64_t{11} : r == 2 ? std::int64_t{12} : std::int64_t(g() % 50304);
       }},
      {"vocab 50 over 4096 tokens, dim 77 (runs of about 80)", 4096, 50, 77, uniform(50)},
      {"33 copies of one token (one past a chunk), dim 5", 33, 7, 5,
       [](std::int64_t, std::mt19937&) { return std::int64_t{3}; }},
      {"bad indices among long runs, dim 300", 1000, 9, 300,
       [](std::int64_t n, std::mt19937& g) {
         return n % 10 == 0   ? std::int64_t{9}
                : n % 17 == 0 ? std::int64_t{-1}
                              : std::int64_t(g() % 3);
       }},
      {"a single token", 1, 7, 5, uniform(7)}};
  for (const GradientCase& c : cases) {
    INFO(c.name);
    std::mt19937 gen(5);
    std::vector<std::int64_t> idx(static_cast<std::size_t>(c.count));
    for (std::int64_t n = 0; n < c.count; ++n) idx[static_cast<std::size_t>(n)] = c.token(n, gen);
    const std::vector<float> dout = random_floats(static_cast<std::size_t>(c.count * c.dim), 6);
    const std::vector<float> dw0 = random_floats(static_cast<std::size_t>(c.vocab * c.dim), 7);
    std::vector<float> expected = dw0, cpu = dw0;
    test::embedding_backward_in_cuda_order(c.count, c.vocab, c.dim, dout.data(), idx.data(),
                                           expected.data());
    // The CPU loop throws at a bad index: give it the valid ones only.
    std::vector<std::int64_t> valid_idx;
    std::vector<float> valid_dout;
    for (std::int64_t n = 0; n < c.count; ++n) {
      const std::int64_t i = idx[static_cast<std::size_t>(n)];
      if (i < 0 || i >= c.vocab) continue;
      valid_idx.push_back(i);
      valid_dout.insert(valid_dout.end(), dout.begin() + n * c.dim, dout.begin() + (n + 1) * c.dim);
    }
    kernels::cpu::embedding_backward(
        {static_cast<std::int64_t>(valid_idx.size()), c.vocab, c.dim, DType::i64},
        valid_dout.data(), valid_idx.data(), cpu.data());
    for (DType type : {DType::i64, DType::i32}) {
      INFO(dtype_name(type));
      const kernels::EmbeddingShape s{c.count, c.vocab, c.dim, type};
      const core::Tensor gidx = tokens(idx, stream).cast(type, stream);
      const core::Tensor gdout =
          core::Tensor::from_vector(dout, {c.count * c.dim}, DType::f32, kGpu, stream);
      const auto bytes =
          static_cast<std::int64_t>(kernels::cuda::embedding_backward_workspace_bytes(s));
      core::Tensor workspace = core::Tensor::empty({bytes}, DType::u8, kGpu, stream);
      std::vector<std::vector<float>> runs;
      for (int run = 0; run < 2; ++run) {
        core::Tensor gdw =
            core::Tensor::from_vector(dw0, {c.vocab * c.dim}, DType::f32, kGpu, stream);
        stream.synchronize();
        const auto start = std::chrono::steady_clock::now();
        kernels::cuda::embedding_backward(s, gdout.data_as<float>(), gidx.data(),
                                          gdw.data_as<float>(), workspace.data(), stream.handle());
        stream.synchronize();
        if (run == 1 && c.count == 8192)
          std::printf(
              "embedding gradient, %s, %s: %.1f us\n", c.name, dtype_name(type),
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count());
        runs.push_back(gdw.to_vector<float>(stream));
      }
      CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0);
      const std::vector<float>& gpu = runs[0];
      // Bit for bit against the transcription; the first differing element only.
      for (std::size_t k = 0; k < gpu.size(); ++k) {
        if (std::memcmp(&gpu[k], &expected[k], sizeof(float)) == 0) continue;
        INFO("dweight element " << k << ": cuda " << gpu[k] << ", host order " << expected[k]);
        REQUIRE(std::memcmp(&gpu[k], &expected[k], sizeof(float)) == 0);
      }
    }
    // Against the CPU loop: two f32 sums of the same n + 1 terms in two
    // orders, each within gamma_{n+1} sum|x| of the exact sum (Higham 4.2).
    std::vector<double> sum_abs(dw0.size());
    std::vector<std::int64_t> uses(static_cast<std::size_t>(c.vocab), 0);
    for (std::size_t k = 0; k < dw0.size(); ++k) sum_abs[k] = std::fabs(dw0[k]);
    for (std::size_t n = 0; n < valid_idx.size(); ++n) {
      ++uses[static_cast<std::size_t>(valid_idx[n])];
      for (std::int64_t d = 0; d < c.dim; ++d)
        sum_abs[static_cast<std::size_t>(valid_idx[n] * c.dim + d)] +=
            std::fabs(valid_dout[n * c.dim + d]);
    }
    for (std::size_t k = 0; k < cpu.size(); ++k) {
      const auto n = static_cast<double>(uses[k / static_cast<std::size_t>(c.dim)] + 1);
      const double u = std::ldexp(1.0, -24), bound = 2 * n * u / (1 - n * u) * sum_abs[k];
      if (std::fabs(static_cast<double>(expected[k]) - cpu[k]) <= bound) continue;
      INFO("dweight element " << k << ": cuda order " << expected[k] << ", cpu " << cpu[k]);
      REQUIRE(std::fabs(static_cast<double>(expected[k]) - cpu[k]) <= bound);
    }
  }
}

TEST_CASE("the cuda optimizers write the weight copy as a cast of the updated weights",
          "[gpu][optim]") {
  core::Stream stream = core::Stream::create(kGpu);
  for (const DType type : {DType::bf16, DType::f16})
    for (const std::string name : {"sgd", "adamw"}) {
      INFO(name << " " << dtype_name(type));
      // Two identical models: one asks for copies, one does not.
      Sequential fused_model, plain_model;
      for (Sequential* m : {&fused_model, &plain_model}) {
        m->emplace<Linear>("fc1", 300, 250);  // 75000 weights: three segments
        m->emplace<Linear>("fc2", 250, 3);
        initialize(*m, 9);
      }
      ParameterStore fused_store(fused_model, kGpu, stream), plain_store(plain_model, kGpu, stream);
      const auto make = [&](ParameterStore& store) -> std::unique_ptr<Optimizer> {
        if (name == "adamw")
          return std::make_unique<AdamW>(store, decay_groups(store, 1e-2, 0.1), AdamwOptions{},
                                         stream);
        return std::make_unique<SGD>(store, decay_groups(store, 0.1, 1e-3),
                                     SgdOptions{.momentum = 0.9}, stream);
      };
      const std::unique_ptr<Optimizer> fused = make(fused_store), plain = make(plain_store);
      for (const ParameterStore::Slot& s : fused_store.slots())
        if (s.parameter->role == ParamRole::weight) s.parameter->low_copy_wanted = type;
      const std::vector<float> grads =
          random_floats(static_cast<std::size_t>(fused_store.grads().numel()), 10);
      for (int step = 0; step < 3; ++step) {
        for (ParameterStore* store : {&fused_store, &plain_store})
          store->grads().copy_from(
              core::Tensor::from_vector(grads, {store->grads().numel()}, DType::f32, kGpu, stream),
              stream);
        fused->step(stream);
        plain->step(stream);
      }
      CHECK(fused->fused_weight_copy() == type);
      CHECK_FALSE(plain->fused_weight_copy());
      // The update itself is unchanged by the copy.
      const std::vector<float> a = fused_store.values().to_vector<float>(stream);
      const std::vector<float> b = plain_store.values().to_vector<float>(stream);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      for (const ParameterStore::Slot& s : fused_store.slots()) {
        const Parameter& p = *s.parameter;
        INFO(p.name);
        if (p.role != ParamRole::weight) {
          CHECK_FALSE(p.low_copy.defined());
          continue;
        }
        REQUIRE(p.low_copy.defined());
        CHECK(p.low_copy.dtype() == type);
        CHECK(p.low_copy_version == p.version);
        CHECK(halves(p.low_copy, stream) == halves(p.value.cast(type, stream), stream));
      }
    }
}
