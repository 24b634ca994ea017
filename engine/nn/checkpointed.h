// Checkpointed: activation checkpointing of any one-input, one-output module.
// Its forward keeps only its input; its backward runs the inner forward again
// and then the inner backward, trading one more forward for the activations
// of everything inside. Parameters, buffers, names and the ready order are the
// inner module's, unchanged, so checkpoints and weights are alike with or
// without it.
//
// Note [activation checkpointing]: the first forward runs with
// Context::keep_for_backward false (every layer computes its output and keeps
// nothing: Module::keeps_for_backward), and the recompute runs with the first
// forward's Context, so the same seed, step and first_sample: Dropout's masks
// are keyed by row position and layer path (Note [dropout keys]) and come out
// the same bits, and so does every other output, so the gradients equal those
// of the plain model bit for bit. State a forward moves must move once:
// BatchNorm2d updates its running statistics in the first forward only
// (Context::recompute is set in the second). A module written elsewhere that
// ignores keep_for_backward still gives the right gradients (it keeps what it
// kept, and the recompute overwrites it); one that moves state in forward
// must honour Context::recompute, or it moves that state twice. The kept
// input must not be changed in place after the forward (no layer here does).
#pragma once

#include <memory>

#include "engine/nn/module.h"

namespace lockstep::engine {

class Checkpointed : public Module {
 public:
  // The inner module's children and parameters appear at this module's level
  // (transparent in dotted names): h.0.attn.c_attn.weight stays itself.
  explicit Checkpointed(std::unique_ptr<Module> inner);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  void set_input_grad(bool on) override;
  // Read by the ONNX exporter (engine/export/), which exports the inner module.
  Module& inner() { return *inner_; }

 private:
  Module* inner_;
  core::Tensor input_;   // the one activation kept
  Context forward_ctx_;  // the first forward's, less its grad-ready hook
};

}  // namespace lockstep::engine
