// SelfCommunicator (comm/self_communicator.h): the sum and the mean over one
// rank are the rank's own values; gathers and scatters are copies.
#include "comm/self_communicator.h"

#include <cstring>

namespace lockstep::comm {

SelfCommunicator::SelfCommunicator(std::string label)
    : Communicator(0, 1, core::Device::cpu(), std::move(label), nullptr) {}

void SelfCommunicator::do_allreduce(void*, std::int64_t, DType, ReduceOp, const core::Stream&) {}

void SelfCommunicator::do_broadcast(void*, std::int64_t, DType, int, const core::Stream&) {}

void SelfCommunicator::do_allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                                    const core::Stream&) {
  if (count > 0 && send != recv)
    std::memmove(recv, send, static_cast<std::size_t>(count) * dtype_size(dtype));
}

void SelfCommunicator::do_reduce_scatter(const void* send, void* recv, std::int64_t count,
                                         DType dtype, ReduceOp, const core::Stream&) {
  if (count > 0 && send != recv)
    std::memmove(recv, send, static_cast<std::size_t>(count) * dtype_size(dtype));
}

void SelfCommunicator::do_alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                                   const core::Stream&) {
  if (count > 0) std::memcpy(recv, send, static_cast<std::size_t>(count) * dtype_size(dtype));
}

std::unique_ptr<Communicator> SelfCommunicator::do_duplicate(std::string label) {
  return std::make_unique<SelfCommunicator>(std::move(label));
}

}  // namespace lockstep::comm
