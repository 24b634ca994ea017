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
// ("downsample"); a null shortcut is the identity.
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
  Sequential* inner_;
  Module* shortcut_;  // null: identity
  bool relu_after_add_;
  core::Tensor output_;  // kept for the ReLU's backward
};

}  // namespace lockstep::engine
