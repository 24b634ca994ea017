// Memory for tensors. CPU: 256-byte aligned, like cudaMalloc (so 256-byte
// aligned views of a flat buffer are aligned in memory too; also cache lines).
// Pinned host: cudaHostAlloc when a GPU is usable, else plain aligned memory.
// GPU: CUDA's stream-ordered pool (cudaMallocAsync), with the release
// threshold raised so freed blocks stay cached and the training loop never
// reaches cudaMalloc; a failed allocation releases the cache and retries once
// (Note [pool retry]). Current and peak bytes are counted per device.
//
// Note [stream-ordered free]: device memory is freed on the stream it was
// allocated on. A caller that uses a buffer on another stream must make the
// allocating stream wait for that work (an Event) before dropping the last
// reference, as with PyTorch's record_stream.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/core/device.h"
#include "engine/core/stream.h"

namespace lockstep::core {

class Storage {
 public:
  Storage(void* data, std::size_t bytes, Device device, bool pinned, Stream stream)
      : data_(data), bytes_(bytes), device_(device), pinned_(pinned), stream_(std::move(stream)) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

 private:
  void* data_;
  std::size_t bytes_;
  Device device_;
  bool pinned_;
  Stream stream_;  // the allocating stream, for cudaFreeAsync
};

// Device memory on `device` (ordered on `stream` for cuda), or CPU memory.
std::shared_ptr<Storage> allocate(Device device, std::size_t bytes, const Stream& stream = {});
// Page-locked host memory for host-device copies.
std::shared_ptr<Storage> allocate_pinned(std::size_t bytes);

struct MemoryStats {
  std::size_t current_bytes = 0;
  std::size_t peak_bytes = 0;
  std::size_t allocations = 0;  // calls to allocate since the process started
};
// Host memory (pinned included) for cpu; pool allocations for cuda:N.
MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);

}  // namespace lockstep::core
