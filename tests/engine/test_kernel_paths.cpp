// Which fused paths ran (Note [kernel paths]): the registry's lines and JSON,
// a CPU step that records nothing and says "cpu: unfused ops"; and the
// loss's announced backward withdrawn when the step throws before the loss's
// forward takes it (Note [announcement scope]).
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/data_parallel_step.h"
#include "engine/kernel_paths.h"
#include "engine/models.h"
#include "engine/nn/loss.h"
#include "engine/optim/sgd.h"
#include "support/gradcheck.h"
#include "support/two_heads.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {
const core::Device kCuda = core::Device::cuda(0);  // named only: nothing runs there
}

TEST_CASE("kernel paths: each family's paths with counts and the last fallback's reason",
          "[engine][kernel_paths]") {
  reset_kernel_paths();
  note_kernel_path("attention", "cudnn sdpa");
  note_kernel_path("attention", "cudnn sdpa");
  note_kernel_path("cross-entropy", "fused in place");
  note_kernel_path("attention", "unfused", "attention dropout is active");
  const KernelPaths paths = collect_kernel_paths(kCuda);
  const std::vector<std::string> expected{
      "attention: cudnn sdpa x2, unfused x1 (attention dropout is active)",
      "cross-entropy: fused in place x1"};
  CHECK(paths.lines() == expected);
  CHECK(paths.header_lines() ==
        std::vector<std::string>{"  kernels      " + expected[0], "               " + expected[1]});
  CHECK(paths.json().dump() ==
        R"({"attention": {"cudnn sdpa": 2, "unfused": 1, "why": "attention dropout is active"}, )"
        R"("cross-entropy": {"fused in place": 1}})");
  reset_kernel_paths();
  CHECK(collect_kernel_paths(kCuda).lines().empty());  // families that never ran are left out
}

TEST_CASE("kernel paths: a CPU step records nothing and says cpu: unfused ops",
          "[engine][kernel_paths]") {
  reset_kernel_paths();
  // gpt-tiny at a 16th of its width: attention, GPT blocks, cross-entropy,
  // under bf16 autocast, where CUDA would fuse each.
  std::unique_ptr<Module> model = make_model("gpt-tiny", ModelOptions{.width_divisor = 16});
  initialize(*model, 3);
  ParameterStore store(*model, core::Device::cpu());
  SGD sgd(store, single_group(store, 0.01, 0.0));
  LossScaler scaler = LossScaler::for_autocast(DType::bf16);
  StepOptions o;
  o.autocast = DType::bf16;
  DataParallelStep step(*model, store, sgd, make_scheduler("constant", {}), scaler, nullptr, o, {});
  std::vector<std::int64_t> tokens(2 * 128);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int64_t>(i % 256);
  const core::Tensor x = core::Tensor::from_vector(tokens, {2, 128}, DType::i64);
  const MicroBatch batch{x, x};
  REQUIRE_FALSE(step.run({&batch, 1}).skipped);
  CHECK(collect_kernel_paths(kCuda).families.empty());  // the registry heard nothing
  const KernelPaths cpu = collect_kernel_paths(core::Device::cpu(), &sgd, DType::bf16);
  CHECK(cpu.lines() == std::vector<std::string>{"cpu: unfused ops"});
  CHECK(cpu.header_lines() == std::vector<std::string>{"  kernels      cpu: unfused ops"});
  CHECK(cpu.json().dump() == R"({"cpu": "unfused ops"})");
}

TEST_CASE("the announced backward is withdrawn when the step throws before the loss's forward",
          "[engine][loss]") {
  // Note [announcement scope]: the first term refuses the batch (it lacks
  // "absent"), so the cross-entropy term's forward never runs. Before the
  // fix its announcement stayed pending, and the next forward (an
  // evaluation's) would have taken the fused path on CUDA.
  test::TwoHeads m(5, 8, 3);
  m.set_input_grad(false);
  initialize(m, 6);
  ParameterStore store(m, core::Device::cpu());
  SGD sgd(store, single_group(store, 0.1, 0.0));
  LossScaler scaler = LossScaler::for_autocast(std::nullopt);
  auto ce = std::make_shared<CrossEntropyLoss>();
  StepOptions o;
  o.loss = std::make_shared<WeightedLosses>(std::vector<WeightedLosses::Term>{
      {std::make_shared<MSELoss>(), "value", "absent", 0.5f}, {ce, "logits", "targets", 1.0f}});
  DataParallelStep step(m, store, sgd, make_scheduler("constant", {}), scaler, nullptr, o, {});
  const std::int64_t rows = 4;
  const MicroBatch batch{
      test::random_f32({rows, 5}, 11),
      core::Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 0}, {rows}, DType::i64)};
  CHECK_THROWS_WITH(step.run({&batch, 1}), Catch::Contains("absent"));
  CHECK_FALSE(ce->backward_expected());

  // The guard alone: a forward that took the announcement leaves nothing to
  // withdraw, and one that never ran has it withdrawn.
  CrossEntropyLoss alone;
  {
    const ExpectedBackward announced(alone, 0.5f);
    CHECK(alone.backward_expected());
  }
  CHECK_FALSE(alone.backward_expected());
}
