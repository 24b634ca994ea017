// Where the GradientSynchronizer's bucket reductions run. Host buffers: on a
// communication thread, because MPI collectives block and OpenMPI makes no
// progress in the background. GPU buffers: on a communication stream, ordered
// after the compute that wrote the gradients by an event, because NCCL calls
// return at once. Either way backward continues while buckets are reduced.
// Host buffers on a machine with no core to spare: on the caller's thread in
// finish(), all at once (Note [host overlap], comm/gradient_synchronizer.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "engine/core/stream.h"

namespace lockstep::comm::detail {

class BucketRunner {
 public:
  // Reduces bucket `bucket`, its work ordered on `stream` (the CPU stream on
  // the communication thread).
  using Reduce = std::function<void(std::size_t bucket, const core::Stream& stream)>;

  virtual ~BucketRunner() = default;
  // Starts the reduction of a bucket whose gradients are all written.
  virtual void launch(std::size_t bucket) = 0;
  // Host: returns once every launched bucket is reduced, rethrowing the first
  // error. GPU: makes the compute stream wait for every launched bucket.
  virtual void wait_all() = 0;
};

std::unique_ptr<BucketRunner> make_thread_runner(BucketRunner::Reduce reduce);
// Host buffers without overlap: wait_all reduces the launched buckets, in
// order, on the calling thread (Note [host overlap]).
std::unique_ptr<BucketRunner> make_deferred_runner(BucketRunner::Reduce reduce);
std::unique_ptr<BucketRunner> make_stream_runner(BucketRunner::Reduce reduce,
                                                 core::Stream compute_stream,
                                                 core::Stream comm_stream);

}  // namespace lockstep::comm::detail
