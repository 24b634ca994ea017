// NcclCommunicator and the NCCL bootstrap (comm/detail/nccl_communicator.h).
#include "comm/detail/nccl_communicator.h"

#include <fmt/core.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>

#include "comm/detail/check_nccl.h"
#include "engine/core/trace.h"
#include "kernels/error.h"

namespace lockstep::comm::detail {
namespace {

std::mutex g_registry_mutex;
std::set<NcclCommunicator*> g_registry;  // live communicators, for abort_all()

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclAvg; }

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int rank, int size, core::Device device,
                                   std::string label, std::shared_ptr<Watchdog> watchdog)
    : Communicator(rank, size, device, std::move(label), std::move(watchdog)),
      comm_(comm),
      stream_(core::Stream::create(device)),
      barrier_word_(core::Tensor::zeros({1}, DType::f32, device, stream_)) {
  core::trace::set_stream_name(stream_, "nccl stream " + this->label());
  {
    std::lock_guard lock(g_registry_mutex);
    g_registry.insert(this);
  }
  if (this->watchdog())
    error_source_ = this->watchdog()->add_error_source([this]() -> std::optional<std::string> {
      if (aborted_) return std::nullopt;
      ncclResult_t state = ncclSuccess;
      const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
      if (query != ncclSuccess)
        return fmt::format("ncclCommGetAsyncError failed on '{}': {}", this->label(),
                           nccl_error_text(query));
      if (state == ncclSuccess || state == ncclInProgress) return std::nullopt;
      return fmt::format("NCCL reported an asynchronous error on '{}': {}", this->label(),
                         nccl_error_text(state));
    });
}

NcclCommunicator::~NcclCommunicator() {
  // Unregister first: remove_error_source waits for a poll in progress.
  if (watchdog() && error_source_ >= 0) watchdog()->remove_error_source(error_source_);
  {
    std::lock_guard lock(g_registry_mutex);
    g_registry.erase(this);
  }
  // Destructors do not throw: a failing destroy means the communicator is
  // already broken, and the error that broke it has been reported.
  if (!aborted_) {
    cudaStreamSynchronize(stream_.handle());
    ncclCommDestroy(comm_);
  }
}

void NcclCommunicator::abort() {
  if (aborted_.exchange(true)) return;
  ncclCommAbort(comm_);
}

void NcclCommunicator::abort_all() {
  std::lock_guard lock(g_registry_mutex);
  for (NcclCommunicator* comm : g_registry) comm->abort();
}

template <typename Enqueue>
void NcclCommunicator::run(OperationInfo info, const core::Stream& stream, Enqueue&& enqueue) {
  if (stream.device().is_cuda() && !(stream.device() == device()))
    throw InvalidArgument(fmt::format("{} on '{}': stream of {} given to a communicator of {}",
                                      info.name, label(), stream.device().str(), device().str()));
  const core::Stream& s = stream.device().is_cuda() ? stream : stream_;
  core::set_current_device(device());
  {
    Watchdog::Scope enqueueing(watchdog().get(), info, /*enqueue_only=*/true);
    // The collective's start and end on the stream's track, beside the host's
    // "enqueue ..." span (docs/tracing.md); its name is formatted only when traced.
    std::optional<core::trace::GpuSpan> running;
    if (core::trace::traced())
      running.emplace(s, info.name, OperationContext::current_bucket_label(), "comm");
    LOCKSTEP_CHECK_NCCL(enqueue(s.handle()));
  }
  // Captured into a CUDA graph (a world of one: Note [step graph]), the
  // collective runs only at the graph's launch, and its event cannot be
  // polled: the watchdog does not watch it.
  if (s.capturing()) return;
  core::Event done;
  done.record(s);
  // The watchdog thread polls the event; it makes this rank's GPU current
  // first, or CUDA would create a context on GPU 0 for that thread.
  if (watchdog())
    watchdog()->watch_async(std::move(info), [done, gpu = device()] {
      core::set_current_device(gpu);
      return done.ready();
    });
  if (!stream.device().is_cuda()) s.synchronize();
}

void NcclCommunicator::do_allreduce(void* data, std::int64_t count, DType dtype, ReduceOp op,
                                    const core::Stream& stream) {
  run(next_operation("allreduce", count, dtype), stream, [&](cudaStream_t s) {
    return ncclAllReduce(data, data, static_cast<std::size_t>(count), nccl_type(dtype), nccl_op(op),
                         comm_, s);
  });
}

void NcclCommunicator::do_broadcast(void* data, std::int64_t count, DType dtype, int root,
                                    const core::Stream& stream) {
  run(next_operation("broadcast", count, dtype), stream, [&](cudaStream_t s) {
    return ncclBroadcast(data, data, static_cast<std::size_t>(count), nccl_type(dtype), root, comm_,
                         s);
  });
}

void NcclCommunicator::do_allgather(const void* send, void* recv, std::int64_t count, DType dtype,
                                    const core::Stream& stream) {
  run(next_operation("allgather", count, dtype), stream, [&](cudaStream_t s) {
    return ncclAllGather(send, recv, static_cast<std::size_t>(count), nccl_type(dtype), comm_, s);
  });
}

void NcclCommunicator::do_reduce_scatter(const void* send, void* recv, std::int64_t count,
                                         DType dtype, ReduceOp op, const core::Stream& stream) {
  run(next_operation("reduce_scatter", count, dtype), stream, [&](cudaStream_t s) {
    return ncclReduceScatter(send, recv, static_cast<std::size_t>(count), nccl_type(dtype),
                             nccl_op(op), comm_, s);
  });
}

// NCCL has no alltoall: grouped point-to-point calls, one send and one
// receive per peer, are its documented form of one.
void NcclCommunicator::do_alltoall(const void* send, void* recv, std::int64_t count, DType dtype,
                                   const core::Stream& stream) {
  const std::size_t n = static_cast<std::size_t>(count);
  const std::size_t bytes = n * dtype_size(dtype);
  run(next_operation("alltoall", count, dtype), stream, [&](cudaStream_t s) {
    ncclResult_t result = ncclGroupStart();
    for (int peer = 0; peer < size() && result == ncclSuccess; ++peer) {
      const auto at = static_cast<std::size_t>(peer) * bytes;
      result = ncclSend(static_cast<const char*>(send) + at, n, nccl_type(dtype), peer, comm_, s);
      if (result == ncclSuccess)
        result = ncclRecv(static_cast<char*>(recv) + at, n, nccl_type(dtype), peer, comm_, s);
    }
    const ncclResult_t ended = ncclGroupEnd();
    return result != ncclSuccess ? result : ended;
  });
}

void NcclCommunicator::do_barrier() {
  run(next_operation("barrier", 1, DType::f32), core::Stream(), [&](cudaStream_t s) {
    return ncclAllReduce(barrier_word_.data(), barrier_word_.data(), 1, ncclFloat32, ncclSum, comm_,
                         s);
  });
}

std::unique_ptr<Communicator> NcclCommunicator::do_duplicate(std::string label) {
  ncclComm_t dup = nullptr;
  core::set_current_device(device());
  {
    Watchdog::Scope scope(watchdog().get(), next_operation("duplicate", 0, DType::u8));
    LOCKSTEP_CHECK_NCCL(ncclCommSplit(comm_, /*color=*/0, rank(), &dup, nullptr));
  }
  return std::make_unique<NcclCommunicator>(dup, rank(), size(), device(), std::move(label),
                                            watchdog());
}

std::unique_ptr<NcclCommunicator> create_nccl_world(Communicator& host, core::Device device,
                                                    std::shared_ptr<Watchdog> watchdog) {
  core::set_current_device(device);
  // Note [NCCL connects at init]: NCCL 2.22 and later connect peers and
  // allocate their buffers at a communicator's first collective of each kind
  // (NCCL_RUNTIME_CONNECT=1, its default), which for ZeRO-1's reduce-scatter and
  // all-gather is mid-backward, while the memory pool holds the step's peak and
  // its release-and-retry covers only lockstep's own allocations. 0 makes
  // ncclCommInitRank connect every channel instead, before the first step; a
  // value the user set is kept (overwrite 0). Set before NCCL's first call,
  // which reads its parameters once.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  ncclUniqueId id{};
  if (host.rank() == 0) LOCKSTEP_CHECK_NCCL(ncclGetUniqueId(&id));
  host.broadcast(&id, sizeof id, DType::u8, 0);
  ncclComm_t comm = nullptr;
  {
    OperationInfo info;
    info.name = "ncclCommInitRank";
    info.communicator = "world.nccl";
    info.count = host.size();
    info.dtype = DType::u8;
    Watchdog::Scope scope(watchdog.get(), std::move(info));
    LOCKSTEP_CHECK_NCCL(ncclCommInitRank(&comm, host.size(), id, host.rank()));
  }
  return std::make_unique<NcclCommunicator>(comm, host.rank(), host.size(), device, "world.nccl",
                                            std::move(watchdog));
}

}  // namespace lockstep::comm::detail
