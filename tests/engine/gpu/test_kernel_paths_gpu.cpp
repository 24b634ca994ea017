// Which fused paths ran (Note [kernel paths]) on CUDA: one bf16 step of
// gpt-tiny names cuDNN's attention (where built), the fused cross-entropy,
// the fused GPT blocks and the optimizer's weight copies; a resnet step the
// fused BatchNorm and its block end; with the fusion switch off (Note [one
// fusion switch]) each family names its fallback and no GEMM epilogue runs
// fused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/data_parallel_step.h"
#include "engine/kernel_paths.h"
#include "engine/models.h"
#include "engine/optim/adamw.h"
#include "kernels/fusion.h"
#include "kernels/gemm.h"
#include "kernels/sdpa.h"
#include "support/world_of_one.h"

using namespace lockstep;
using namespace lockstep::engine;

namespace {

const core::Device kGpu = core::Device::cuda(0);

const KernelFamily* family(const KernelPaths& paths, const std::string& name) {
  for (const KernelFamily& f : paths.families)
    if (f.family == name) return &f;
  return nullptr;
}

std::vector<std::string> path_names(const KernelFamily* f) {
  std::vector<std::string> names;
  if (f)
    for (const auto& entry : f->paths) names.push_back(entry.first);
  return names;
}

// One bf16 AdamW step of `name` (at `width_divisor`) on a batch of 2, then
// what ran.
KernelPaths one_step(const std::string& name, std::int64_t width_divisor) {
  reset_kernel_paths();
  kernels::cuda::reset_gemm_epilogue_counts();
  comm::World& world = test::gpu_world_of_one();
  core::Stream stream = core::Stream::create(kGpu);
  std::unique_ptr<Module> model = make_model(name, ModelOptions{.width_divisor = width_divisor});
  initialize(*model, 5);
  const ModelPreset& preset = model_preset(name);
  ParameterStore store(*model, kGpu, stream);
  AdamW adamw(store, single_group(store, 1e-3, 0.0), AdamwOptions{}, stream);
  LossScaler scaler = LossScaler::for_autocast(DType::bf16);
  StepOptions o;
  o.autocast = DType::bf16;
  DataParallelStep step(*model, store, adamw, make_scheduler("constant", {}), scaler, &world, o,
                        stream);
  core::Shape shape{2};
  shape.insert(shape.end(), preset.sample_shape.begin(), preset.sample_shape.end());
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  core::Tensor x, y;
  if (preset.language_model) {
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<std::int64_t>((i * 7) % preset.classes);
    x = y = core::Tensor::from_vector(tokens, shape, DType::i64, kGpu, stream);
  } else {
    std::vector<float> pixels(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::sin(0.1f * i);
    x = core::Tensor::from_vector(pixels, shape, DType::f32, kGpu, stream);
    y = core::Tensor::from_vector(std::vector<std::int64_t>{1, 3}, {2}, DType::i64, kGpu, stream);
  }
  const MicroBatch batch{x, y};
  REQUIRE_FALSE(step.run({&batch, 1}).skipped);
  stream.synchronize();
  KernelPaths paths = collect_kernel_paths(kGpu, &adamw, DType::bf16);
  for (const std::string& line : paths.lines()) UNSCOPED_INFO(line);
  return paths;
}

struct FusionOff {
  FusionOff() { kernels::set_fused_kernels(false); }
  ~FusionOff() { kernels::set_fused_kernels(true); }
};

}  // namespace

TEST_CASE("kernel paths: a bf16 gpt-tiny step names its fused paths, and their fallbacks when off",
          "[gpu][engine][kernel_paths]") {
  {
    const KernelPaths paths = one_step("gpt-tiny", 1);
    CHECK_FALSE(paths.cpu);
    const KernelFamily* attention = family(paths, "attention");
    REQUIRE(attention);
    if (kernels::sdpa_built())
      CHECK(path_names(attention) == std::vector<std::string>{"cudnn sdpa"});
    // The logits are the step's alone (Note [gradient in the forward]).
    CHECK(path_names(family(paths, "cross-entropy")) == std::vector<std::string>{"fused in place"});
    CHECK(path_names(family(paths, "gpt block")) ==
          std::vector<std::string>{"fused add+layernorm"});
    CHECK(path_names(family(paths, "weight copies")) ==
          std::vector<std::string>{"bf16 by the optimizer"});
    CHECK(family(paths, "batchnorm") == nullptr);  // never ran: left out
  }
  {
    const FusionOff off;
    const KernelPaths paths = one_step("gpt-tiny", 1);
    const KernelFamily* attention = family(paths, "attention");
    REQUIRE(attention);
    CHECK(path_names(attention) == std::vector<std::string>{"unfused"});
    CHECK(attention->why == "turned off (kernels::set_fused_kernels)");
    const KernelFamily* xent = family(paths, "cross-entropy");
    REQUIRE(xent);
    CHECK(path_names(xent) == std::vector<std::string>{"f32"});
    CHECK(xent->why == "turned off (kernels::set_fused_kernels)");
    CHECK(path_names(family(paths, "gpt block")) == std::vector<std::string>{"unfused"});
    for (const KernelFamily& f : paths.families)
      if (f.family.rfind("gemm ", 0) == 0) {
        INFO(f.family);
        CHECK(path_names(&f) == std::vector<std::string>{"fallback"});
      }
  }
}

TEST_CASE("kernel paths: a bf16 resnet step names the fused batchnorm and its block end",
          "[gpu][engine][kernel_paths]") {
  {
    const KernelPaths paths = one_step("resnet", 16);
    std::vector<std::string> bn = path_names(family(paths, "batchnorm"));
    std::sort(bn.begin(), bn.end());
    CHECK(bn == std::vector<std::string>{"fused", "fused add+relu"});
    CHECK(family(paths, "attention") == nullptr);
  }
  {
    const FusionOff off;
    const KernelPaths paths = one_step("resnet", 16);
    const KernelFamily* bn = family(paths, "batchnorm");
    REQUIRE(bn);
    CHECK(path_names(bn) == std::vector<std::string>{"cudnn"});
    CHECK(bn->why == "turned off");
  }
}
