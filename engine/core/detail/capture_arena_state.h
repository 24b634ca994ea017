// The capture arena's state (Note [capture arena], engine/core/capture_arena.h)
// and the few calls engine/core/memory.cpp (Storage, allocate) and
// engine/core/capture_arena.cpp make into each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/core/capture_arena.h"
#include "engine/core/device.h"
#include "engine/core/memory.h"
#include "engine/core/stream.h"

namespace lockstep::core::detail {

// Note [capture arena]. Its storages may be freed on any thread, so a mutex.
struct ArenaState : std::enable_shared_from_this<ArenaState> {
  struct Chunk {
    void* base;
    BlockList blocks;
  };
  struct Kept {
    void* data;
    std::size_t bytes;
    MemoryKind kind;
    Stream stream;
  };
  explicit ArenaState(Device d) : device(d) {}
  ~ArenaState();
  void* take(std::size_t bytes);
  void give_back(void* data, std::size_t bytes);
  void free_kept();

  Device device;
  mutable std::mutex mutex;
  std::vector<Chunk> chunks;
  std::vector<Kept> kept;
  // The allocation serial when the live graph's capture began; 0: no graph.
  std::uint64_t graph_serial = 0;
};

// capture_arena.cpp's, for memory.cpp:
// The arena of this thread's CaptureArenaScope, or null.
ArenaState* thread_arena();
// The next pool allocation's number (allocation order).
std::uint64_t next_allocation_serial();
// Pool memory numbered `serial`, freed now: kept by a live graph's arena
// captured after it was allocated (true), or not (false: free it).
bool keep_for_graph(void* data, std::size_t bytes, Device device, std::uint64_t serial,
                    MemoryKind kind, const Stream& stream);

// memory.cpp's, for the arena: frees pool memory in `stream`'s order and
// stops counting it; gives back a chunk (cudaFree), logging a failure.
void release_pool_memory(void* data, std::size_t bytes, Device device, MemoryKind kind,
                         const Stream& stream);
void release_arena_chunk(void* base, Device device);

}  // namespace lockstep::core::detail
