// Argument checks and Tensor forms shared by every Communicator
// (comm/communicator.h); the backends implement the do_* calls.
#include "comm/communicator.h"

#include <fmt/core.h>

#include "kernels/error.h"

namespace lockstep::comm {
namespace {

void require_reducible(const char* op, const std::string& label, DType dtype) {
  if (!is_floating(dtype))
    throw InvalidArgument(
        fmt::format("{} on '{}': dtype {} cannot be reduced (use f32, f16 or bf16)", op, label,
                    dtype_name(dtype)));
}

}  // namespace

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "avg"; }

Communicator::Communicator(int rank, int size, core::Device device, std::string label,
                           std::shared_ptr<Watchdog> watchdog)
    : rank_(rank),
      size_(size),
      device_(device),
      label_(std::move(label)),
      watchdog_(std::move(watchdog)) {}

OperationInfo Communicator::next_operation(const char* name, std::int64_t count, DType dtype) {
  OperationInfo info;
  info.name = name;
  info.communicator = label_;
  info.sequence = sequence_++;
  info.count = count;
  info.dtype = dtype;
  return info;
}

void Communicator::check_buffer(const char* op, const void* data, std::int64_t count) const {
  if (count < 0)
    throw InvalidArgument(fmt::format("{} on '{}': negative element count {}", op, label_, count));
  if (count > 0 && data == nullptr)
    throw InvalidArgument(
        fmt::format("{} on '{}': null buffer for {} elements", op, label_, count));
}

void Communicator::check_tensor(const char* op, const core::Tensor& t) const {
  if (!t.defined())
    throw InvalidArgument(fmt::format("{} on '{}': the tensor is undefined", op, label_));
  if (!(t.device() == device_))
    throw InvalidArgument(fmt::format("{} on '{}' ({}) takes buffers on {}, got a tensor on {}", op,
                                      label_, backend(), device_.str(), t.device().str()));
}

void Communicator::allreduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                             const core::Stream& stream) {
  check_buffer("allreduce", data, count);
  require_reducible("allreduce", label_, dtype);
  do_allreduce(data, count, dtype, op, stream);
}

void Communicator::broadcast(void* data, std::int64_t count, DType dtype, int root,
                             const core::Stream& stream) {
  check_buffer("broadcast", data, count);
  if (root < 0 || root >= size_)
    throw InvalidArgument(
        fmt::format("broadcast on '{}': root {} is not a rank of {}", label_, root, size_));
  do_broadcast(data, count, dtype, root, stream);
}

void Communicator::allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                             const core::Stream& stream) {
  check_buffer("allgather", send, count);
  check_buffer("allgather", recv, count);
  do_allgather(send, recv, count, dtype, stream);
}

void Communicator::reduce_scatter(const void* send, void* recv, std::int64_t count, DType dtype,
                                  ReduceOp op, const core::Stream& stream) {
  check_buffer("reduce_scatter", send, count);
  check_buffer("reduce_scatter", recv, count);
  require_reducible("reduce_scatter", label_, dtype);
  do_reduce_scatter(send, recv, count, dtype, op, stream);
}

void Communicator::alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                            const core::Stream& stream) {
  check_buffer("alltoall", send, count);
  check_buffer("alltoall", recv, count);
  const auto bytes =
      static_cast<std::size_t>(count) * static_cast<std::size_t>(size_) * dtype_size(dtype);
  const char* s = static_cast<const char*>(send);
  const char* r = static_cast<const char*>(recv);
  if (bytes > 0 && s < r + bytes && r < s + bytes)
    throw InvalidArgument(fmt::format(
        "alltoall on '{}': the send and receive buffers of {} bytes overlap (give two buffers)",
        label_, bytes));
  do_alltoall(send, recv, count, dtype, stream);
}

void Communicator::barrier() { do_barrier(); }

std::unique_ptr<Communicator> Communicator::duplicate(std::string label) {
  return do_duplicate(std::move(label));
}

void Communicator::allreduce(core::Tensor& x, ReduceOp op, const core::Stream& stream) {
  check_tensor("allreduce", x);
  allreduce(x.data(), x.numel(), x.dtype(), op, stream);
}

void Communicator::broadcast(core::Tensor& x, int root, const core::Stream& stream) {
  check_tensor("broadcast", x);
  broadcast(x.data(), x.numel(), x.dtype(), root, stream);
}

void Communicator::allgather(const core::Tensor& send, core::Tensor& recv,
                             const core::Stream& stream) {
  check_tensor("allgather", send);
  check_tensor("allgather", recv);
  if (send.dtype() != recv.dtype() || recv.numel() != send.numel() * size_)
    throw InvalidArgument(fmt::format(
        "allgather on '{}': recv must hold {} ranks x {} {} elements, got {} {} elements", label_,
        size_, send.numel(), dtype_name(send.dtype()), recv.numel(), dtype_name(recv.dtype())));
  allgather(send.data(), recv.data(), send.numel(), send.dtype(), stream);
}

void Communicator::reduce_scatter(const core::Tensor& send, core::Tensor& recv, ReduceOp op,
                                  const core::Stream& stream) {
  check_tensor("reduce_scatter", send);
  check_tensor("reduce_scatter", recv);
  if (send.dtype() != recv.dtype() || send.numel() != recv.numel() * size_)
    throw InvalidArgument(fmt::format(
        "reduce_scatter on '{}': send must hold {} ranks x {} {} elements, got {} {} elements",
        label_, size_, recv.numel(), dtype_name(recv.dtype()), send.numel(),
        dtype_name(send.dtype())));
  reduce_scatter(send.data(), recv.data(), recv.numel(), recv.dtype(), op, stream);
}

}  // namespace lockstep::comm
