// ZeRO-3's units and gathers (engine/zero3.h): Note [parameter units].
#include "engine/zero3.h"

#include <deque>

#include "engine/core/memory.h"
#include "engine/nn/containers.h"

namespace lockstep::engine {

std::vector<Module*> default_units(Module& root) {
  std::deque<Module*> queue{&root};  // breadth first: the outermost Sequential
  while (!queue.empty()) {
    Module* m = queue.front();
    queue.pop_front();
    if (dynamic_cast<Sequential*>(m)) {
      std::vector<Module*> units;
      for (Module* child : m->children())
        if (!child->ready_order().empty()) units.push_back(child);
      return units;
    }
    for (Module* child : m->children()) queue.push_back(child);
  }
  return {};
}

ParameterGathers::ParameterGathers(ParameterStore& store, comm::GradientSynchronizer& sync,
                                   comm::Communicator& comm, core::Stream stream)
    : store_(store),
      sync_(sync),
      comm_(comm),
      stream_(std::move(stream)),
      prefetch_(store.device().is_cuda()),
      gathered_(store.pieces().size()) {
  const auto& modules = store.units().modules;
  piece_of_unit_.assign(modules.size(), store.pieces().size());
  for (std::size_t u = 0; u < modules.size(); ++u) unit_of_module_[modules[u]] = u;
  for (std::size_t p = 0; p < store.pieces().size(); ++p)
    if (store.pieces()[p].unit >= 0) piece_of_unit_[store.pieces()[p].unit] = p;
}

void ParameterGathers::start(std::size_t piece) {
  if (piece >= gathered_.size() || gathered_[piece]) return;
  gathered_[piece] = sync_.start_gather(store_.pieces()[piece].range, store_.values());
}

void ParameterGathers::ensure(std::size_t piece) {
  start(piece);
  sync_.wait_gather(*gathered_[piece]);
  store_.set_values(piece, gathered_[piece]->values);
}

// A prefetched gather may be dropped unread (an interrupted step): the
// compute stream waits for it first, so that the buffer's stream-ordered
// release comes after the communication stream's writes.
void ParameterGathers::drop(std::size_t piece) {
  if (!gathered_[piece]) return;
  sync_.wait_gather(*gathered_[piece]);
  store_.drop_values(piece);
  gathered_[piece].reset();
}

void ParameterGathers::begin_step() {
  end_step();
  for (std::size_t p = 0; p < store_.pieces().size(); ++p)
    if (store_.pieces()[p].unit < 0) ensure(p);
}

void ParameterGathers::end_step() {
  for (std::size_t p = 0; p < gathered_.size(); ++p) drop(p);
}

// A unit with no parameters in the store (all frozen) has no piece:
// piece_of_unit_ holds pieces().size() for it, which start() ignores.
void ParameterGathers::on_module(Module& module, ModulePhase phase) {
  const auto it = unit_of_module_.find(&module);
  if (it == unit_of_module_.end()) return;
  const std::size_t unit = it->second, piece = piece_of_unit_[unit];
  if (piece >= gathered_.size()) return;
  switch (phase) {
    case ModulePhase::before_forward:
      ensure(piece);
      if (prefetch_ && unit + 1 < piece_of_unit_.size()) start(piece_of_unit_[unit + 1]);
      break;
    case ModulePhase::before_backward:
      ensure(piece);
      if (prefetch_ && unit > 0) start(piece_of_unit_[unit - 1]);
      break;
    case ModulePhase::after_forward:
    case ModulePhase::after_backward:
      drop(piece);
      break;
  }
}

void ParameterGathers::gather_all() {
  end_step();
  const comm::ShardLayout& layout = sync_.shard_layout();
  {
    core::MemoryKindScope kind(core::MemoryKind::gathered);  // Note [memory kinds]
    full_ = core::Tensor::empty({layout.padded_numel()}, DType::f32, store_.device(), stream_);
  }
  comm::gather_shards(comm_, layout, store_.values(), full_, stream_);
  store_.set_all_values(full_);
}

void ParameterGathers::drop_all(bool write_back) {
  if (!full_.defined()) return;
  if (write_back) {
    const comm::ShardLayout& layout = sync_.shard_layout();
    std::int64_t at = 0;
    for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
      const comm::FlatRange mine = layout.chunk(b, layout.rank);
      if (mine.numel > 0)
        store_.values()
            .view(at, {mine.numel})
            .copy_from(full_.view(mine.offset, {mine.numel}), stream_);
      at += layout.chunk_numel(b);
    }
    store_.bump_versions();
  }
  for (std::size_t p = 0; p < store_.pieces().size(); ++p) store_.drop_values(p);
  full_ = core::Tensor();
}

}  // namespace lockstep::engine
