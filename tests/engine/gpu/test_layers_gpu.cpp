// The engine's own layers and losses on CUDA against the same layers on the
// CPU, forward and backward, in f32 and under f16/bf16 autocast. Two copies of
// a model are built from one seed; each gets a ParameterStore on its device.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "engine/nn/activation.h"
#include "engine/nn/attention.h"
#include "engine/nn/containers.h"
#include "engine/nn/embedding.h"
#include "engine/nn/gpt.h"
#include "engine/nn/linear.h"
#include "engine/nn/loss.h"
#include "engine/nn/norm.h"
#include "engine/parameter_store.h"
#include "support/gradcheck.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

// `stream` is the one that computed `gpu` (the default stream when omitted):
// the read is queued behind that work, then waits for it.
void require_close(const core::Tensor& gpu, const core::Tensor& cpu, double abs_tol, double rel_tol,
                   const std::string& what, const core::Stream& stream = {}) {
  REQUIRE(gpu.shape() == cpu.shape());
  const auto g = gpu.cast(DType::f32, stream).to_vector<float>(stream);
  const auto c = cpu.cast(DType::f32).to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isinf(c[i]) && g[i] == c[i]) continue;
    if (std::fabs(g[i] - c[i]) <= abs_tol + rel_tol * std::fabs(c[i]))
      continue;  // a message only for the element that fails
    INFO(what << " element " << i << ": cuda " << g[i] << ", cpu " << c[i]);
    REQUIRE(std::fabs(g[i] - c[i]) <= abs_tol + rel_tol * std::fabs(c[i]));
  }
}

// Tolerances: f32 differs only in summation order (GEMM blocking, f64
// reductions): 1e-5 relative. Under autocast both sides round the same
// inputs to the low type and accumulate in f32, but a result near a rounding
// boundary can land one low-type ulp apart: 2^-10 (f16), 2^-7 (bf16) relative.
double tolerance(std::optional<DType> autocast) {
  if (!autocast) return 1e-5;
  return *autocast == DType::f16 ? 1.0 / 1024 : 1.0 / 128;
}

void compare_model(const std::function<std::unique_ptr<Module>()>& make, const core::Shape& input,
                   std::optional<DType> autocast) {
  auto cpu_model = make(), gpu_model = make();
  initialize(*cpu_model, 17);
  initialize(*gpu_model, 17);
  ParameterStore cpu_store(*cpu_model, core::Device::cpu());
  ParameterStore gpu_store(*gpu_model, kGpu);
  core::Stream stream = core::Stream::create(kGpu);
  Context cpu_ctx, gpu_ctx;
  cpu_ctx.autocast = gpu_ctx.autocast = autocast;
  cpu_ctx.seed = gpu_ctx.seed = 3;
  gpu_ctx.stream = stream;
  const core::Tensor x = test::random_f32(input, 5);
  const core::Tensor y_cpu = cpu_model->forward(x, cpu_ctx);
  const core::Tensor y_gpu = gpu_model->forward(x.to(kGpu, stream), gpu_ctx);
  const double tol = tolerance(autocast);
  require_close(y_gpu, y_cpu, tol, tol, cpu_model->describe() + " forward", stream);
  const core::Tensor dy = test::random_f32(y_cpu.shape(), 6);
  const core::Tensor dx_cpu = cpu_model->backward(dy, cpu_ctx);
  const core::Tensor dx_gpu = gpu_model->backward(dy.to(kGpu, stream), gpu_ctx);
  stream.synchronize();
  if (dx_cpu.defined()) require_close(dx_gpu, dx_cpu, tol, tol, "dx");
  // Weight gradients sum over the batch: allow the tolerance per term.
  require_close(gpu_store.grads(), cpu_store.grads(), tol * input[0], tol, "flat gradients");
}

}  // namespace

TEST_CASE("cuda Linear, GELU, LayerNorm and Dropout match the cpu", "[gpu][engine]") {
  auto mlp = [] {
    auto net = std::make_unique<Sequential>();
    net->emplace<Linear>("fc1", 37, 64);
    net->emplace<GELU>("act1", true);
    net->emplace<LayerNorm>("norm", 64);
    net->emplace<Dropout>("drop", 0.25f);
    net->emplace<Linear>("fc2", 64, 33);
    net->emplace<ReLU>("act2");
    net->emplace<Linear>("fc3", 33, 10);
    return net;
  };
  for (std::optional<DType> autocast :
       {std::optional<DType>{}, std::optional{DType::f16}, std::optional{DType::bf16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    compare_model(mlp, {19, 37}, autocast);
  }
}

TEST_CASE("cuda causal self-attention matches the cpu", "[gpu][engine]") {
  // Strided-batched cuBLASLt GEMMs and the warp-per-row masked softmax
  // against the CPU reference, with dropout on, in f32 and under autocast.
  for (std::optional<DType> autocast :
       {std::optional<DType>{}, std::optional{DType::f16}, std::optional{DType::bf16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    compare_model([] { return std::make_unique<CausalSelfAttention>(32, 4, 0.1f); }, {3, 45, 32},
                  autocast);
  }
}

TEST_CASE("cuda GPT (tied head, attention, the loss over B x T) matches the cpu", "[gpu][engine]") {
  const GptConfig config{.layers = 2, .heads = 4, .embed_dim = 32, .block_size = 24, .vocab = 50};
  GPT cpu_model(config), gpu_model(config);
  initialize(cpu_model, 3);
  initialize(gpu_model, 3);
  ParameterStore cpu_store(cpu_model, core::Device::cpu()), gpu_store(gpu_model, kGpu);
  std::vector<std::int32_t> t(3 * 20), y(3 * 20);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = (i * 7) % 50, y[i] = (i * 11 + 3) % 50;
  const core::Tensor tokens = core::Tensor::from_vector(t, {3, 20}, DType::i32);
  const core::Tensor targets = core::Tensor::from_vector(y, {3, 20}, DType::i32);
  for (std::optional<DType> autocast :
       {std::optional<DType>{}, std::optional{DType::f16}, std::optional{DType::bf16}}) {
    INFO("autocast " << (autocast ? dtype_name(*autocast) : "off"));
    cpu_store.zero_grad();
    gpu_store.zero_grad();
    Context cpu_ctx, gpu_ctx;
    cpu_ctx.autocast = gpu_ctx.autocast = autocast;
    CrossEntropyLoss cpu_loss, gpu_loss;
    const double tol = tolerance(autocast);
    require_close(
        gpu_loss.forward(gpu_model.forward(tokens.to(kGpu), gpu_ctx), targets.to(kGpu), gpu_ctx),
        cpu_loss.forward(cpu_model.forward(tokens, cpu_ctx), targets, cpu_ctx), tol, tol, "loss");
    cpu_model.backward(cpu_loss.backward(1.0f, cpu_ctx), cpu_ctx);
    gpu_model.backward(gpu_loss.backward(1.0f, gpu_ctx), gpu_ctx);
    // Gradients sum over 60 positions: the tolerance per term, as compare_model.
    require_close(gpu_store.grads(), cpu_store.grads(), tol * 60, tol, "flat gradients");
  }
}

TEST_CASE("cuda Residual and Embedding match the cpu", "[gpu][engine]") {
  compare_model(
      [] {
        auto inner = std::make_unique<Sequential>();
        inner->emplace<Linear>("fc1", 16, 16);
        inner->emplace<ReLU>("act");
        inner->emplace<Linear>("fc2", 16, 16);
        return std::make_unique<Residual>(std::move(inner), nullptr, "downsample", true);
      },
      {9, 16}, std::nullopt);
  Embedding cpu_emb(50, 8), gpu_emb(50, 8);
  initialize(cpu_emb, 1);
  initialize(gpu_emb, 1);
  ParameterStore cpu_store(cpu_emb, core::Device::cpu()), gpu_store(gpu_emb, kGpu);
  const core::Tensor idx =
      core::Tensor::from_vector<std::int64_t>({3, 49, 0, 3, 7, 3}, {2, 3}, DType::i64);
  Context ctx;
  require_close(gpu_emb.forward(idx.to(kGpu), ctx), cpu_emb.forward(idx, ctx), 0, 0, "embedding");
  const core::Tensor dy = test::random_f32({2, 3, 8}, 2);
  cpu_emb.backward(dy, ctx);
  gpu_emb.backward(dy.to(kGpu), ctx);
  // The same f32 additions in the same order on both (Note [embedding gradient order]).
  require_close(gpu_store.grads(), cpu_store.grads(), 0, 0, "embedding gradient");
}

TEST_CASE("cuda Embedding reports an index outside the vocabulary as the cpu does",
          "[gpu][engine]") {
  Embedding cpu_emb(50, 8), gpu_emb(50, 8);
  initialize(cpu_emb, 1);
  initialize(gpu_emb, 1);
  ParameterStore cpu_store(cpu_emb, core::Device::cpu()), gpu_store(gpu_emb, kGpu);
  core::Stream stream = core::Stream::create(kGpu);
  Context cpu_ctx, gpu_ctx;
  gpu_ctx.stream = stream;
  for (DType type : {DType::i64, DType::i32}) {
    INFO(dtype_name(type));
    // Positions 1 (index 50) and 3 (-2): both report position 1, as the CPU loop meets it first.
    const core::Tensor idx =
        core::Tensor::from_vector<std::int64_t>({3, 50, 0, -2, 49}, {5}, DType::i64).cast(type);
    std::string cpu_message, gpu_message;
    try {
      cpu_emb.forward(idx, cpu_ctx);
    } catch (const InvalidArgument& e) {
      cpu_message = e.what();
    }
    try {
      gpu_emb.forward(idx.to(kGpu, stream), gpu_ctx);
    } catch (const InvalidArgument& e) {
      gpu_message = e.what();
    }
    REQUIRE(cpu_message.find("index 50 at position 1") != std::string::npos);
    CHECK(gpu_message == cpu_message);
    // A valid batch afterwards still works: nothing is left behind on the stream.
    const core::Tensor ok = core::Tensor::from_vector<std::int64_t>({1, 2}, {2}, DType::i64);
    require_close(gpu_emb.forward(ok.to(kGpu, stream), gpu_ctx), cpu_emb.forward(ok, cpu_ctx), 0, 0,
                  "embedding after an error", stream);
  }
}

TEST_CASE("cuda losses and accuracy match the cpu", "[gpu][engine]") {
  const core::Tensor logits = test::random_f32({67, 10}, 4, 4.0f);
  std::vector<std::int64_t> y(67);
  for (int i = 0; i < 67; ++i) y[i] = i % 7 == 0 ? -100 : (i * 3) % 10;
  const core::Tensor labels = core::Tensor::from_vector(y, {67}, DType::i64);
  Context ctx;
  CrossEntropyLoss cpu_loss, gpu_loss;
  require_close(gpu_loss.forward(logits.to(kGpu), labels.to(kGpu), ctx),
                cpu_loss.forward(logits, labels, ctx), 1e-6, 1e-5, "cross-entropy");
  require_close(gpu_loss.backward(0.5f, ctx), cpu_loss.backward(0.5f, ctx), 1e-7, 1e-5,
                "cross-entropy gradient");
  require_close(count_correct(logits.to(kGpu), labels.to(kGpu), {}),
                count_correct(logits, labels, {}), 0, 0, "count_correct");
  CrossEntropyLoss cpu_smooth(-100, 0.1f), gpu_smooth(-100, 0.1f);
  require_close(gpu_smooth.forward(logits.to(kGpu), labels.to(kGpu), ctx),
                cpu_smooth.forward(logits, labels, ctx), 1e-6, 1e-5, "smoothed cross-entropy");
  require_close(gpu_smooth.backward(0.5f, ctx), cpu_smooth.backward(0.5f, ctx), 1e-7, 1e-5,
                "smoothed cross-entropy gradient");
  // The elementwise losses: the same f32 formula per element
  // (kernels/detail/elementwise_loss_math.h), summed in f64 in another order;
  // 67 x 10 elements span several of the CUDA forward's blocks only when the
  // grid does, so a second size of 70,000 elements crosses blocks for sure.
  for (const std::int64_t rows : {67, 7000}) {
    const core::Tensor prediction = test::random_f32({rows, 10}, 4, 4.0f);
    core::Tensor target = test::random_f32({rows, 10}, 8);
    for (const std::string kind : {"mse", "l1", "huber", "bce"}) {
      INFO(kind << ", " << rows << " rows");
      core::Tensor t = target;
      if (kind == "bce") {  // targets in [0, 1]
        t = target.cast(DType::f32);
        for (float& v : std::span(t.data_as<float>(), t.numel())) v = 0.5f * (v + 1.0f);
      }
      std::unique_ptr<Loss> cpu_loss = make_loss(kind), gpu_loss = make_loss(kind);
      require_close(gpu_loss->forward(prediction.to(kGpu), t.to(kGpu), ctx),
                    cpu_loss->forward(prediction, t, ctx), 1e-6, 1e-6, kind.c_str());
      require_close(gpu_loss->backward(1.0f, ctx), cpu_loss->backward(1.0f, ctx), 1e-7, 1e-6,
                    (kind + " gradient").c_str());
    }
  }
}
