// SelfCommunicator: the communicator of a world of one rank (a program run
// without mpiexec, and the unit tests). Every collective of one rank is the
// identity or a copy, so it needs neither MPI nor a watchdog.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace lockstep::comm {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string label = "self");
  const char* backend() const override { return "self"; }

 private:
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
  void do_barrier() override {}
  std::unique_ptr<Communicator> do_duplicate(std::string label) override;
};

}  // namespace lockstep::comm
