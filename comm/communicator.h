// Communicator: the collectives data-parallel training needs (allreduce,
// broadcast, allgather, reduce_scatter, alltoall, barrier) over one group of ranks.
// Implementations: SelfCommunicator (one rank, comm/self_communicator.h), Mpi
// (host buffers, blocking) and Nccl (device buffers, enqueued on a stream),
// the last two made by comm::init (comm/world.h). This base class checks the
// arguments once for all of them and offers Tensor forms of each call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/watchdog.h"
#include "engine/core/device.h"
#include "engine/core/stream.h"
#include "engine/core/tensor.h"
#include "kernels/dtype.h"

namespace lockstep::comm {

enum class ReduceOp { sum, avg };
const char* reduce_op_name(ReduceOp op);

// One thread at a time may call a communicator's collectives, and every rank
// must call the same collectives in the same order (MPI's and NCCL's rule).
// A second thread gets its own communicator from duplicate().
//
// Buffers live on device(): host memory for Self and Mpi, the GPU for Nccl.
// Streams: Self and Mpi block until the collective is done and ignore the
// stream. Nccl enqueues on `stream` when it is a CUDA stream of its GPU; given
// the CPU stream (the default) it uses its own stream and waits, so the call
// is blocking, as with core's ops.
//
// Types: allreduce and reduce_scatter take f32, f16 and bf16; broadcast and
// allgather move any dtype. avg is the sum times 1/size(), within one f32
// rounding of the exact mean (as NCCL's ncclAvg).
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  core::Device device() const { return device_; }
  // Names this communicator in messages ("world", "gradients").
  const std::string& label() const { return label_; }
  virtual const char* backend() const = 0;  // "self", "mpi" or "nccl"
  // The watchdog its collectives run under; null for Self, which cannot hang.
  const std::shared_ptr<Watchdog>& watchdog() const { return watchdog_; }

  // In place: data holds this rank's `count` elements, then the reduction.
  void allreduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                 const core::Stream& stream = {});
  // In place: data on `root` is copied to every rank.
  void broadcast(void* data, std::int64_t count, DType dtype, int root,
                 const core::Stream& stream = {});
  // recv (size() * count elements) gets rank r's `count` elements at r * count.
  // In place when send == recv + rank() * count (NCCL's convention).
  void allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                 const core::Stream& stream = {});
  // send holds size() * count elements; recv (count) gets the reduction of
  // every rank's slice [rank() * count, (rank() + 1) * count).
  // In place when recv == send + rank() * count (NCCL's convention).
  void reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype, ReduceOp op,
                      const core::Stream& stream = {});
  // send and recv hold size() * count elements each, and do not overlap:
  // rank q's recv gets this rank's slice [q * count, (q + 1) * count) of send
  // at rank() * count. Moves bytes only, any dtype: the ordered reduction
  // (comm/ordered_reduce.h) adds what it receives itself.
  void alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                const core::Stream& stream = {});
  void barrier();

  // Tensor forms: the tensors must be on device(); shapes and dtypes checked.
  void allreduce(core::Tensor& x, ReduceOp op, const core::Stream& stream = {});
  void broadcast(core::Tensor& x, int root, const core::Stream& stream = {});
  void allgather(const core::Tensor& send, core::Tensor& recv, const core::Stream& stream = {});
  void reduce_scatter(const core::Tensor& send, core::Tensor& recv, ReduceOp op,
                      const core::Stream& stream = {});

  // A communicator over the same ranks whose collectives are independent of
  // this one's (MPI_Comm_dup, ncclCommSplit), for another thread. Collective.
  std::unique_ptr<Communicator> duplicate(std::string label);

 protected:
  Communicator(int rank, int size, core::Device device, std::string label,
               std::shared_ptr<Watchdog> watchdog);
  // Describes the next collective for the watchdog, and counts it.
  OperationInfo next_operation(const char* name, std::int64_t count, DType dtype);

 private:
  virtual void do_allreduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                            const core::Stream& stream) = 0;
  virtual void do_broadcast(void* data, std::int64_t count, DType dtype, int root,
                            const core::Stream& stream) = 0;
  virtual void do_allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                            const core::Stream& stream) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                                 ReduceOp op, const core::Stream& stream) = 0;
  virtual void do_alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                           const core::Stream& stream) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_duplicate(std::string label) = 0;

  void check_buffer(const char* op, const void* data, std::int64_t count) const;
  void check_tensor(const char* op, const core::Tensor& t) const;

  int rank_;
  int size_;
  core::Device device_;
  std::string label_;
  std::shared_ptr<Watchdog> watchdog_;
  std::uint64_t sequence_ = 0;
};

}  // namespace lockstep::comm
