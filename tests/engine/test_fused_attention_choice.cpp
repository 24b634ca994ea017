// The fused attention's host logic, which needs no GPU: which rules refuse
// cuDNN's path before cuDNN is asked (Note [fused attention], engine/nn/
// attention.cpp; kernels::sdpa_shape_refusal), and the plan cache's keys
// (kernels/sdpa.h): one per shape, type, pass and backward determinism.
// The path itself is tests/engine/gpu/test_sdpa_gpu.cpp's.
#include <catch2/catch.hpp>

#include <set>

#include "engine/nn/attention.h"
#include "kernels/sdpa.h"

using namespace lockstep;
using namespace lockstep::engine;
using kernels::SdpaPass;
using kernels::SdpaShape;

namespace {
const core::Device kGpu = core::Device::cuda(0);
const SdpaShape kGpt2{8, 12, 1024, 64, DType::bf16};
}  // namespace

TEST_CASE("the fused attention is refused off CUDA, in f32 and with attention dropout",
          "[engine][attention]") {
  CHECK(fused_attention_refusal(core::Device::cpu(), false, kGpt2) == "not on CUDA");
  SdpaShape f32 = kGpt2;
  f32.type = DType::f32;
  CHECK(fused_attention_refusal(kGpu, false, f32).find("compute type f32") == 0);
  CHECK(fused_attention_refusal(kGpu, true, kGpt2) == "attention dropout is active");
  // gpt2 under bf16 or f16 autocast: only cuDNN's check remains, where the
  // frontend was built.
  SdpaShape f16 = kGpt2;
  f16.type = DType::f16;
  if (kernels::sdpa_built()) {
    CHECK(fused_attention_refusal(kGpu, false, kGpt2).empty());
    CHECK(fused_attention_refusal(kGpu, false, f16).empty());
    CHECK(kernels::sdpa_frontend_version() == "1.32.0");
  } else {
    CHECK(fused_attention_refusal(kGpu, false, kGpt2).find("without cudnn-frontend") !=
          std::string::npos);
    CHECK(kernels::sdpa_frontend_version().empty());
  }
}

TEST_CASE("the fused attention's host rules refuse head sizes cuDNN cannot load",
          "[engine][attention]") {
  // D a multiple of 8 (16-byte rows of bf16/f16) up to 128; odd T and H are fine.
  for (std::int64_t d : {8, 64, 72, 128})
    CHECK(kernels::sdpa_shape_refusal({2, 3, 67, d, DType::f16}).empty());
  for (std::int64_t d : {4, 60, 65, 136, 256})
    CHECK(kernels::sdpa_shape_refusal({2, 3, 67, d, DType::bf16}).find("head size D") == 0);
  CHECK(kernels::sdpa_shape_refusal({0, 3, 67, 64, DType::bf16}).find("sizes") == 0);
  CHECK(kernels::sdpa_shape_refusal({2, 3, 67, 64, DType::f32}).find("type f32") == 0);
}

TEST_CASE("the sdpa plan cache keys every shape, type, pass and backward determinism apart",
          "[engine][attention]") {
  std::set<kernels::SdpaPlanKey> keys;
  for (int device : {0, 1})
    for (SdpaPass pass : {SdpaPass::forward, SdpaPass::backward})
      for (bool deterministic : {false, true})
        for (DType type : {DType::bf16, DType::f16})
          for (std::int64_t seq : {67, 1024}) {
            SdpaShape s = kGpt2;
            s.type = type;
            s.seq = seq;
            keys.insert(kernels::sdpa_plan_key(device, s, pass, deterministic));
          }
  // The forward has no atomics to order: its deterministic key is its other
  // key, so 2 devices x (forward 1 + backward 2) x 2 types x 2 lengths.
  CHECK(keys.size() == 2 * 3 * 2 * 2);
  CHECK(kernels::sdpa_plan_key(0, kGpt2, SdpaPass::forward, true) ==
        kernels::sdpa_plan_key(0, kGpt2, SdpaPass::forward, false));
  CHECK(kernels::sdpa_plan_key(0, kGpt2, SdpaPass::backward, true).str() ==
        "cuda:0 backward bf16 B 8 H 12 T 1024 D 64 deterministic");
  CHECK(kernels::sdpa_plan_key(1, kGpt2, SdpaPass::forward, false).str() ==
        "cuda:1 forward bf16 B 8 H 12 T 1024 D 64");
}

TEST_CASE("the sdpa graphs pass cudnn-frontend's validation for Hopper and Ampere without a GPU",
          "[engine][attention]") {
  if (!kernels::sdpa_built()) {
    CHECK(!kernels::cuda::sdpa_graph_check(kGpt2, SdpaPass::forward, false, 90).empty());
    return;
  }
  // gpt2's, an odd length (not a multiple of cuDNN's 64-row tiles) in f16,
  // and the largest head the host rules let through.
  const SdpaShape shapes[] = {kGpt2, {2, 3, 67, 32, DType::f16}, {1, 2, 16, 128, DType::bf16}};
  for (int sm : {80, 90})
    for (const SdpaShape& s : shapes)
      for (SdpaPass pass : {SdpaPass::forward, SdpaPass::backward})
        for (bool deterministic : {false, true}) {
          INFO("sm_" << sm << " " << kernels::sdpa_plan_key(0, s, pass, deterministic).str());
          CHECK(kernels::cuda::sdpa_graph_check(s, pass, deterministic, sm) == "");
        }
  // The check can refuse: cuDNN has no backward at T = 1 (the forward keeps
  // for backward, so choose_fused takes the unfused path there).
  const SdpaShape one{1, 1, 1, 64, DType::bf16};
  CHECK(kernels::cuda::sdpa_graph_check(one, SdpaPass::forward, false, 90) == "");
  CHECK(!kernels::cuda::sdpa_graph_check(one, SdpaPass::backward, false, 90).empty());
  // And the host rules come first.
  CHECK(
      kernels::cuda::sdpa_graph_check({1, 1, 16, 12, DType::bf16}, SdpaPass::forward, false, 90) ==
      kernels::sdpa_shape_refusal({1, 1, 16, 12, DType::bf16}));
}
