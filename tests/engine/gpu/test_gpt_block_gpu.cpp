// GPT's blocks on CUDA under f16 and bf16 autocast, where they run the fused
// residual add + LayerNorm passes (Note [fused block], engine/nn/gpt_block.h),
// against the CPU's unfused blocks and against CUDA's own unfused blocks
// (GptBlock::Fusion::never): logits, loss and every gradient, at an odd width
// with dropout and checkpointing, and at GPT-2's width C = 768 over T = 1024;
// and, with deterministic kernels, the same bits on a second run.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "engine/nn/checkpointed.h"
#include "engine/nn/gpt.h"
#include "engine/nn/gpt_block.h"
#include "engine/nn/loss.h"
#include "engine/parameter_store.h"
#include "kernels/conv.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

void set_fusion(GPT& model, GptBlock::Fusion fusion) {
  for (Module* child : model.blocks().children()) {
    auto* checkpointed = dynamic_cast<Checkpointed*>(child);
    auto* block = dynamic_cast<GptBlock*>(checkpointed ? &checkpointed->inner() : child);
    REQUIRE(block);
    block->set_fusion(fusion);
  }
}

core::Tensor tokens(std::int64_t batch, std::int64_t seq, std::int64_t vocab, std::uint32_t seed) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(batch * seq));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int32_t>((i * 7 + seed * 13 + i * i) % vocab);
  return core::Tensor::from_vector(t, {batch, seq}, DType::i32);
}

struct Run {
  std::vector<float> logits, loss, grads;
};

Run train_step(GPT& model, ParameterStore& store, const core::Device& device,
               std::optional<DType> autocast, std::int64_t batch, std::int64_t seq) {
  const std::int64_t vocab = model.config().vocab;
  core::Stream stream = device.is_cuda() ? core::Stream::create(device) : core::Stream();
  store.zero_grad();
  if (device.is_cuda()) core::Stream::default_for(device).synchronize();
  Context ctx;
  ctx.stream = stream;
  ctx.autocast = autocast;
  ctx.seed = 11;
  CrossEntropyLoss loss;
  const core::Tensor x = tokens(batch, seq, vocab, 1).to(device, stream);
  const core::Tensor y = tokens(batch, seq, vocab, 4).to(device, stream);
  const core::Tensor logits = model.forward(x, ctx);
  Run run;
  run.logits = logits.cast(DType::f32, stream).to_vector<float>(stream);
  run.loss = loss.forward(logits, y, ctx).to_vector<float>(stream);
  model.backward(loss.backward(1024.0f, ctx), ctx);  // a loss scale, as f16 training uses
  stream.synchronize();
  run.grads = store.grads().to_vector<float>();
  return run;
}

// ||a - b|| / ||b|| in f64.
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// Tolerances, relative L2 over each whole tensor: both sides round the same
// values to the low type, but a value near a rounding boundary lands one
// low-type ulp apart (2^-10 f16, 2^-7 bf16 relative) and the difference
// travels through the blocks; a few such ulps in norm is what honest
// reordering gives, while a misplaced add or a wrong gradient is O(1).
double tolerance(DType autocast) { return autocast == DType::f16 ? 4e-3 : 3e-2; }

// Deterministic kernels for the run (cuDNN's fused attention adds dQ with
// atomics otherwise), so that a second run must give the same bits.
struct DeterministicScope {
  bool was = kernels::deterministic();
  DeterministicScope() { kernels::set_deterministic(true); }
  ~DeterministicScope() { kernels::set_deterministic(was); }
};

void compare(const GptConfig& config, std::int64_t batch, std::int64_t seq) {
  const DeterministicScope deterministic;
  GPT cpu(config), fused(config), unfused(config);
  for (GPT* m : {&cpu, &fused, &unfused}) initialize(*m, 7);
  set_fusion(unfused, GptBlock::Fusion::never);
  ParameterStore cpu_store(cpu, core::Device::cpu()), fused_store(fused, kGpu),
      unfused_store(unfused, kGpu);
  for (const DType autocast : {DType::f16, DType::bf16}) {
    INFO("autocast " << dtype_name(autocast) << ", C " << config.embed_dim << ", checkpointing "
                     << config.activation_checkpointing);
    const Run c = train_step(cpu, cpu_store, core::Device::cpu(), autocast, batch, seq);
    const Run f = train_step(fused, fused_store, kGpu, autocast, batch, seq);
    const Run u = train_step(unfused, unfused_store, kGpu, autocast, batch, seq);
    const double tol = tolerance(autocast);
    CHECK(relative_l2(f.logits, c.logits) <= tol);
    CHECK(std::fabs(f.loss[0] - c.loss[0]) <= tol * std::fabs(c.loss[0]));
    CHECK(relative_l2(f.grads, c.grads) <= tol);
    CHECK(relative_l2(f.logits, u.logits) <= tol);
    CHECK(relative_l2(f.grads, u.grads) <= tol);
    // Per parameter too: a wrong LayerNorm gradient is small in the whole vector.
    for (const ParameterStore::Slot& slot : fused_store.slots()) {
      const auto begin = static_cast<std::size_t>(slot.offset);
      const auto end = begin + static_cast<std::size_t>(slot.numel);
      const std::vector<float> fg(f.grads.begin() + begin, f.grads.begin() + end);
      const std::vector<float> cg(c.grads.begin() + begin, c.grads.begin() + end);
      INFO(slot.parameter->name);
      CHECK(relative_l2(fg, cg) <= 2 * tol);
    }
    const Run again = train_step(fused, fused_store, kGpu, autocast, batch, seq);
    CHECK(again.logits == f.logits);
    CHECK(again.grads == f.grads);
  }
}

}  // namespace

TEST_CASE("cuda gpt blocks fused under autocast match the cpu and the unfused blocks",
          "[gpu][engine][gpt][layernorm]") {
  for (const bool checkpointing : {false, true}) {
    compare({.layers = 2,
             .heads = 4,
             .embed_dim = 36,
             .block_size = 16,
             .vocab = 61,
             .dropout = 0.1f,
             .activation_checkpointing = checkpointing},
            3, 11);
  }
}

TEST_CASE("cuda gpt blocks fused under autocast match the cpu at gpt2's width",
          "[gpu][engine][gpt][layernorm]") {
  compare({.layers = 1, .heads = 12, .embed_dim = 768, .block_size = 1024, .vocab = 512}, 1, 1024);
}
