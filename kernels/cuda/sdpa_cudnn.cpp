// cuDNN's fused causal attention (kernels/sdpa.h) through cudnn-frontend's
// graph API: one forward graph (O and Stats) and one backward graph (dQ, dK,
// dV) per shape, built once, checked, and cached with their workspace sizes
// or the reason cuDNN refused them.
//
// Note [one frontend translation unit]: cudnn-frontend is header-only and
// heavy (90 headers, nlohmann/json; this file takes minutes and 2.3 GB to
// compile), so this is the only file that includes it, as host C++ (C++20,
// Note [CUDA language level]) and as a SYSTEM include (its warnings are not
// ours). Nothing else sees a frontend type: kernels/sdpa.h speaks in
// pointers and SdpaShape. Without the frontend (cmake/FindCudnnFrontend.cmake)
// this file is not compiled and kernels/sdpa.cpp answers "not built".
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cudnn_handle.h"
#include "kernels/error.h"
#include "kernels/sdpa.h"

namespace lockstep::kernels::cuda {
namespace {

namespace fe = cudnn_frontend;
using TensorRef = std::shared_ptr<fe::graph::Tensor_attributes>;

// The variant pack's names for the graphs' tensors.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Plan {
  std::string key;                          // SdpaPlanKey::str()
  std::shared_ptr<fe::graph::Graph> graph;  // null when refused
  std::int64_t workspace_bytes = 0;
  std::string refusal;  // why cuDNN cannot run it; empty when built
};

fe::DataType_t io_type(DType t) {
  return t == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// Note [sdpa layouts] in kernels/sdpa.h.
std::vector<std::int64_t> head_dims(const SdpaShape& s) {
  return {s.batch, s.heads, s.seq, s.head_dim};
}
std::vector<std::int64_t> qkv_strides(const SdpaShape& s) {
  const std::int64_t c = s.width();
  return {3 * s.seq * c, s.head_dim, 3 * c, 1};
}
std::vector<std::int64_t> row_strides(const SdpaShape& s) {
  const std::int64_t c = s.width();
  return {s.seq * c, s.head_dim, c, 1};
}
std::vector<std::int64_t> stats_dims(const SdpaShape& s) { return {s.batch, s.heads, s.seq, 1}; }
std::vector<std::int64_t> stats_strides(const SdpaShape& s) {
  return {s.heads * s.seq, s.seq, 1, 1};
}

float attn_scale(const SdpaShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }

TensorRef input(fe::graph::Graph& g, const char* name, Uid uid, std::vector<std::int64_t> dims,
                std::vector<std::int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dims))
                      .set_stride(std::move(strides)));
}

// A graph for `s`: the autocast type in and out, f32 inside. sm_version > 0
// sets the target architecture (sdpa_graph_check) before the nodes copy the
// graph's context; 0 reads it from the current device.
std::shared_ptr<fe::graph::Graph> new_graph(const SdpaShape& s, int sm_version) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0) g->set_sm_version(sm_version);
  g->set_io_data_type(io_type(s.type))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const SdpaShape& s, int sm_version = 0) {
  auto g = new_graph(s, sm_version);
  const TensorRef q = input(*g, "Q", kQ, head_dims(s), qkv_strides(s));
  const TensorRef k = input(*g, "K", kK, head_dims(s), qkv_strides(s));
  const TensorRef v = input(*g, "V", kV, head_dims(s), qkv_strides(s));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("lockstep_sdpa")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(attn_scale(s));
  auto [o, stats] = g->sdpa(q, k, v, options);
  o->set_output(true).set_uid(kO).set_dim(head_dims(s)).set_stride(row_strides(s));
  stats->set_output(true)
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(s))
      .set_stride(stats_strides(s));
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const SdpaShape& s, bool deterministic,
                                                 int sm_version = 0) {
  auto g = new_graph(s, sm_version);
  const TensorRef q = input(*g, "Q", kQ, head_dims(s), qkv_strides(s));
  const TensorRef k = input(*g, "K", kK, head_dims(s), qkv_strides(s));
  const TensorRef v = input(*g, "V", kV, head_dims(s), qkv_strides(s));
  const TensorRef o = input(*g, "O", kO, head_dims(s), row_strides(s));
  const TensorRef d_o = input(*g, "dO", kDO, head_dims(s), row_strides(s));
  const TensorRef stats = g->tensor(fe::graph::Tensor_attributes()
                                        .set_name("Stats")
                                        .set_uid(kStats)
                                        .set_dim(stats_dims(s))
                                        .set_stride(stats_strides(s))
                                        .set_data_type(fe::DataType_t::FLOAT));
  // Note [deterministic runs] (engine/run_report.cpp): the default backward
  // adds dQ's parts with atomics; the deterministic one (on Hopper, a
  // transient dP workspace of B * H * T * T * 2 bytes) orders them.
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("lockstep_sdpa_backward")
                     .set_causal_mask(true)
                     .set_attn_scale(attn_scale(s))
                     .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
  dq->set_output(true).set_uid(kDQ).set_dim(head_dims(s)).set_stride(qkv_strides(s));
  dk->set_output(true).set_uid(kDK).set_dim(head_dims(s)).set_stride(qkv_strides(s));
  dv->set_output(true).set_uid(kDV).set_dim(head_dims(s)).set_stride(qkv_strides(s));
  return g;
}

// Validates, lowers and plans the graph `make` builds (heuristic A's first
// plan that cuDNN supports), or says at which step and why not. The
// frontend reports most failures as error_t, but a few of its paths throw
// (a backend descriptor it cannot create, a library symbol it cannot find):
// those are refusals too, so that the caller falls back instead of failing.
Plan build(const std::function<std::shared_ptr<fe::graph::Graph>()>& make, cudnnHandle_t handle) {
  Plan plan;
  const auto failed = [&](const char* step, fe::error_t status) {
    if (status.is_good()) return false;
    plan.refusal = std::string(step) + ": " + status.get_message();
    return true;
  };
  try {
    std::shared_ptr<fe::graph::Graph> g = make();
    if (failed("validate", g->validate()) ||
        failed("build_operation_graph", g->build_operation_graph(handle)) ||
        failed("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A})) ||
        failed("check_support", g->check_support(handle)) ||
        failed("build_plans", g->build_plans(handle)) ||
        failed("get_workspace_size", g->get_workspace_size(plan.workspace_bytes)))
      return plan;
    plan.graph = std::move(g);
  } catch (const std::exception& e) {
    plan.refusal = std::string("cudnn-frontend threw: ") + e.what();
  }
  return plan;
}

// Plans are built once per key and never evicted (a run has a handful of
// shapes); built and looked up under one lock, since the frontend's graph
// is not safe to build from two threads.
class PlanCache {
 public:
  const Plan& get(const SdpaShape& s, SdpaPass pass, bool deterministic) {
    int device = 0;
    LOCKSTEP_CHECK_CUDA(cudaGetDevice(&device));
    const SdpaPlanKey key = sdpa_plan_key(device, s, pass, deterministic);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    Plan plan;
    plan.refusal = sdpa_shape_refusal(s);
    if (plan.refusal.empty()) {
      // The handle's stream is set per execute; building needs none.
      cudnnHandle_t handle = detail::cudnn_handle(nullptr);
      plan = build(
          [&] {
            return pass == SdpaPass::forward ? forward_graph(s)
                                             : backward_graph(s, key.deterministic);
          },
          handle);
    }
    plan.key = key.str();
    return plans_.emplace(key, std::move(plan)).first->second;
  }

  std::vector<std::string> describe() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> lines;
    for (const auto& [key, plan] : plans_)
      lines.push_back(plan.key +
                      (plan.graph ? ": workspace " + std::to_string(plan.workspace_bytes) + " bytes"
                                  : ": refused (" + plan.refusal + ")"));
    return lines;
  }

 private:
  std::mutex mutex_;
  std::map<SdpaPlanKey, Plan> plans_;
};

// Leaked on purpose, as the cuDNN handles are (kernels/cuda/cudnn_handle.h):
// a plan must not be destroyed after the CUDA runtime has shut down.
PlanCache& cache() {
  static auto* plans = new PlanCache;
  return *plans;
}

const Plan& plan_or_throw(const SdpaShape& s, SdpaPass pass, bool deterministic) {
  const Plan& plan = cache().get(s, pass, deterministic);
  if (!plan.graph)
    throw InvalidArgument("cuDNN fused attention " + plan.key + ": not supported (" + plan.refusal +
                          "); ask sdpa_supported first and take the unfused attention");
  return plan;
}

void require_workspace(const Plan& plan, std::size_t given, const char* pass) {
  if (given < static_cast<std::size_t>(plan.workspace_bytes))
    throw InvalidArgument(std::string("cuDNN fused attention ") + pass + ": workspace of " +
                          std::to_string(given) + " bytes, the plan needs " +
                          std::to_string(plan.workspace_bytes) +
                          " (ask sdpa_workspace_bytes with the same shape and settings)");
}

void require_aligned(const void* p, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    throw InvalidArgument(std::string("cuDNN fused attention: ") + what +
                          " is not 16-byte aligned (cuDNN's kernels load 16-byte vectors: "
                          "allocate it from the pool, or take the unfused attention)");
}

void execute(const Plan& plan, std::unordered_map<std::int64_t, void*>& pack, void* workspace,
             CudaStream stream, const char* pass) {
  cudnnHandle_t handle = detail::cudnn_handle(stream);
  fe::error_t status = plan.graph->execute(handle, pack, workspace);
  if (!status.is_good())
    ::lockstep::detail::throw_library_error(
        "cuDNN", static_cast<long>(status.get_code()),
        std::string("fused attention ") + pass + ": " + status.get_message(),
        "cudnn_frontend::graph::Graph::execute", __FILE__, __LINE__);
}

}  // namespace

bool sdpa_supported(const SdpaShape& s, SdpaPass pass, bool deterministic, std::string* why) {
  const Plan& plan = cache().get(s, pass, deterministic);
  if (why) *why = plan.refusal;
  return plan.graph != nullptr;
}

std::size_t sdpa_workspace_bytes(const SdpaShape& s, SdpaPass pass, bool deterministic) {
  return static_cast<std::size_t>(plan_or_throw(s, pass, deterministic).workspace_bytes);
}

void sdpa_forward(const SdpaShape& s, const void* qkv, void* out, float* stats, void* workspace,
                  std::size_t workspace_bytes, CudaStream stream) {
  const Plan& plan = plan_or_throw(s, SdpaPass::forward, false);
  require_workspace(plan, workspace_bytes, "forward");
  require_aligned(qkv, "qkv");
  require_aligned(out, "O");
  const std::size_t part = static_cast<std::size_t>(s.width()) * dtype_size(s.type);
  char* base = static_cast<char*>(const_cast<void*>(qkv));
  std::unordered_map<std::int64_t, void*> pack{
      {kQ, base}, {kK, base + part}, {kV, base + 2 * part}, {kO, out}, {kStats, stats}};
  execute(plan, pack, workspace, stream, "forward");
}

void sdpa_backward(const SdpaShape& s, bool deterministic, const void* qkv, const void* out,
                   const void* dout, const float* stats, void* dqkv, void* workspace,
                   std::size_t workspace_bytes, CudaStream stream) {
  const Plan& plan = plan_or_throw(s, SdpaPass::backward, deterministic);
  require_workspace(plan, workspace_bytes, "backward");
  require_aligned(qkv, "qkv");
  require_aligned(out, "O");
  require_aligned(dout, "dO");
  require_aligned(dqkv, "dqkv");
  const std::size_t part = static_cast<std::size_t>(s.width()) * dtype_size(s.type);
  char* in = static_cast<char*>(const_cast<void*>(qkv));
  char* grad = static_cast<char*>(dqkv);
  std::unordered_map<std::int64_t, void*> pack{{kQ, in},
                                               {kK, in + part},
                                               {kV, in + 2 * part},
                                               {kO, const_cast<void*>(out)},
                                               {kDO, const_cast<void*>(dout)},
                                               {kStats, const_cast<float*>(stats)},
                                               {kDQ, grad},
                                               {kDK, grad + part},
                                               {kDV, grad + 2 * part}};
  execute(plan, pack, workspace, stream, "backward");
}

std::vector<std::string> sdpa_cached_plans() { return cache().describe(); }

std::string sdpa_graph_check(const SdpaShape& s, SdpaPass pass, bool deterministic,
                             int sm_version) {
  std::string why = sdpa_shape_refusal(s);
  if (!why.empty()) return why;
  try {
    const std::shared_ptr<fe::graph::Graph> g = pass == SdpaPass::forward
                                                    ? forward_graph(s, sm_version)
                                                    : backward_graph(s, deterministic, sm_version);
    fe::error_t status = g->validate();
    if (!status.is_good()) why = "validate: " + status.get_message();
  } catch (const std::exception& e) {
    why = std::string("cudnn-frontend threw: ") + e.what();
  }
  return why;
}

}  // namespace lockstep::kernels::cuda
