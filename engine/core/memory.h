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
//
// Note [memory kinds]: every allocation is counted under one kind, the one
// of the innermost MemoryKindScope on the allocating thread (`other` when
// none): the ParameterStore's buffers are parameters and gradients, the
// optimizer's state buffers optimizer state, the synchroniser's buffers
// communication, what the data-parallel step's forward and backward and an
// evaluation's forward (Trainer::evaluate) allocate activations (their
// kernels' scratch included, unless a scope says workspace: the gradient
// norm's), ZeRO-3's gathered parameter values
// gathered (Note [parameter units]). The data a program loads and what no
// scope names stay `other`. The peak keeps each kind's bytes at the moment of
// the peak, so the kinds add up to it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/core/device.h"
#include "engine/core/stream.h"

namespace lockstep::core {

enum class MemoryKind : std::uint8_t {
  parameters,
  gradients,
  optimizer_state,
  activations,
  communication,
  workspace,
  gathered,
  other,
};
constexpr std::size_t kMemoryKinds = 8;
const char* memory_kind_name(MemoryKind kind);  // "optimizer_state"
// The kind this thread's allocations are counted under now.
MemoryKind current_memory_kind();

// Allocations on this thread are counted as `kind` while it lives (Note
// [memory kinds]); scopes nest, the innermost wins.
class MemoryKindScope {
 public:
  explicit MemoryKindScope(MemoryKind kind);
  ~MemoryKindScope();
  MemoryKindScope(const MemoryKindScope&) = delete;
  MemoryKindScope& operator=(const MemoryKindScope&) = delete;

 private:
  MemoryKind previous_;
};

namespace detail {
// A CaptureArena's chunks, shared with the storages placed in them
// (engine/core/capture_arena.h).
struct ArenaState;
}  // namespace detail

class Storage {
 public:
  Storage(void* data, std::size_t bytes, Device device, bool pinned, Stream stream)
      : data_(data),
        bytes_(bytes),
        device_(device),
        pinned_(pinned),
        kind_(current_memory_kind()),
        stream_(std::move(stream)) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }
  MemoryKind kind() const { return kind_; }
  // Served by a CaptureArena (Note [capture arena]): freed back to it.
  void set_arena(std::shared_ptr<detail::ArenaState> arena) { arena_ = std::move(arena); }
  // The pool allocation's number, in allocation order (Note [capture arena]).
  void set_serial(std::uint64_t serial) { serial_ = serial; }

 private:
  void* data_;
  std::size_t bytes_;
  Device device_;
  bool pinned_;
  MemoryKind kind_;  // Note [memory kinds]: counted under it from allocation to free
  Stream stream_;    // the allocating stream, for cudaFreeAsync
  std::shared_ptr<detail::ArenaState> arena_;  // null: the pool's (or host) memory
  std::uint64_t serial_ = 0;
};

// Device memory on `device` (ordered on `stream` for cuda), or CPU memory.
std::shared_ptr<Storage> allocate(Device device, std::size_t bytes, const Stream& stream = {});
// Page-locked host memory for host-device copies.
std::shared_ptr<Storage> allocate_pinned(std::size_t bytes);

struct MemoryStats {
  std::size_t current_bytes = 0;
  std::size_t peak_bytes = 0;
  std::size_t allocations = 0;  // calls to allocate since the process started
  // Each kind's bytes when the peak was reached (index: MemoryKind); they sum
  // to peak_bytes (Note [memory kinds]).
  std::array<std::size_t, kMemoryKinds> peak_by_kind{};
  std::array<std::size_t, kMemoryKinds> current_by_kind{};  // now
  // Each kind's own highest bytes, reached at any moment since the process
  // started or the last reset_peak_memory (from peak_by_kind[k] up to peak_bytes).
  std::array<std::size_t, kMemoryKinds> kind_peak_bytes{};
};
// Host memory (pinned included) for cpu; pool allocations for cuda:N.
MemoryStats memory_stats(Device device);
// The peak, and every kind's own peak, start again from the bytes held now.
void reset_peak_memory(Device device);

}  // namespace lockstep::core
