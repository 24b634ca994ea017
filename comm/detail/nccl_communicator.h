// NcclCommunicator: collectives on device buffers of one GPU, enqueued on a
// CUDA stream. Each call is watched twice: while it is enqueued (the first
// collective blocks there until peers connect) and, through an event, until
// the GPU has finished it; NCCL's asynchronous errors are polled by the
// watchdog. CUDA builds only; private to comm/ (it includes nccl.h).
#pragma once

#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace lockstep::comm::detail {

class NcclCommunicator final : public Communicator {
 public:
  // Takes `comm` (of GPU `device`) over: ncclCommDestroy on destruction.
  NcclCommunicator(ncclComm_t comm, int rank, int size, core::Device device, std::string label,
                   std::shared_ptr<Watchdog> watchdog);
  ~NcclCommunicator() override;
  const char* backend() const override { return "nccl"; }
  ncclComm_t handle() const { return comm_; }
  // Its own stream: collectives given the CPU stream run here, then wait.
  const core::Stream& stream() const { return stream_; }

  // ncclCommAbort: ends the operations in flight; the communicator is
  // unusable afterwards. Idempotent; callable from any thread.
  void abort();
  // Aborts every NCCL communicator alive in the process (World::abort).
  static void abort_all();

 private:
  template <typename Enqueue>
  void run(OperationInfo info, const core::Stream& stream, Enqueue&& enqueue);

  void do_allreduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                    const core::Stream& stream) override;
  void do_broadcast(void* data, std::int64_t count, DType dtype, int root,
                    const core::Stream& stream) override;
  void do_allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                    const core::Stream& stream) override;
  void do_reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype, ReduceOp op,
                         const core::Stream& stream) override;
  void do_alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                   const core::Stream& stream) override;
  void do_barrier() override;
  std::unique_ptr<Communicator> do_duplicate(std::string label) override;

  ncclComm_t comm_;
  core::Stream stream_;
  core::Tensor barrier_word_;  // one f32 on the GPU: NCCL has no barrier, an allreduce is one
  std::atomic<bool> aborted_{false};
  int error_source_ = -1;
};

// The world's NCCL communicator on `device`: rank 0's ncclUniqueId goes to
// every rank over `host` (MPI, or Self in a world of one), then
// ncclCommInitRank under the watchdog.
std::unique_ptr<NcclCommunicator> create_nccl_world(Communicator& host, core::Device device,
                                                    std::shared_ptr<Watchdog> watchdog);

}  // namespace lockstep::comm::detail
