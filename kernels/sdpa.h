// Causal scaled-dot-product attention fused by cuDNN: its SDPA graph (flash
// attention: no [T, T] scores in memory, the per-row log-sum-exp kept for the
// backward), built through cudnn-frontend in kernels/cuda/sdpa_cudnn.cpp, the
// one file that includes the frontend (Note [one frontend translation unit]).
// Q, K and V are read where c_attn wrote them and O, dQ, dK, dV are written
// as rows (Note [sdpa layouts]). The host rules and the plan-cache key are
// here, for the CPU tests; engine/nn/attention.cpp chooses the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/stream.h"

namespace lockstep::kernels {

// Note [sdpa layouts]: q, k, v are c_attn's rows [B, T, 3C] (C = H * D):
// head h of sample b at time t starts at element b * 3TC + t * 3C + h * D,
// plus 0, C, 2C for q, k, v; as cuDNN's [B, H, T, D] their strides are
// {3TC, D, 3C, 1}. O and dO are rows [B, T, C], strides {TC, D, C, 1}; dQ,
// dK, dV are written into rows [B, T, 3C] as q, k, v are read. Stats is
// f32 [B, H, T, 1], contiguous: row (b, h, t)'s log-sum-exp of its scaled,
// masked scores (natural log), all the backward needs besides q, k, v, O.
// The causal mask is top-left (query t sees keys 0..t), the scale 1/sqrt(D).
struct SdpaShape {
  std::int64_t batch = 0;     // B
  std::int64_t heads = 0;     // H
  std::int64_t seq = 0;       // T
  std::int64_t head_dim = 0;  // D
  DType type = DType::bf16;   // of q, k, v, O and their gradients: bf16 or f16

  std::int64_t width() const { return heads * head_dim; }  // C
  auto tie() const { return std::tie(batch, heads, seq, head_dim, type); }
};

enum class SdpaPass { forward, backward };

// A plan's identity in the cache. `deterministic` is the backward's
// set_deterministic_algorithm (always false for the forward, which has no
// atomics to order).
struct SdpaPlanKey {
  int device = 0;
  SdpaShape shape;
  SdpaPass pass = SdpaPass::forward;
  bool deterministic = false;

  // Compared as a tuple (kernels/ headers stay C++17: Note [CUDA language
  // level] in CMakeLists.txt).
  auto tie() const { return std::tuple_cat(std::tie(device, pass, deterministic), shape.tie()); }
  bool operator<(const SdpaPlanKey& o) const { return tie() < o.tie(); }
  bool operator==(const SdpaPlanKey& o) const { return tie() == o.tie(); }
  // "cuda:0 backward bf16 B 8 H 12 T 1024 D 64 deterministic".
  std::string str() const;
};
SdpaPlanKey sdpa_plan_key(int device, const SdpaShape& s, SdpaPass pass, bool deterministic);

// Why the fused path cannot take `s` by the rules known without a GPU (a
// type other than bf16/f16, D not a multiple of 8 or above 128, a size not
// positive); empty when these allow it. cuDNN's own check comes after
// (cuda::sdpa_supported).
std::string sdpa_shape_refusal(const SdpaShape& s);

// Whether this build has the fused path (cudnn-frontend found at configure
// time, Note [one frontend translation unit]), and the frontend's version
// ("1.32.0"; empty when absent).
bool sdpa_built();
std::string sdpa_frontend_version();

namespace cuda {
// cudnnGetVersion() of the cuDNN loaded at run time (91900 for 9.19.0); 0
// without CUDA.
std::size_t cudnn_runtime_version();

// Whether cuDNN runs `pass` at `s` on the current device: the host rules,
// then the graph built and its plan checked (and cached, a refusal too).
// When not, `why` (if given) gets the reason. Throws only for a CUDA error.
bool sdpa_supported(const SdpaShape& s, SdpaPass pass, bool deterministic,
                    std::string* why = nullptr);
// The workspace the plan needs, in bytes (building it if needed); throws
// InvalidArgument naming the reason when not supported.
std::size_t sdpa_workspace_bytes(const SdpaShape& s, SdpaPass pass, bool deterministic);

// O and Stats from qkv (Note [sdpa layouts]). Pointers 16-byte aligned.
void sdpa_forward(const SdpaShape& s, const void* qkv, void* out, float* stats, void* workspace,
                  std::size_t workspace_bytes, CudaStream stream);
// dqkv [B, T, 3C] from qkv, out, dout and stats (all of the forward's).
void sdpa_backward(const SdpaShape& s, bool deterministic, const void* qkv, const void* out,
                   const void* dout, const float* stats, void* dqkv, void* workspace,
                   std::size_t workspace_bytes, CudaStream stream);

// What the plan cache holds, one line per key: "KEY: workspace N bytes" or
// "KEY: refused (REASON)".
std::vector<std::string> sdpa_cached_plans();

// The graph `pass` would build for `s`, checked by cudnn-frontend's own
// rules (validate: dims, strides, their 16-byte alignment, the mask, the
// head size, the Stats tensor; gates on the linked cuDNN's version) for
// compute capability sm_version (90: Hopper) without a device, so that a
// CPU test holds the layouts of Note [sdpa layouts] to what the frontend
// accepts. Empty when valid, else the reason. Whether cuDNN then has an
// engine for it (check_support, build_plans) needs the GPU: sdpa_supported.
std::string sdpa_graph_check(const SdpaShape& s, SdpaPass pass, bool deterministic, int sm_version);
}  // namespace cuda

}  // namespace lockstep::kernels
