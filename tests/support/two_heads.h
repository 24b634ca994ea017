// TwoHeads: a test model with a shared trunk and two heads (class logits and
// a regression value), through Module::forward_named and backward_named
// (Note [several inputs and outputs]); the gradient and multi-rank tests of
// several outputs use it, and examples/two-heads has the same shape.
#pragma once

#include <cstdint>

#include "engine/core/ops.h"
#include "engine/nn/activation.h"
#include "engine/nn/containers.h"
#include "engine/nn/linear.h"

namespace lockstep::test {

class TwoHeads : public engine::Module {
 public:
  TwoHeads(std::int64_t features, std::int64_t hidden, std::int64_t classes) : Module("TwoHeads") {
    auto trunk = std::make_unique<engine::Sequential>();
    trunk->emplace<engine::Linear>("fc", features, hidden);
    trunk->emplace<engine::GELU>("act");
    trunk_ = static_cast<engine::Sequential*>(&add_child("trunk", std::move(trunk)));
    logits_ = &add_child("logits", std::make_unique<engine::Linear>(hidden, classes));
    value_ = &add_child("value", std::make_unique<engine::Linear>(hidden, 1));
  }

  core::NamedTensors forward_named(const core::NamedTensors& in, engine::Context& ctx) override {
    const core::Tensor h = trunk_->forward(in.at("inputs", describe()), ctx);
    return {{"logits", logits_->forward(h, ctx)}, {"value", value_->forward(h, ctx)}};
  }

  // The heads in ready order (children last to first), then the trunk on
  // the sum of their input gradients.
  core::NamedTensors backward_named(const core::NamedTensors& grads,
                                    engine::Context& ctx) override {
    core::Tensor dh;
    for (engine::Module* head : {value_, logits_}) {
      const core::Tensor* dy = grads.find(head == value_ ? "value" : "logits");
      const core::Tensor d = dy ? head->backward(*dy, ctx) : core::Tensor();
      head->report_ready(ctx);  // also a head no loss read: its gradient is zero
      if (!d.defined()) continue;
      if (!dh.defined()) {
        dh = d;
        continue;
      }
      core::Tensor sum = core::Tensor::empty(d.shape(), dh.dtype(), d.device(), ctx.stream);
      core::ops::add(dh, d.dtype() == dh.dtype() ? d : d.cast(dh.dtype(), ctx.stream), sum,
                     ctx.stream);
      dh = sum;
    }
    core::NamedTensors out{{"inputs", trunk_->backward(dh, ctx)}};
    trunk_->report_ready(ctx);
    return out;
  }

  void set_input_grad(bool on) override {
    Module::set_input_grad(on);
    trunk_->set_input_grad(on);
  }

 private:
  engine::Sequential* trunk_;
  engine::Module *logits_, *value_;
};

}  // namespace lockstep::test
