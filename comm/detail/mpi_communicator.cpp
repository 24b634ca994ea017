// MpiCommunicator and MpiTypes (comm/detail/mpi_communicator.h).
#include "comm/detail/mpi_communicator.h"

#include <fmt/core.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "comm/detail/check_mpi.h"
#include "comm/detail/half_sum.h"
#include "kernels/half.h"

namespace lockstep::comm::detail {
namespace {

// MPI counts are int: large buffers go in chunks of at most 1 GiB.
constexpr std::int64_t kMaxChunkBytes = std::int64_t{1} << 30;

void f16_sum_op(void* in, void* inout, int* len, MPI_Datatype*) {
  sum_f16(static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout), *len);
}

void bf16_sum_op(void* in, void* inout, int* len, MPI_Datatype*) {
  sum_bf16(static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout), *len);
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  LOCKSTEP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  LOCKSTEP_CHECK_MPI(MPI_Comm_size(comm, &size));
  return size;
}

// avg = sum x (1 / size) in f32, rounded once to the storage type. The
// reciprocal keeps this pass at memory speed (a division per element costs
// as much as the allreduce of a cached message) and is within one f32
// rounding of the exact mean, as NCCL's ncclAvg (a multiplication by 1/size).
void scale_to_mean(void* data, std::int64_t count, DType dtype, int size) {
  const float reciprocal = 1.0f / static_cast<float>(size);
  if (dtype == DType::f32) {
    float* x = static_cast<float*>(data);
    for (std::int64_t i = 0; i < count; ++i) x[i] *= reciprocal;
    return;
  }
  std::uint16_t* x = static_cast<std::uint16_t*>(data);
  if (dtype == DType::f16)
    for (std::int64_t i = 0; i < count; ++i)
      x[i] = kernels::f32_to_f16_bits(kernels::f16_bits_to_f32(x[i]) * reciprocal);
  else
    for (std::int64_t i = 0; i < count; ++i)
      x[i] = kernels::f32_to_bf16_bits(kernels::bf16_bits_to_f32(x[i]) * reciprocal);
}

int int_count(const char* op, const std::string& label, std::int64_t count, const char* what) {
  if (count > INT_MAX)
    throw InvalidArgument(
        fmt::format("{} on '{}': {} {} per rank exceed MPI's int count limit "
                    "(split the buffer into smaller calls)",
                    op, label, count, what));
  return static_cast<int>(count);
}

}  // namespace

MpiTypes::MpiTypes() {
  // Our own datatypes (not MPI_UINT16_T itself) so that no built-in op can be
  // applied to them by mistake; they are 2-byte elements for MPI's splitting.
  LOCKSTEP_CHECK_MPI(MPI_Type_contiguous(1, MPI_UINT16_T, &f16_));
  LOCKSTEP_CHECK_MPI(MPI_Type_commit(&f16_));
  LOCKSTEP_CHECK_MPI(MPI_Type_contiguous(1, MPI_UINT16_T, &bf16_));
  LOCKSTEP_CHECK_MPI(MPI_Type_commit(&bf16_));
  LOCKSTEP_CHECK_MPI(MPI_Op_create(&f16_sum_op, /*commute=*/1, &f16_sum_));
  LOCKSTEP_CHECK_MPI(MPI_Op_create(&bf16_sum_op, /*commute=*/1, &bf16_sum_));
}

MpiTypes::~MpiTypes() {
  if (mpi_finalized()) return;
  MPI_Op_free(&f16_sum_);
  MPI_Op_free(&bf16_sum_);
  MPI_Type_free(&f16_);
  MPI_Type_free(&bf16_);
}

MPI_Datatype MpiTypes::reducible(DType dtype) const {
  return dtype == DType::f16 ? f16_ : dtype == DType::bf16 ? bf16_ : MPI_FLOAT;
}

MPI_Op MpiTypes::sum(DType dtype) const {
  return dtype == DType::f16 ? f16_sum_ : dtype == DType::bf16 ? bf16_sum_ : MPI_SUM;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string label,
                                 std::shared_ptr<const MpiTypes> types,
                                 std::shared_ptr<Watchdog> watchdog)
    : Communicator(comm_rank(comm), comm_size(comm), core::Device::cpu(), std::move(label),
                   std::move(watchdog)),
      comm_(comm),
      types_(std::move(types)) {
  LOCKSTEP_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

MpiCommunicator::~MpiCommunicator() {
  if (!mpi_finalized()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::do_allreduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                                   const core::Stream&) {
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(dtype));
  const std::int64_t chunk = kMaxChunkBytes / element;
  {
    Watchdog::Scope scope(watchdog().get(), next_operation("allreduce", count, dtype));
    for (std::int64_t done = 0; done < count; done += chunk) {
      const int n = static_cast<int>(std::min(chunk, count - done));
      LOCKSTEP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(data) + done * element, n,
                                       types_->reducible(dtype), types_->sum(dtype), comm_));
    }
  }
  if (op == ReduceOp::avg) scale_to_mean(data, count, dtype, size());
}

void MpiCommunicator::do_broadcast(void* data, std::int64_t count, DType dtype, int root,
                                   const core::Stream&) {
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  Watchdog::Scope scope(watchdog().get(), next_operation("broadcast", count, dtype));
  for (std::int64_t done = 0; done < bytes; done += kMaxChunkBytes) {
    const int n = static_cast<int>(std::min(kMaxChunkBytes, bytes - done));
    LOCKSTEP_CHECK_MPI(MPI_Bcast(static_cast<char*>(data) + done, n, MPI_BYTE, root, comm_));
  }
}

void MpiCommunicator::do_allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                                   const core::Stream&) {
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  const int n = int_count("allgather", label(), bytes, "bytes");
  const bool in_place = send == static_cast<const char*>(recv) + rank() * bytes;
  Watchdog::Scope scope(watchdog().get(), next_operation("allgather", count, dtype));
  LOCKSTEP_CHECK_MPI(
      MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_));
}

void MpiCommunicator::do_alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                                  const core::Stream&) {
  const std::int64_t bytes = count * static_cast<std::int64_t>(dtype_size(dtype));
  const int n = int_count("alltoall", label(), bytes, "bytes");
  Watchdog::Scope scope(watchdog().get(), next_operation("alltoall", count, dtype));
  LOCKSTEP_CHECK_MPI(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_));
}

void MpiCommunicator::do_reduce_scatter(const void* send, void* recv, std::int64_t count,
                                        DType dtype, ReduceOp op, const core::Stream&) {
  const int n = int_count("reduce_scatter", label(), count, "elements");
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  const bool in_place = recv == static_cast<const char*>(send) + rank() * bytes;
  {
    Watchdog::Scope scope(watchdog().get(), next_operation("reduce_scatter", count, dtype));
    if (in_place) {
      // MPI_IN_PLACE reads every slice from the receive buffer and leaves the
      // result at its start; the caller's slice is further in.
      void* all = const_cast<void*>(send);
      LOCKSTEP_CHECK_MPI(MPI_Reduce_scatter_block(MPI_IN_PLACE, all, n, types_->reducible(dtype),
                                                  types_->sum(dtype), comm_));
      if (bytes > 0) std::memmove(recv, all, bytes);
    } else {
      LOCKSTEP_CHECK_MPI(MPI_Reduce_scatter_block(send, recv, n, types_->reducible(dtype),
                                                  types_->sum(dtype), comm_));
    }
  }
  if (op == ReduceOp::avg) scale_to_mean(recv, count, dtype, size());
}

void MpiCommunicator::do_barrier() {
  Watchdog::Scope scope(watchdog().get(), next_operation("barrier", 0, DType::u8));
  LOCKSTEP_CHECK_MPI(MPI_Barrier(comm_));
}

std::unique_ptr<Communicator> MpiCommunicator::do_duplicate(std::string label) {
  MPI_Comm dup = MPI_COMM_NULL;
  {
    Watchdog::Scope scope(watchdog().get(), next_operation("duplicate", 0, DType::u8));
    LOCKSTEP_CHECK_MPI(MPI_Comm_dup(comm_, &dup));
  }
  return std::make_unique<MpiCommunicator>(dup, std::move(label), types_, watchdog());
}

}  // namespace lockstep::comm::detail
