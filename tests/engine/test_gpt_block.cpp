// GptBlock (engine/nn/gpt_block.h) on the CPU: the fused order of Note
// [fused block], run through the kernels' CPU twins, gives the unfused
// Sequential of Residuals' bits (logits, loss, every gradient) in f32 and
// under f16 and bf16 autocast, with dropout and with activation
// checkpointing; it reports gradients ready in the model's ready order and
// signals Context::on_module exactly as the unfused blocks do (ZeRO-3 gathers
// there). The CUDA kernels are held to these twins in tests/gpu.
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "engine/nn/checkpointed.h"
#include "engine/nn/gpt.h"
#include "engine/nn/gpt_block.h"
#include "engine/nn/loss.h"
#include "engine/parameter_store.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

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
  std::vector<std::string> ready;    // on_grad_ready, in order
  std::vector<std::string> signals;  // on_module: path and phase, in order
};

Run train_step(GPT& model, ParameterStore& store, std::optional<DType> autocast) {
  Run run;
  store.zero_grad();
  Context ctx;
  ctx.autocast = autocast;
  ctx.seed = 11;
  ctx.on_grad_ready = [&](Parameter& p) { run.ready.push_back(p.name); };
  ctx.on_module = [&](Module& m, ModulePhase phase) {
    run.signals.push_back(m.path() + "/" + m.type_name() + "/" +
                          std::to_string(static_cast<int>(phase)));
  };
  CrossEntropyLoss loss;
  const core::Tensor logits = model.forward(tokens(3, 11, 61, 1), ctx);
  run.logits = logits.cast(DType::f32).to_vector<float>();
  run.loss = loss.forward(logits, tokens(3, 11, 61, 4), ctx).to_vector<float>();
  model.backward(loss.backward(1024.0f, ctx), ctx);
  run.grads = store.grads().to_vector<float>();
  return run;
}

}  // namespace

TEST_CASE("gpt blocks give the unfused bits through the fused order on the cpu",
          "[engine][gpt][layernorm]") {
  // Odd sizes (C 36 in 4 heads of 9, T 11, V 61) and dropout on, so that the
  // dropout keys (by layer path) are exercised too. Bit for bit: the twins
  // compose the unfused modules' operations in their order.
  for (const bool checkpointing : {false, true}) {
    const GptConfig config{.layers = 2,
                           .heads = 4,
                           .embed_dim = 36,
                           .block_size = 16,
                           .vocab = 61,
                           .dropout = 0.1f,
                           .activation_checkpointing = checkpointing};
    GPT unfused(config), fused(config);
    initialize(unfused, 9);
    initialize(fused, 9);
    set_fusion(unfused, GptBlock::Fusion::never);
    set_fusion(fused, GptBlock::Fusion::always);
    ParameterStore unfused_store(unfused, core::Device::cpu());
    ParameterStore fused_store(fused, core::Device::cpu());
    for (const std::optional<DType> autocast :
         {std::optional<DType>{}, std::optional{DType::f16}, std::optional{DType::bf16}}) {
      INFO("checkpointing " << checkpointing << ", autocast "
                            << (autocast ? dtype_name(*autocast) : "off"));
      const Run a = train_step(unfused, unfused_store, autocast);
      const Run b = train_step(fused, fused_store, autocast);
      CHECK(b.logits == a.logits);
      CHECK(b.loss == a.loss);
      CHECK(b.grads == a.grads);
      CHECK(b.signals == a.signals);
      CHECK(b.ready == a.ready);
      std::vector<std::string> order;
      for (Parameter* p : fused.ready_order()) order.push_back(p->name);
      CHECK(b.ready == order);
    }
  }
}

TEST_CASE("gpt blocks keep nanoGPT's names and refuse a branch of another shape",
          "[engine][gpt][layernorm]") {
  const GptConfig config{.layers = 1, .heads = 2, .embed_dim = 8, .block_size = 4, .vocab = 5};
  GPT model(config);
  ParameterStore store(model, core::Device::cpu());  // assigns the names
  std::vector<std::string> names;
  for (Parameter* p : model.blocks().parameters()) names.push_back(p->name);
  CHECK(names == std::vector<std::string>{
                     "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                     "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                     "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias",
                     "transformer.h.0.ln_2.weight", "transformer.h.0.ln_2.bias",
                     "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
                     "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias"});
  CHECK(model.blocks().children().front()->type_name() == "Sequential");  // ONNX export: unchanged
  auto branch = std::make_unique<Sequential>();
  branch->emplace<Linear>("fc", 8, 8);
  auto other = std::make_unique<Sequential>();
  other->emplace<LayerNorm>("ln", 8);
  other->emplace<Linear>("fc", 8, 8);
  CHECK_THROWS_WITH(
      GptBlock(std::move(branch), std::move(other)),
      Catch::Contains("attention branch has 1 children") && Catch::Contains("[LayerNorm, module]"));
}
