// MpiCommunicator: collectives on host buffers over an MPI communicator, each
// one blocking call under the watchdog. OpenMPI 4.1 has no f16/bf16 datatypes
// and no MPI_AVG: 16-bit floats reduce through user-defined ops (MpiTypes) and
// avg is the sum times 1/size(). Private to comm/ (it includes mpi.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace lockstep::comm::detail {

// The datatypes and sum ops for f16 and bf16, created once after MPI_Init by
// the World and freed before MPI_Finalize (later owners skip the free).
class MpiTypes {
 public:
  MpiTypes();
  ~MpiTypes();
  MpiTypes(const MpiTypes&) = delete;
  MpiTypes& operator=(const MpiTypes&) = delete;

  MPI_Datatype reducible(DType dtype) const;  // MPI_FLOAT, or ours for f16 and bf16
  MPI_Op sum(DType dtype) const;              // MPI_SUM, or ours for f16 and bf16

 private:
  MPI_Datatype f16_ = MPI_DATATYPE_NULL;
  MPI_Datatype bf16_ = MPI_DATATYPE_NULL;
  MPI_Op f16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes `comm` over: MPI_Comm_free on destruction unless MPI is finalized.
  // Errors on it are returned (MPI_ERRORS_RETURN) and thrown as LibraryError.
  MpiCommunicator(MPI_Comm comm, std::string label, std::shared_ptr<const MpiTypes> types,
                  std::shared_ptr<Watchdog> watchdog);
  ~MpiCommunicator() override;
  const char* backend() const override { return "mpi"; }
  MPI_Comm handle() const { return comm_; }

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
  void do_barrier() override;
  std::unique_ptr<Communicator> do_duplicate(std::string label) override;

  MPI_Comm comm_;
  std::shared_ptr<const MpiTypes> types_;
};

}  // namespace lockstep::comm::detail
