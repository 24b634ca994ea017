// CaptureArena, CaptureArenaScope and BlockList (engine/core/capture_arena.h):
// Note [capture arena].
#include "engine/core/capture_arena.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <string>

#include "engine/core/detail/capture_arena_state.h"
#include "engine/core/log.h"
#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace lockstep::core {

namespace {
// The arena this thread allocates from now (Note [capture arena]).
thread_local detail::ArenaState* t_arena = nullptr;
// Device allocations from the pool are numbered, so that a free can tell
// whether a live graph may have been captured reading the memory.
std::atomic<std::uint64_t> g_serial{1};
// The arenas whose graph lives: few (one per graph-stepped model), looked at
// on every free of pool memory only while there is one.
std::mutex g_live_mutex;
std::vector<detail::ArenaState*> g_live;
std::atomic<int> g_live_count{0};

}  // namespace

detail::ArenaState* detail::thread_arena() { return t_arena; }

std::uint64_t detail::next_allocation_serial() { return g_serial.fetch_add(1); }

// A live graph on `device` captured after pool memory `serial` was allocated
// takes the memory into its kept list instead of the pool.
bool detail::keep_for_graph(void* data, std::size_t bytes, Device device, std::uint64_t serial,
                            MemoryKind kind, const Stream& stream) {
  if (g_live_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(g_live_mutex);
  for (detail::ArenaState* a : g_live) {
    if (!(a->device == device)) continue;
    std::lock_guard arena_lock(a->mutex);
    if (a->graph_serial > serial) {
      a->kept.push_back({data, bytes, kind, stream});
      return true;
    }
  }
  return false;
}

std::optional<std::size_t> detail::BlockList::take(std::size_t bytes) {
  const std::size_t want = rounded(bytes == 0 ? 1 : bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const std::size_t offset = it->first, left = it->second - want;
    free_.erase(it);
    if (left > 0) free_[offset + want] = left;
    return offset;
  }
  return std::nullopt;
}

void detail::BlockList::give_back(std::size_t offset, std::size_t bytes) {
  std::size_t length = rounded(bytes == 0 ? 1 : bytes);
  if (offset + length > bytes_)
    throw InvalidArgument("BlockList::give_back: block [" + std::to_string(offset) + ", +" +
                          std::to_string(length) + ") lies outside the region of " +
                          std::to_string(bytes_) + " bytes");
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first < offset + length)
    throw InvalidArgument("BlockList::give_back: block at " + std::to_string(offset) +
                          " overlaps a free run (given back twice?)");
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset)
      throw InvalidArgument("BlockList::give_back: block at " + std::to_string(offset) +
                            " overlaps a free run (given back twice?)");
    if (prev->first + prev->second == offset) {  // merge with the run before
      offset = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + length) {  // and the run after
    length += next->second;
    free_.erase(next);
  }
  free_[offset] = length;
}

std::size_t detail::BlockList::free_bytes() const {
  std::size_t sum = 0;
  for (const auto& [offset, length] : free_) sum += length;
  return sum;
}

void* detail::ArenaState::take(std::size_t bytes) {
  std::lock_guard lock(mutex);
  for (Chunk& c : chunks)
    if (const auto offset = c.blocks.take(bytes)) return static_cast<char*>(c.base) + *offset;
#if LOCKSTEP_WITH_CUDA
  constexpr std::size_t kChunkBytes = std::size_t{256} << 20;  // at least
  const std::size_t size = std::max(kChunkBytes, BlockList::rounded(bytes));
  void* base = nullptr;
  const cudaError_t status = cudaMalloc(&base, size);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw LibraryError("CUDA", status,
                       "out of memory on " + device.str() + " growing the CUDA graph's arena by " +
                           std::to_string(size) + " bytes for a tensor of " +
                           std::to_string(bytes) +
                           " (Note [capture arena]; reduce the batch size "
                           "or turn the CUDA graph step off)");
  }
  chunks.push_back({base, BlockList(size)});
  return static_cast<char*>(base) + *chunks.back().blocks.take(bytes);
#else
  throw InvalidArgument("CaptureArena: this build has no CUDA");
#endif
}

void detail::ArenaState::give_back(void* data, std::size_t bytes) {
  std::lock_guard lock(mutex);
  for (Chunk& c : chunks) {
    char* base = static_cast<char*>(c.base);
    if (static_cast<char*>(data) >= base && static_cast<char*>(data) < base + c.blocks.bytes()) {
      c.blocks.give_back(static_cast<std::size_t>(static_cast<char*>(data) - base), bytes);
      return;
    }
  }
  log_warn("capture arena on {}: a block of {} bytes is not in any of its chunks", device.str(),
           bytes);
}

void detail::ArenaState::free_kept() {
  std::vector<Kept> going;
  {
    std::lock_guard lock(mutex);
    going.swap(kept);
  }
  for (Kept& k : going) release_pool_memory(k.data, k.bytes, device, k.kind, k.stream);
}

detail::ArenaState::~ArenaState() {
  free_kept();
  for (Chunk& c : chunks) release_arena_chunk(c.base, device);
}

CaptureArena::CaptureArena(Device device) : state_(std::make_shared<detail::ArenaState>(device)) {
  if (!device.is_cuda())
    throw InvalidArgument("CaptureArena on " + device.str() + ": only GPU memory is captured");
}

CaptureArena::~CaptureArena() { end_graph(); }

void CaptureArena::begin_graph() {
  end_graph();
  std::lock_guard lock(g_live_mutex);
  {
    std::lock_guard arena_lock(state_->mutex);
    state_->graph_serial = g_serial.load();
  }
  g_live.push_back(state_.get());
  g_live_count.fetch_add(1, std::memory_order_release);
}

void CaptureArena::end_graph() {
  {
    std::lock_guard lock(g_live_mutex);
    const auto it = std::find(g_live.begin(), g_live.end(), state_.get());
    if (it == g_live.end()) return;
    g_live.erase(it);
    g_live_count.fetch_sub(1, std::memory_order_release);
    std::lock_guard arena_lock(state_->mutex);
    state_->graph_serial = 0;
  }
  state_->free_kept();
}

Device CaptureArena::device() const { return state_->device; }

std::size_t CaptureArena::reserved_bytes() const {
  std::lock_guard lock(state_->mutex);
  std::size_t sum = 0;
  for (const auto& c : state_->chunks) sum += c.blocks.bytes();
  return sum;
}

std::size_t CaptureArena::kept_bytes() const {
  std::lock_guard lock(state_->mutex);
  std::size_t sum = 0;
  for (const auto& k : state_->kept) sum += k.bytes;
  return sum;
}

CaptureArenaScope::CaptureArenaScope(CaptureArena& arena) {
  if (t_arena)
    throw InvalidArgument("CaptureArenaScope: this thread already allocates from an arena");
  t_arena = arena.state_.get();
}

CaptureArenaScope::~CaptureArenaScope() { t_arena = nullptr; }

}  // namespace lockstep::core
