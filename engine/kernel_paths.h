// Which of lockstep's fused CUDA paths ran in this process, family by family
// (Note [kernel paths]): the layers that choose a fused path tell one
// process-wide registry which path they took, and collect_kernel_paths adds
// what the GEMM and the optimizer keep themselves, as lines for a run header
// and as JSON for a metrics record (lockstep-train prints them after its first
// step, bench_step beside its figures).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/json.h"
#include "kernels/dtype.h"

namespace lockstep::engine {

class Optimizer;

// Note [kernel paths]: the places that choose between a fused CUDA path and
// its fallback call note_kernel_path each time they choose, on CUDA only (the
// CPU runs the unfused ops whatever kernels::set_fused_kernels says):
// - "attention": CausalSelfAttention::choose_fused, "cudnn sdpa" or "unfused"
//   with the refusal (Note [fused attention]);
// - "cross-entropy": a training forward (a backward announced), "fused in
//   place", "fused" or "f32" with why (Note [cross-entropy paths]);
// - "gpt block": GptBlock's forward, "fused add+layernorm" or "unfused" (Note
//   [fused block]);
// - "batchnorm": BatchNorm2d's forward, "fused", "fused add+relu" (Residual's
//   block end) or "cudnn" with why (Note [batchnorm paths]).
// One registry, a mutex over a few entries (family, path, count, the last
// fallback's reason): a call per layer call, not per element, so a gpt2 step
// pays about 50 uncontended locks. The two families that keep their own
// record are read when asked: the cuBLASLt epilogues' counts
// (kernels::cuda::gemm_epilogue_counts, Note [epilogue fallback]) and the
// optimizer's weight copies (Optimizer::fused_weight_copy, Note [fused weight
// copy]). Families that never ran are left out; a CPU run is "cpu: unfused
// ops" and nothing else.
void note_kernel_path(std::string_view family, std::string_view path, std::string_view why = {});
// Forgets what note_kernel_path recorded (tests; the GEMM keeps its own
// counts, kernels::cuda::reset_gemm_epilogue_counts).
void reset_kernel_paths();

struct KernelFamily {
  std::string family;  // "attention", "gemm bias_gelu_aux", "weight copies"
  // Each path the family took and how often, in the order first taken; a
  // count of 0 is a state rather than a count (the optimizer's weight copies).
  std::vector<std::pair<std::string, std::int64_t>> paths;
  std::string why;  // the last fallback's reason; "" when none fell back
};

struct KernelPaths {
  bool cpu = false;  // a CPU run: nothing to say but "cpu: unfused ops"
  std::vector<KernelFamily> families;

  // One line per family: "attention: cudnn sdpa x24", "gemm bias_gelu_aux:
  // fused x12, fallback x12 (last: no algorithm)", or {"cpu: unfused ops"}.
  std::vector<std::string> lines() const;
  // The same under the run header's style: "  kernels      attention: ...",
  // then the other lines indented beneath.
  std::vector<std::string> header_lines() const;
  // {"attention": {"cudnn sdpa": 24}, "gemm bias": {"fused": 10, "fallback":
  // 2, "why": "no algorithm"}, ...}, or {"cpu": "unfused ops"}.
  core::Json json() const;
};

// What ran so far in this process on `device`: the registry's families, the
// GEMM epilogues (CUDA builds), and with an optimizer its weight copies
// ("bf16 by the optimizer", or under f16/bf16 `autocast` "cast by the
// modules" with why). Cheap: call it after the first optimizer step.
KernelPaths collect_kernel_paths(core::Device device, const Optimizer* optimizer = nullptr,
                                 std::optional<DType> autocast = std::nullopt);

}  // namespace lockstep::engine
