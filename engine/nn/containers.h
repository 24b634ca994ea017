// Containers: Sequential (children in a chain) and Residual (inner branch plus
// shortcut, added). Both report each child's parameters as ready right after
// that child's backward (Note [grad-ready order] in engine/nn/module.h);
// Sequential signals Context::on_module around each child's passes.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/module.h"

namespace lockstep::engine {

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  // Children are named by their position ("0", "1", ...) unless named.
  Sequential& add(std::unique_ptr<Module> child);
  Sequential& add(const std::string& name, std::unique_ptr<Module> child);
  // Builds a child in place: seq.emplace<Linear>("fc1", 784, 512).
  template <typename M, typename... Args>
  M& emplace(const std::string& name, Args&&... args) {
    auto child = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *child;
    add(name, std::move(child));
    return ref;
  }

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // forward over children [begin, end), and backward over them from end - 1
  // down to begin, each with forward's and backward's signals and spans: for a
  // container that runs one child itself (Note [fused block end]).
  core::Tensor forward_range(const core::Tensor& x, Context& ctx, std::size_t begin,
                             std::size_t end);
  core::Tensor backward_range(const core::Tensor& dy, Context& ctx, std::size_t begin,
                              std::size_t end);
  void set_input_grad(bool on) override;
  // Its children's forward and backward become timeline spans though it is
  // not the root (Note [module spans]): a model's stack of blocks.
  void trace_children() { trace_children_ = true; }

 private:
  std::size_t unnamed_ = 0;
  bool trace_children_ = false;
};

// y = inner(x) + shortcut(x), optionally followed by a ReLU (torchvision's
// BasicBlock). The inner branch's children are named at this module's level
// (layer1.0.conv1, not layer1.0.inner.conv1), the shortcut as given
// ("downsample"); a null shortcut is the identity. On CUDA, an inner branch
// ending in a BatchNorm2d fuses it with the add and the ReLU (Note [fused
// block end]).
class BatchNorm2d;

class Residual : public Module {
 public:
  Residual(std::unique_ptr<Sequential> inner, std::unique_ptr<Module> shortcut,
           const std::string& shortcut_name = "downsample", bool relu_after_add = false);

  core::Tensor forward(const core::Tensor& x, Context& ctx) override;
  core::Tensor backward(const core::Tensor& dy, Context& ctx) override;
  // Read by the ONNX exporter (engine/export/).
  Sequential& inner() { return *inner_; }
  Module* shortcut() { return shortcut_; }  // null: identity
  bool relu_after_add() const { return relu_after_add_; }
  void append_ready_order(std::vector<Parameter*>& out) override;
  void set_input_grad(bool on) override;

 private:
  // The inner branch's last child when it can end a fused block: a
  // BatchNorm2d without activation, with relu_after_add; else null.
  BatchNorm2d* block_end_batchnorm() const;
  // The unfused add (mixed types in f32) and ReLU.
  core::Tensor add_and_relu(const core::Tensor& a, const core::Tensor& b, Context& ctx);
  // Backward from the gradients of the inner branch's output and the shortcut's.
  core::Tensor backward_branches(const core::Tensor& dx_inner, const core::Tensor& g_short,
                                 Context& ctx);

  Sequential* inner_;
  Module* shortcut_;  // null: identity
  bool relu_after_add_;
  bool fused_ = false;   // the last forward ran the fused block end
  core::Tensor output_;  // kept for the ReLU's backward
};

}  // namespace lockstep::engine
