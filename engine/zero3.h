// ZeRO-3 (FSDP's full shard): each rank stores 1/N of every parameter, and
// a unit's parameters (a module, gathered together) are all-gathered just
// before its forward and again before its backward, and dropped after each.
// default_units picks the units; ParameterGathers is what the data-parallel
// step runs at the Sequential's signals (Context::on_module).
//
// Note [parameter units]: a unit is a module whose trainable parameters
// report ready together, so that they are one run of the ready order and
// one flat range of the store (ParameterStore::Units). By default the units
// are the children with trainable parameters of the outermost Sequential of
// the tree (each transformer block of the GPT presets, each layer of mlp and
// cnn, each stage of resnet and the layers beside them); the parameters in
// no unit (GPT's embeddings, final norm and tied head) form resident pieces,
// gathered for the whole step. The store starts every piece at a multiple
// of U = N x 64 elements and the shard layout cuts buckets there (comm::
// plan_shards' cuts), so a piece is a run of whole buckets, no bucket or
// gradient group spans two pieces, and a piece's gather is one allgather
// per bucket into a buffer of its own (GradientSynchronizer::start_gather).
// The layout depends on N; checkpoints, which are by name, do not.
// - Between steps a trainable parameter's value is undefined; the store's
//   values() is this rank's packed shard (ParameterStore::shard_values),
//   which the optimizer updates in place (Note [sharded state]), so the
//   gather of updated parameters after the step of ZeRO-1 and ZeRO-2 goes
//   away: the next forward gathers.
// - On a GPU the gathers run on the synchroniser's communication stream, the
//   one its reduce-scatters use (two streams on one NCCL communicator could
//   order their kernels differently on different ranks), and the next unit
//   is gathered while the current one computes (prefetch, one unit ahead;
//   forward order in forward, reverse in backward). On host buffers a gather
//   runs on the caller's thread when the unit is reached, with no prefetch:
//   as Note [host overlap] measured, overlap pays only with a core to spare,
//   and a prefetched unit would only hold memory longer.
// - A Checkpointed unit recomputes its forward inside its backward, after
//   the backward gather. Autocast weight copies are keyed on the value's
//   storage too (Note [autocast weight copy]), so each gather recasts.
// - Outside the step (evaluation, checkpoints) the caller opens a
//   FullParameters scope (DataParallelStep::full_parameters), FSDP's
//   summon_full_params: every value whole on every rank while it lives.
#pragma once

#include <cstddef>
#include <optional>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "comm/gradient_synchronizer.h"
#include "engine/nn/module.h"
#include "engine/parameter_store.h"

namespace lockstep::engine {

// The default units of Note [parameter units], in forward order; empty when
// the tree has no Sequential or its outermost has no child with trainable
// parameters (a ZeRO-3 step then refuses the model, saying why).
std::vector<Module*> default_units(Module& root);

class ParameterGathers {
 public:
  // `store` must be laid out in units for `sync`'s world and sharded
  // (ParameterStore::shard_values); both outlive this object.
  ParameterGathers(ParameterStore& store, comm::GradientSynchronizer& sync,
                   comm::Communicator& comm, core::Stream stream);

  // Gathers the resident pieces (dropping anything an interrupted step left).
  void begin_step();
  // Context::on_module: gathers a unit before its passes, drops it after.
  void on_module(Module& module, ModulePhase phase);
  // Drops every gathered piece.
  void end_step();

  // Every value whole (a collective): a FullParameters scope's start, and
  // its end, which with `write_back` first copies this rank's chunks of the
  // values back into its shard.
  void gather_all();
  void drop_all(bool write_back);

 private:
  void start(std::size_t piece);
  void ensure(std::size_t piece);
  void drop(std::size_t piece);

  ParameterStore& store_;
  comm::GradientSynchronizer& sync_;
  comm::Communicator& comm_;
  core::Stream stream_;
  bool prefetch_;
  std::unordered_map<const Module*, std::size_t> unit_of_module_;
  std::vector<std::size_t> piece_of_unit_;                                   // forward order
  std::vector<std::optional<comm::GradientSynchronizer::Gather>> gathered_;  // per piece
  core::Tensor full_;                                                        // gather_all's
};

}  // namespace lockstep::engine
