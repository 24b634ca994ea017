// GradientSynchronizer: the data-parallel reducer (PyTorch DDP's Reducer).
// It averages the flat gradient buffer over the ranks in buckets, each
// reduced as soon as backward has written its last gradient, so that
// communication overlaps the rest of backward; with ZeRO-1 it reduce-scatters
// them into per-rank shards and all-gathers the updated parameters
// (zero_stage, comm/shards.h); with ZeRO-2 it also keeps the gradients of
// this rank's shard only (Note [transient gradients]); with ZeRO-3 it also
// gathers the parameters of a unit of the model when the step needs them
// (start_gather, Note [parameter units], engine/zero3.h). It depends on core types only
// (comm/ sits below engine/): the engine's ParameterStore hands it flat
// buffers and a segment table, and its modules call mark_ready.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/buckets.h"
#include "comm/communicator.h"
#include "comm/ordered_reduce.h"
#include "comm/shards.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"

namespace lockstep::comm {

namespace detail {
class BucketRunner;
}

// A tensor the model keeps besides its parameters (BatchNorm's running
// statistics): not trained, but every rank must hold rank 0's values.
struct NamedBuffer {
  std::string name;
  core::Tensor tensor;
};

// The model as the synchroniser sees it.
struct SynchronizedModel {
  core::Tensor parameters;                // flat f32 values
  core::Tensor gradients;                 // flat f32 gradients, the same layout
  std::vector<GradientSegment> segments;  // in ready order (Note [ready order])
  std::vector<NamedBuffer> buffers;       // broadcast from rank 0 at every begin_step
  // ZeRO-3: offsets where a bucket must end (the store's pieces, Note
  // [parameter units]), multiples of world size x 64 elements.
  std::vector<std::int64_t> cuts;
};

// Note [transient gradients]: under ZeRO-2 (zero_stage 2) the flat
// gradient buffer does not exist during training. The shard layout's
// buckets are grouped into gradient groups, runs of whole buckets that cut no
// segment (gradient_groups()); the caller (engine's ParameterStore) keeps
// each group's gradients in a buffer of its own, made when backward first
// writes into the group and dropped (release) once its last bucket is
// reduce-scattered. The reduced chunks land in shard_gradients(), this
// rank's shard packed chunk after chunk like the optimizer's sharded state,
// which alone persists through the step. On host buffers a bucket is
// reduced on the caller's thread as soon as it is complete (no overlap, but
// its group is freed at once); on GPU buffers on the communication stream,
// and a group is dropped when the next one is complete (the compute stream
// waits for the earlier group's reduce-scatter first: Note [stream-ordered
// free], engine/core/memory.h), so two groups may be alive. Every micro-batch
// reduce-scatters, under no_sync too (its gradients are not kept): the
// later micro-batches' chunks are added into the shard.
class GradientGroups {
 public:
  virtual ~GradientGroups() = default;
  // Group `group`'s gradients (its FlatRange's numel elements), made and
  // zero-filled if no writer made them in this backward.
  virtual core::Tensor group(std::size_t group) = 0;
  // The group's gradients are reduced: drop them.
  virtual void release(std::size_t group) = 0;
};

struct SynchronizerOptions {
  // PyTorch DDP's defaults: 25 MiB buckets, the first one 1 MiB so that
  // communication starts early in backward.
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  // f32, or bf16/f16 on the wire (the buffer stays f32): half the bytes, at
  // the cost of rounding each rank's gradient and each partial sum.
  DType wire_dtype = DType::f32;
  // true: the gradients end as the mean over the ranks. false: as the sum,
  // for callers that have already divided each rank's gradient by the world
  // size (engine::DataParallelStep does, in the loss gradient, on host
  // buffers): on the CPU the division after the allreduce is a pass over
  // every gradient.
  bool average = true;
  // Host buffers: reduce buckets on a communication thread while backward
  // runs (true), or all of them on the caller's thread in finish() (false).
  // Overlap pays only with a core the compute leaves free (Note [host
  // overlap]). Unset (the default), engine::DataParallelStep decides with
  // comm::host_overlap_pays for its world and GEMM threads, the same
  // decision for every program; a synchroniser used alone then overlaps.
  // Unused for GPU buffers, which always overlap on a communication stream.
  std::optional<bool> host_overlap = std::nullopt;
  // The stream backward writes gradients on (GPU buffers); buckets start
  // after it and the averaged gradients are ready on it after finish().
  // Default: the device's default stream. Unused for host buffers.
  core::Stream compute_stream{};
  // 0: every rank ends with every averaged gradient (allreduce). 1: ZeRO-1
  // (Note [shard layout], comm/shards.h): each bucket is reduce-scattered,
  // every rank ends with the averaged gradients of its own shard only, and
  // gather() brings every rank's updated parameters back after the update.
  // 2: ZeRO-2, as 1 and the gradients sharded too (Note [transient
  // gradients]): the caller hands its gradients over in groups
  // (set_gradient_groups) and reads them from shard_gradients().
  // 3: ZeRO-3, as 2 and the parameters sharded too: the caller keeps its
  // packed shard of them, and gathers a unit's with start_gather (Note
  // [parameter units]); gather() is not used. After construction the
  // synchroniser holds no reference to the flat parameters.
  int zero_stage = 0;
  // Note [ordered synchronisation]: true sums the gradients over the ranks in
  // a fixed tree over the rank index (comm/ordered_reduce.h), the same bits
  // on every world size the chunk count supports: in finish(), on the
  // caller's thread (or the compute stream), the whole buffer at once, no
  // overlap with backward. Needs average = false and an f32 wire. With
  // zero_stage 1 every rank still ends with every gradient (the norm and the
  // loss scaler's check then see the whole buffer, in one order on any world
  // size); only the optimizer's state and update stay sharded.
  bool ordered = false;
};

// Note [ready order]: segments are listed in the order their gradients become
// ready during backward (reverse forward order for a Sequential) and are laid
// out in that order in the flat buffers, each at a 256-byte aligned offset.
// mark_ready(i) refers to segments[i]. Modules may report in another order
// (out-of-order readiness is correct, it only overlaps less), but the layout
// must follow the list: that keeps every bucket a contiguous slice.
//
// Note [host overlap]: a host allreduce is CPU work (MPI's shared-memory
// transport copies and sums with the CPU), and OpenMPI's blocking collectives
// spin while they wait for the other ranks. When every core already runs
// compute (ranks x compute threads >= cores), the communication thread takes
// its cycles from backward, and its wake-ups, spinning and cache traffic make
// the step slower than reducing everything after backward (bench_scaling,
// mlp, 2 ranks x 1 thread on 2 cores: weak-scaling efficiency 0.79-0.81 with
// overlap, 0.83-0.89 without; docs/benchmarks.md). Overlap hides
// communication only with a core to spare, as GPUs have (NCCL's stream).
//
// One training step:
//
//   sync.begin_step(step);               // rank 0's buffers to every rank
//   for (each accumulation micro-batch but the last) {
//     auto guard = sync.no_sync();       // gradients accumulate locally
//     forward; backward;                 // modules call mark_ready(i): no-ops here
//   }
//   forward; backward;                   // mark_ready(i) starts buckets as they fill
//   sync.finish();                       // gradients now hold the average over ranks
//   optimizer step;                      // ZeRO-1: of this rank's shard only, then
//   sync.gather(parameters);             //   every rank's updated shard to every rank
//
// Every rank must run the same sequence of calls: they drive collectives.
// One thread calls the synchroniser; the buffers must stay alive with it.
class GradientSynchronizer {
 public:
  // Collective. Checks the model's layout and that every rank built the same
  // model (names, shapes, dtypes and order of parameters and buffers; on a
  // difference every rank throws InvalidArgument naming it and the ranks),
  // then copies rank 0's parameters and buffers to every rank and plans the
  // buckets. `comm` must take buffers on the model's device (World::for_device)
  // and outlive the synchroniser. Host buffers get a duplicate of `comm` for
  // the communication thread.
  GradientSynchronizer(Communicator& comm, SynchronizedModel model,
                       SynchronizerOptions options = {});
  ~GradientSynchronizer();
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  // Opens step `step` (named in watchdog messages): broadcasts rank 0's
  // buffers and expects every segment to be reported once by the next
  // synchronised backward. Throws when the previous step was not finished.
  void begin_step(std::int64_t step);

  // Segment `segment`'s gradient is complete for this backward (on the
  // compute stream, for GPU buffers). Starts the reduction of every bucket
  // that is now complete and whose predecessors have started
  // (Note [bucket order]). Under no_sync it only checks the index. Throws
  // InvalidArgument for an unknown index or a segment reported twice.
  void mark_ready(std::size_t segment);

  // Waits until every bucket is averaged (host), or makes the compute stream
  // wait for it (GPU); with zero_stage 1 only this rank's shard is. Throws InvalidArgument naming
  // the first parameter that was never reported ready, after reducing the buckets anyway so that no
  // other rank waits for this one (Note [missing readiness]).
  void finish();

  // While a NoSync lives, backward passes accumulate gradients locally and
  // communicate nothing: the accumulation micro-batches of a step.
  class NoSync {
   public:
    explicit NoSync(GradientSynchronizer& sync);
    ~NoSync();
    NoSync(NoSync&& other) noexcept;  // for std::optional<NoSync> in accumulation loops
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    GradientSynchronizer* sync_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // ZeRO-1: all-gathers every rank's shard of `flat` (a flat f32 buffer of
  // the model's layout: the parameters after this rank updated its shard)
  // into every rank's copy, bucket by bucket, in place. Host buffers: on the
  // caller's thread, before returning. GPU buffers: on the communication
  // stream, after the work on the compute stream so far; the compute stream
  // waits for it. Collective; throws InvalidArgument unless zero_stage is 1 or 2.
  void gather(core::Tensor& flat);

  // ZeRO-2 (Note [transient gradients]): the gradient groups, flat ranges of
  // whole buckets in order, tiling [0, padded size); the last one reaches
  // past the buffer over the layout's padding, which stays zero.
  const std::vector<FlatRange>& gradient_groups() const { return groups_; }
  // ZeRO-2: where the groups' gradients come from; `groups` must outlive the
  // synchroniser's steps. Needed before the first begin_step; makes the
  // shard (call it once the flat gradient buffer is gone).
  void set_gradient_groups(GradientGroups& groups);
  // ZeRO-2: this rank's averaged gradients after finish(), packed
  // (shard_numel() elements, chunk after chunk in bucket order); made by
  // set_gradient_groups.
  core::Tensor& shard_gradients();
  // ZeRO-2 and ZeRO-3: every rank's shard gathered into a new flat buffer of the
  // model's layout (padded size), for messages. Collective.
  core::Tensor gather_gradients();

  // ZeRO-3 (Note [parameter units]): a unit's values being gathered.
  struct Gather {
    core::Tensor values;  // the range's values, on the model's device
    core::Event done;     // GPU: recorded on the communication stream after the gather
  };
  // ZeRO-3: every rank's chunks of `range` (whole buckets) from `shard` (this
  // rank's packed values, shard_numel() f32) into a new buffer. Host: on the
  // caller's thread, complete on return. GPU: on the communication stream,
  // after the compute stream's work so far. Collective, in one order on every
  // rank; throws InvalidArgument unless zero_stage is 3.
  Gather start_gather(FlatRange range, const core::Tensor& shard);
  // The compute stream waits for `gather` (GPU); nothing on the host.
  void wait_gather(const Gather& gather);

  const std::vector<GradientSegment>& segments() const { return model_.segments; }
  bool sharded() const { return options_.zero_stage >= 1; }
  bool transient_gradients() const { return options_.zero_stage >= 2; }
  bool sharded_parameters() const { return options_.zero_stage == 3; }
  // The shard layout (zero_stage 1 or 2); throws InvalidArgument otherwise.
  const ShardLayout& shard_layout() const;
  const std::vector<Bucket>& buckets() const { return buckets_; }
  std::int64_t step() const { return step_; }

 private:
  void check_model() const;
  void pack_buffers();
  void plan();
  void broadcast_buffers();
  void reduce_bucket(std::size_t bucket, const core::Stream& stream);
  void reduce_scatter_bucket(std::size_t bucket, const core::Stream& stream);
  void reduce_scatter_group(std::size_t bucket, const core::Stream& stream);
  // ZeRO-2: drops the groups whose buckets are all reduced (`all`: every one).
  void release_reduced_groups(bool all);
  // Launches and waits for every bucket, then throws for a segment never reported.
  void complete_pass();
  void gather_bucket(core::Tensor& flat, std::size_t bucket, const core::Stream& stream);
  Communicator& bucket_comm() { return thread_comm_ ? *thread_comm_ : comm_; }
  void launch_ready_buckets();

  Communicator& comm_;
  SynchronizedModel model_;
  SynchronizerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<std::string> bucket_names_;  // for watchdog messages
  std::vector<std::string> gather_names_;  // zero_stage 1: the same, gathers
  ShardLayout shards_;                     // zero_stage 1, 2
  // Note [transient gradients] (zero_stage 2): the groups, each bucket's
  // group, the next group to drop, the shard, and a chunk of scratch for the
  // later micro-batches' chunks (made by the first step with accumulation).
  std::vector<FlatRange> groups_;
  std::vector<std::size_t> group_of_;     // per bucket
  std::vector<std::size_t> last_bucket_;  // per group
  std::size_t next_release_ = 0;
  GradientGroups* gradient_groups_ = nullptr;
  core::Tensor shard_grads_, chunk_scratch_;
  std::vector<std::int64_t> chunk_position_;  // per bucket: its chunk's place in the shard
  core::Event group_reduced_;                 // GPU: after the latest complete group
  std::size_t recorded_through_ = 0;          // GPU: groups [0, this) are before group_reduced_
  bool first_pass_ = true;                    // no micro-batch of this step reduced yet
  bool pass_ended_ = false;                   // a no_sync micro-batch's backward ended
  std::vector<std::pair<std::size_t, std::size_t>> buckets_of_;  // segment -> [first, end) bucket
  std::vector<std::size_t> pending_;        // per bucket: segments not yet ready
  std::vector<char> ready_;                 // per segment
  std::size_t next_launch_ = 0;             // buckets [0, next_launch_) have started
  std::vector<core::Tensor> buffer_packs_;  // per buffer dtype (undefined for one buffer)
  std::vector<std::vector<std::size_t>> pack_members_;
  core::Tensor wire_;                          // scratch for a 16-bit wire format
  core::Tensor tail_;                          // f32 scratch for the shard layout's tail bucket
  core::Stream comm_stream_;                   // GPU buffers: where buckets are reduced
  core::Event updated_, gathered_;             // gather()'s, created once, recorded each step
  std::int64_t parameter_numel_ = 0;           // the flat parameters' elements
  std::unique_ptr<Communicator> thread_comm_;  // host buffers: the communication thread's
  std::unique_ptr<detail::BucketRunner> runner_;
  std::unique_ptr<OrderedAllreduce> ordered_;  // options_.ordered
  std::int64_t step_ = -1;
  bool in_step_ = false;
  int no_sync_depth_ = 0;
};

}  // namespace lockstep::comm
