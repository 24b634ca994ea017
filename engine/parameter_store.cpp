// ParameterStore (engine/parameter_store.h).
#include "engine/parameter_store.h"

#include "engine/core/memory.h"
#include "engine/core/ops.h"

namespace lockstep::engine {

ParameterStore::ParameterStore(Module& model, core::Device device, const core::Stream& stream)
    : device_(device) {
  model.assign_names();
  std::int64_t offset = 0;
  for (Parameter* p : model.ready_order()) {
    slots_.push_back({p, offset, p->value.numel()});
    index_[p] = slots_.size() - 1;
    offset += (p->value.numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  // Note [lazy zero_grad]: zero_grad fills everything but the lazy
  // parameters' own elements, in as few runs as the layout allows.
  std::int64_t eager_from = 0;
  for (const Slot& s : slots_) {
    if (!s.parameter->lazy_zero_grad) continue;
    if (s.offset > eager_from) eager_ranges_.emplace_back(eager_from, s.offset - eager_from);
    eager_from = s.offset + s.numel;
  }
  if (offset > eager_from) eager_ranges_.emplace_back(eager_from, offset - eager_from);
  {
    core::MemoryKindScope kind(core::MemoryKind::parameters);  // Note [memory kinds]
    values_ = core::Tensor::zeros({offset}, DType::f32, device, stream);
  }
  {
    core::MemoryKindScope kind(core::MemoryKind::gradients);
    grads_ = core::Tensor::zeros({offset}, DType::f32, device, stream);
  }
  for (const Slot& s : slots_) {
    Parameter& p = *s.parameter;
    core::Tensor view = values_.view(s.offset, p.value.shape());
    view.copy_from(p.value, stream);
    p.value = view;
    p.grad = grads_.view(s.offset, view.shape());
    ++p.version;
  }
  for (Parameter* p : model.parameters()) {
    if (p->requires_grad) continue;
    if (!(p->value.device() == device)) p->value = p->value.to(device, stream);
    p->grad = core::Tensor();
    ++p->version;
  }
  for (Buffer* b : model.buffers())
    if (!(b->value.device() == device)) b->value = b->value.to(device, stream);
}

std::size_t ParameterStore::index_of(const Parameter& p) const {
  auto it = index_.find(&p);
  if (it == index_.end())
    throw InvalidArgument("parameter '" + p.name +
                          "' is not in this ParameterStore (frozen, or from another model)");
  return it->second;
}

void ParameterStore::zero_grad(const core::Stream& stream) {
  for (const auto& [offset, count] : eager_ranges_) grads_.view(offset, {count}).fill_(0.0, stream);
  for (const Slot& s : slots_) s.parameter->grad_stale = s.parameter->lazy_zero_grad;
  zero_stream_ = stream;
}

core::Tensor& ParameterStore::grads() {
  for (const Slot& s : slots_) grad_to_add(*s.parameter, zero_stream_);
  return grads_;
}

core::Tensor ParameterStore::make_state_buffer(const core::Stream& stream) const {
  core::MemoryKindScope kind(core::MemoryKind::optimizer_state);  // Note [memory kinds]
  return core::Tensor::zeros({values_.numel()}, DType::f32, device_, stream);
}

void ParameterStore::bump_versions() {
  for (const Slot& s : slots_) ++s.parameter->version;
}

}  // namespace lockstep::engine
