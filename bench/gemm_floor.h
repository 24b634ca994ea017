// The GEMM floor of a model preset's CPU training step: the step's GEMMs
// alone, each the CPU GEMM library's own sgemm (Note [CPU GEMM libraries])
// on the step's shapes, for bench_step to time beside the step. A step cannot
// beat it with this library, and neither can a ratio against PyTorch exceed
// PyTorch's step over it (Note [GEMM floor]).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/models.h"
#include "engine/nn/attention.h"
#include "kernels/gemm.h"

namespace lockstep::bench {

// Note [GEMM floor]: every layer has its own weight, activation and gradient
// buffers, as in the model (the GPTs' attention probabilities and their
// gradients too, per block): shared buffers would keep the floor's data in
// cache and make it 3-5% faster than the step can be (measured on the mlp).
// Weight gradients accumulate (beta 1), as the step's do. The attention
// products are the step's blocked ones (Note [blocked causal attention],
// engine/nn/attention.cpp: query blocks of kCausalQueryBlock rows over the
// keys up to the block's end, per head, in the rows c_attn writes), so the
// floor does the step's FLOPs, no more. It leaves out everything that is not
// a GEMM: LayerNorm, GELU, the softmaxes, the residual adds, the loss, the
// gradient norm and SGD.
namespace gemm_floor_detail {

using kernels::cpu::GemmLibrary;
using kernels::cpu::raw_sgemm;

inline std::vector<float> filled(std::int64_t n, float v) {
  return std::vector<float>(static_cast<std::size_t>(n), v);
}

// One Linear (y = x W^T, W [out, in]) over `rows` rows: its buffers and its
// three products.
struct Linear {
  std::int64_t in, out;
  std::vector<float> x, w, y, dw, dy, dx;
  Linear(std::int64_t rows, std::int64_t in_features, std::int64_t out_features)
      : in(in_features),
        out(out_features),
        x(filled(rows * in, 0.5f)),
        w(filled(out * in, 0.02f)),
        y(filled(rows * out, 0)),
        dw(filled(out * in, 0)),
        dy(filled(rows * out, 0.01f)),
        dx(filled(rows * in, 0)) {}
  void forward(GemmLibrary lib, std::int64_t rows) {
    raw_sgemm(lib, false, true, rows, out, in, 1, x.data(), in, w.data(), in, 0, y.data(), out);
  }
  void backward(GemmLibrary lib, std::int64_t rows, bool input_grad) {
    raw_sgemm(lib, true, false, out, in, rows, 1, dy.data(), out, x.data(), in, 1, dw.data(), in);
    if (input_grad)
      raw_sgemm(lib, false, false, rows, in, out, 1, dy.data(), out, w.data(), in, 0, dx.data(),
                in);
  }
};

// mlp's GEMMs: forward, weight and input gradients of fc1..fc3 (fc1 has no
// input gradient: its input is data).
inline std::function<void()> mlp(std::int64_t batch, GemmLibrary library) {
  const std::int64_t dims[] = {784, 512, 512, 10};
  auto layers = std::make_shared<std::vector<Linear>>();
  for (int l = 0; l < 3; ++l) layers->emplace_back(batch, dims[l], dims[l + 1]);
  return [layers, batch, library] {
    for (Linear& layer : *layers) layer.forward(library, batch);
    for (std::size_t l = layers->size(); l-- > 0;) (*layers)[l].backward(library, batch, l > 0);
  };
}

// A GPT preset's GEMMs: per block c_attn, the six attention products,
// c_proj, c_fc and the MLP's c_proj; then the tied head (logits = x wte^T).
// The attention reads q, k, v where c_attn writes them and writes O where
// c_proj reads it, and back (dO from c_proj, dq, dk, dv into c_attn's
// output gradient), as the model's heads in place do.
inline std::function<void()> gpt(const engine::GptConfig& c, std::int64_t batch,
                                 GemmLibrary library) {
  const std::int64_t T = c.block_size, C = c.embed_dim, H = c.heads, D = C / H, rows = batch * T;
  struct Block {
    Linear attn, proj, fc, fc_proj;
    std::vector<float> p, ds;  // [B * H, T, T]: the probabilities and their gradient
  };
  struct Net {
    std::vector<Block> blocks;
    Linear head;
  };
  auto net = std::make_shared<Net>(Net{{}, Linear(rows, C, c.vocab)});
  for (std::int64_t l = 0; l < c.layers; ++l)
    net->blocks.push_back({Linear(rows, C, 3 * C), Linear(rows, C, C), Linear(rows, C, 4 * C),
                           Linear(rows, 4 * C, C), filled(batch * H * T * T, 0),
                           filled(batch * H * T * T, 0)});
  // f(b, start, n, h): query rows [start, start + n) of head h of sample b,
  // for every one (Note [blocked causal attention]).
  auto each_block = [T, H, batch](auto&& f) {
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t start = 0; start < T; start += engine::kCausalQueryBlock)
        for (std::int64_t h = 0; h < H; ++h)
          f(b, start, std::min(engine::kCausalQueryBlock, T - start), h);
  };
  return [net, library, T, C, H, D, rows, each_block] {
    const GemmLibrary lib = library;
    const std::int64_t ld = 3 * C;  // q, k, v's rows
    for (Block& k : net->blocks) {
      k.attn.forward(lib, rows);
      each_block([&](std::int64_t b, std::int64_t start, std::int64_t n, std::int64_t h) {
        const std::int64_t end = start + n;
        const float* q = k.attn.y.data() + b * T * ld + h * D;  // k at q + C, v at q + 2C
        float* p = k.p.data() + (b * H + h) * T * T;
        float* o = k.proj.x.data() + b * T * C + h * D;
        raw_sgemm(lib, false, true, n, end, D, 1, q + start * ld, ld, q + C, ld, 0, p + start * T,
                  T);  // S = Q K^T
        raw_sgemm(lib, false, false, n, D, end, 1, p + start * T, T, q + 2 * C, ld, 0,
                  o + start * C, C);  // O = P V
      });
      k.proj.forward(lib, rows);
      k.fc.forward(lib, rows);
      k.fc_proj.forward(lib, rows);
    }
    net->head.forward(lib, rows);
    net->head.backward(lib, rows, true);
    for (auto it = net->blocks.rbegin(); it != net->blocks.rend(); ++it) {
      Block& k = *it;
      k.fc_proj.backward(lib, rows, true);
      k.fc.backward(lib, rows, true);
      k.proj.backward(lib, rows, true);
      each_block([&](std::int64_t b, std::int64_t start, std::int64_t n, std::int64_t h) {
        const std::int64_t end = start + n, at = b * T * ld + h * D;
        const float* q = k.attn.y.data() + at;
        float* dq = k.attn.dy.data() + at;  // dk at dq + C, dv at dq + 2C
        const float* d_o = k.proj.dx.data() + b * T * C + h * D;
        const float* p = k.p.data() + (b * H + h) * T * T;
        float* ds = k.ds.data() + (b * H + h) * T * T;
        raw_sgemm(lib, false, true, n, end, D, 1, d_o + start * C, C, q + 2 * C, ld, 0,
                  ds + start * T, T);  // dP = dO V^T
        raw_sgemm(lib, false, false, n, D, end, 1, ds + start * T, T, q + C, ld, 0, dq + start * ld,
                  ld);  // dQ = dS K
        // Keys [start, end), from the query rows that see them: dV = P^T dO, dK = dS^T Q.
        raw_sgemm(lib, true, false, n, D, T - start, 1, p + start * T + start, T, d_o + start * C,
                  C, 0, dq + 2 * C + start * ld, ld);
        raw_sgemm(lib, true, false, n, D, T - start, 1, ds + start * T + start, T, q + start * ld,
                  ld, 0, dq + C + start * ld, ld);
      });
      k.attn.backward(lib, rows, true);
    }
  };
}

}  // namespace gemm_floor_detail

// The floor of `model`'s fp32 CPU step at `batch`, or an empty function for
// the presets without one (cnn and resnet: their convolutions are im2col
// GEMMs plus copies, no floor of GEMMs alone).
inline std::function<void()> gemm_floor(const std::string& model, std::int64_t batch) {
  const kernels::cpu::GemmLibrary library = kernels::cpu::gemm_library();
  if (model == "mlp") return gemm_floor_detail::mlp(batch, library);
  if (engine::model_preset(model).language_model)
    return gemm_floor_detail::gpt(engine::gpt_config(model, 0.0f), batch, library);
  return nullptr;
}

}  // namespace lockstep::bench
