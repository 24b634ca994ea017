// CaptureArena and CaptureArenaScope: the memory a CUDA graph's captured
// work allocates from, and what keeps the memory a live graph may read from
// being handed to anyone else (Note [capture arena]); BlockList, the host-side
// placement of its blocks. Storage (engine/core/memory.h) frees into it.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>

#include "engine/core/device.h"
#include "engine/core/memory.h"

namespace lockstep::core {

namespace detail {
// First-fit placement of blocks in a region of `bytes`, on the host: offsets
// 256-aligned, freed neighbours merged. What CaptureArena places its
// tensors with; a class of its own so that the CPU tests can check it.
class BlockList {
 public:
  explicit BlockList(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) free_[0] = bytes;
  }
  // The offset of a new block of `bytes` (rounded up to 256), or none when no
  // free run is long enough.
  std::optional<std::size_t> take(std::size_t bytes);
  // Returns the block that take() placed at `offset` for `bytes`.
  void give_back(std::size_t offset, std::size_t bytes);
  std::size_t free_bytes() const;
  std::size_t bytes() const { return bytes_; }
  static std::size_t rounded(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

 private:
  std::size_t bytes_;
  std::map<std::size_t, std::size_t> free_;  // offset -> length of each free run
};
}  // namespace detail

// Note [capture arena]: work captured into a CUDA graph keeps the addresses
// it was captured with, and replays read and write them with no host code
// running, so the memory a graph uses must stay the graph's for its life:
//   - what the captured work allocates comes from the arena, while a
//     CaptureArenaScope lives on the capturing thread: chunks of plain
//     cudaMalloc memory (allowed in the relaxed capture mode, and not
//     recorded), blocks placed by a BlockList, a new chunk (at least 256 MiB)
//     when none has room. Only a capture takes blocks, and a new capture
//     comes after the old graph is gone (end_graph), so a block freed after
//     the capture by whoever held it goes back to the BlockList and is never
//     anyone else's while the graph may still use it;
//   - pool memory allocated before the capture began (begin_graph) may have
//     been read by captured work (a module's cached tensor, the eager step's
//     leftovers that the capture dropped; cudaFreeAsync in a capturing
//     stream must be given the graph's own memory anyway): freed while the
//     graph lives, on any thread, it is kept, not freed, until end_graph.
//     Pool allocations are numbered to tell which came before. What is kept
//     is at most what modules held across the capture, once.
// The chunks go back when the arena and every storage placed in it are gone;
// the owner makes sure no launch of the graph is still running first. Memory
// statistics count the storages placed in the arena, as the pool's would be
// counted, and kept memory until it is freed: reserved_bytes() says how much
// the arena's chunks hold.
class CaptureArena {
 public:
  explicit CaptureArena(Device device);
  ~CaptureArena();
  CaptureArena(const CaptureArena&) = delete;
  CaptureArena& operator=(const CaptureArena&) = delete;

  Device device() const;
  std::size_t reserved_bytes() const;  // the chunks'
  std::size_t kept_bytes() const;      // pool memory kept for the graph
  // A graph's capture begins: pool memory allocated before now and freed
  // before end_graph() is kept. Ends any earlier graph's first.
  void begin_graph();
  // The graph is gone and no launch of it runs: kept memory is freed.
  void end_graph();

 private:
  friend class CaptureArenaScope;
  std::shared_ptr<detail::ArenaState> state_;
};

// Routes this thread's device allocations and frees through `arena` while it
// lives (Note [capture arena]); scopes do not nest.
class CaptureArenaScope {
 public:
  explicit CaptureArenaScope(CaptureArena& arena);
  ~CaptureArenaScope();
  CaptureArenaScope(const CaptureArenaScope&) = delete;
  CaptureArenaScope& operator=(const CaptureArenaScope&) = delete;
};

}  // namespace lockstep::core
