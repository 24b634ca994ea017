// The fused attention's host rules and plan keys (kernels/sdpa.h), compiled
// in every build so that the CPU tests reach them; and, in a build without
// cudnn-frontend, the kernels::cuda entry points answering "not built"
// (Note [one frontend translation unit]).
#include "kernels/sdpa.h"

#include <string>

#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include <cudnn.h>
#endif

namespace lockstep::kernels {

std::string SdpaPlanKey::str() const {
  std::string text = "cuda:" + std::to_string(device) +
                     (pass == SdpaPass::forward ? " forward " : " backward ") +
                     dtype_name(shape.type) + " B " + std::to_string(shape.batch) + " H " +
                     std::to_string(shape.heads) + " T " + std::to_string(shape.seq) + " D " +
                     std::to_string(shape.head_dim);
  if (deterministic) text += " deterministic";
  return text;
}

SdpaPlanKey sdpa_plan_key(int device, const SdpaShape& s, SdpaPass pass, bool deterministic) {
  return {device, s, pass, pass == SdpaPass::backward && deterministic};
}

std::string sdpa_shape_refusal(const SdpaShape& s) {
  if (s.type != DType::bf16 && s.type != DType::f16)
    return std::string("type ") + dtype_name(s.type) +
           " (cuDNN's fused attention takes bf16 or f16)";
  if (s.batch <= 0 || s.heads <= 0 || s.seq <= 0 || s.head_dim <= 0)
    return "sizes B " + std::to_string(s.batch) + ", H " + std::to_string(s.heads) + ", T " +
           std::to_string(s.seq) + ", D " + std::to_string(s.head_dim) + " (all must be positive)";
  // cuDNN's kernels load rows of D in 16-byte vectors and support D <= 128
  // for the backward on every architecture from sm_80.
  if (s.head_dim % 8 != 0 || s.head_dim > 128)
    return "head size D " + std::to_string(s.head_dim) + " (a multiple of 8 up to 128)";
  return {};
}

bool sdpa_built() { return LOCKSTEP_WITH_CUDNN_FRONTEND; }

std::string sdpa_frontend_version() {
#if LOCKSTEP_WITH_CUDNN_FRONTEND
  return LOCKSTEP_CUDNN_FRONTEND_VERSION;
#else
  return {};
#endif
}

namespace cuda {

std::size_t cudnn_runtime_version() {
#if LOCKSTEP_WITH_CUDA
  return cudnnGetVersion();
#else
  return 0;
#endif
}

#if !LOCKSTEP_WITH_CUDNN_FRONTEND
namespace {
const char* const kNotBuilt =
    "lockstep was built without cudnn-frontend, so the fused attention is absent (run "
    "scripts/install-deps.sh, which fetches it, then configure again)";
}  // namespace

bool sdpa_supported(const SdpaShape&, SdpaPass, bool, std::string* why) {
  if (why) *why = kNotBuilt;
  return false;
}
std::size_t sdpa_workspace_bytes(const SdpaShape&, SdpaPass, bool) {
  throw InvalidArgument(kNotBuilt);
}
void sdpa_forward(const SdpaShape&, const void*, void*, float*, void*, std::size_t, CudaStream) {
  throw InvalidArgument(kNotBuilt);
}
void sdpa_backward(const SdpaShape&, bool, const void*, const void*, const void*, const float*,
                   void*, void*, std::size_t, CudaStream) {
  throw InvalidArgument(kNotBuilt);
}
std::vector<std::string> sdpa_cached_plans() { return {}; }
std::string sdpa_graph_check(const SdpaShape&, SdpaPass, bool, int) { return kNotBuilt; }
#endif

}  // namespace cuda

}  // namespace lockstep::kernels
