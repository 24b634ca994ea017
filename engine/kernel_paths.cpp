// The registry of fused CUDA paths taken (engine/kernel_paths.h): Note [kernel paths].
#include "engine/kernel_paths.h"

#include <algorithm>
#include <mutex>

#include "engine/optim/optimizer.h"
#include "kernels/gemm.h"

namespace lockstep::engine {
namespace {

std::mutex registry_mutex;
std::vector<KernelFamily>& registry() {
  static std::vector<KernelFamily> families;  // guarded by registry_mutex
  return families;
}

}  // namespace

void note_kernel_path(std::string_view family, std::string_view path, std::string_view why) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::vector<KernelFamily>& families = registry();
  auto f = std::find_if(families.begin(), families.end(),
                        [&](const KernelFamily& k) { return k.family == family; });
  if (f == families.end()) {
    families.push_back({std::string(family), {}, {}});
    f = families.end() - 1;
  }
  auto p = std::find_if(f->paths.begin(), f->paths.end(),
                        [&](const auto& entry) { return entry.first == path; });
  if (p == f->paths.end())
    f->paths.emplace_back(std::string(path), 1);
  else
    ++p->second;
  if (!why.empty() && f->why != why) f->why = std::string(why);
}

void reset_kernel_paths() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().clear();
}

std::vector<std::string> KernelPaths::lines() const {
  if (cpu) return {"cpu: unfused ops"};
  std::vector<std::string> out;
  for (const KernelFamily& f : families) {
    std::string line = f.family + ":";
    for (std::size_t i = 0; i < f.paths.size(); ++i) {
      line += (i == 0 ? " " : ", ") + f.paths[i].first;
      if (f.paths[i].second > 0) line += " x" + std::to_string(f.paths[i].second);
    }
    if (!f.why.empty()) line += " (" + f.why + ")";
    out.push_back(std::move(line));
  }
  return out;
}

std::vector<std::string> KernelPaths::header_lines() const {
  std::vector<std::string> out;
  for (const std::string& line : lines())
    out.push_back((out.empty() ? "  kernels      " : "               ") + line);
  return out;
}

core::Json KernelPaths::json() const {
  core::Json out = core::Json::object();
  if (cpu) return out.set("cpu", "unfused ops");
  for (const KernelFamily& f : families) {
    core::Json family = core::Json::object();
    for (const auto& [path, count] : f.paths)
      family.set(path, count > 0 ? core::Json(count) : core::Json(true));
    if (!f.why.empty()) family.set("why", f.why);
    out.set(f.family, std::move(family));
  }
  return out;
}

KernelPaths collect_kernel_paths(core::Device device, const Optimizer* optimizer,
                                 std::optional<DType> autocast) {
  KernelPaths out;
  if (!device.is_cuda()) {
    out.cpu = true;
    return out;
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    out.families = registry();
  }
#if LOCKSTEP_WITH_CUDA
  // Note [epilogue fallback]: indexed by GemmEpilogue, none's entry empty.
  const std::vector<kernels::cuda::GemmEpilogueCounts> counts =
      kernels::cuda::gemm_epilogue_counts();
  for (std::size_t e = 0; e < counts.size(); ++e) {
    const kernels::cuda::GemmEpilogueCounts& c = counts[e];
    if (c.fused == 0 && c.fallback == 0) continue;
    KernelFamily f{
        std::string("gemm ") + kernels::gemm_epilogue_name(static_cast<kernels::GemmEpilogue>(e)),
        {},
        c.fallback > 0 ? "last: " + c.last_fallback_reason : std::string()};
    if (c.fused > 0) f.paths.emplace_back("fused", c.fused);
    if (c.fallback > 0) f.paths.emplace_back("fallback", c.fallback);
    out.families.push_back(std::move(f));
  }
#endif
  // Note [fused weight copy]: the optimizer's step writes the copies, or the
  // modules cast the f32 weights at each forward.
  if (optimizer) {
    if (const std::optional<DType> copy = optimizer->fused_weight_copy())
      out.families.push_back(
          {"weight copies", {{std::string(dtype_name(*copy)) + " by the optimizer", 0}}, {}});
    else if (autocast && (*autocast == DType::bf16 || *autocast == DType::f16))
      out.families.push_back(
          {"weight copies",
           {{"cast by the modules", 0}},
           "the optimizer wrote none: sharded (ZeRO), or the modules asked for different types"});
  }
  return out;
}

}  // namespace lockstep::engine
