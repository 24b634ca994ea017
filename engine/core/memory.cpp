// Allocators and their counters, and the capture arena (engine/core/memory.h).
#include "engine/core/memory.h"

#include <malloc.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/log.h"
#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#include "kernels/cuda/pool.h"
#endif

namespace lockstep::core {
namespace {

constexpr std::size_t kCpuAlignment = 256;  // as cudaMalloc: flat-buffer views stay aligned
constexpr int kMaxGpus = 64;

thread_local MemoryKind t_kind = MemoryKind::other;

// Note [memory kinds]: the kinds' split of the peak is copied when a new peak
// is reached (rare once training runs: the same step allocates alike), under
// a mutex, so that the copy is of one moment; allocations that race with it
// on other threads may land on either side of it.
struct Counter {
  std::atomic<std::size_t> current{0};
  std::atomic<std::size_t> peak{0};
  std::atomic<std::size_t> allocations{0};
  std::array<std::atomic<std::size_t>, kMemoryKinds> by_kind{};
  std::mutex peak_mutex;
  std::array<std::size_t, kMemoryKinds> peak_by_kind{};
  std::array<std::atomic<std::size_t>, kMemoryKinds> kind_peak{};  // each kind's own highest

  void add(std::size_t bytes, MemoryKind kind) {
    allocations.fetch_add(1);
    const std::size_t k = static_cast<std::size_t>(kind);
    const std::size_t of_kind = by_kind[k].fetch_add(bytes) + bytes;
    std::size_t kind_seen = kind_peak[k].load();
    while (of_kind > kind_seen && !kind_peak[k].compare_exchange_weak(kind_seen, of_kind)) {
    }
    const std::size_t now = current.fetch_add(bytes) + bytes;
    std::size_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    if (now > seen) snapshot();
  }
  void sub(std::size_t bytes, MemoryKind kind) {
    by_kind[static_cast<std::size_t>(kind)].fetch_sub(bytes);
    current.fetch_sub(bytes);
  }
  void snapshot() {
    std::lock_guard lock(peak_mutex);
    for (std::size_t k = 0; k < kMemoryKinds; ++k) peak_by_kind[k] = by_kind[k].load();
  }
};

Counter g_host;
std::array<Counter, kMaxGpus> g_gpus;

Counter& counter(Device device) {
  if (!device.is_cuda()) return g_host;
  if (device.index < 0 || device.index >= kMaxGpus)
    throw InvalidArgument("device " + device.str() + " is outside the supported range cuda:0..63");
  return g_gpus[device.index];
}

#if LOCKSTEP_WITH_CUDA
// Raise the pool's release threshold once per device, so that memory freed
// back to the pool stays there between steps instead of returning to the OS.
// What it caches goes back when an allocation fails (Note [pool retry]).
void configure_pool(int device) {
  static std::once_flag flags[kMaxGpus];
  std::call_once(flags[device], [device] {
    cudaMemPool_t pool = nullptr;
    LOCKSTEP_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
    std::uint64_t threshold = UINT64_MAX;
    LOCKSTEP_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
}

// Note [pool retry]: the pool keeps every freed block (threshold unlimited),
// so memory that something outside it took since (cuDNN, NCCL, another
// process) can leave a request unservable while the pool holds enough free
// memory in other blocks. On cudaErrorMemoryAllocation the pool's cache goes
// back to the device and the request is tried once more, as PyTorch's caching
// allocator frees its cached blocks and retries.
void* allocate_device(Device device, std::size_t bytes, const Stream& stream) {
  void* p = nullptr;
  cudaError_t status = cudaMallocAsync(&p, bytes, stream.handle());
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky: clear it, or the next launch check would report it
    kernels::cuda::detail::release_pool_memory(device.index);
    status = cudaMallocAsync(&p, bytes, stream.handle());
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaGetLastError();
    throw LibraryError("CUDA", status,
                       "out of memory on " + device.str() + " allocating " + std::to_string(bytes) +
                           " bytes: lockstep holds " +
                           std::to_string(g_gpus[device.index].current.load()) + " bytes, " +
                           std::to_string(free_bytes) + " of " + std::to_string(total_bytes) +
                           " are free after releasing the pool's cache (reduce the batch size)");
  }
  LOCKSTEP_CHECK_CUDA(status);
  return p;
}

// Destructors cannot throw: a failed free is logged and its error cleared, so
// that the next launch's check does not report it as its own. At exit, after
// the runtime has unloaded, the driver reclaims everything: nothing to say.
void report_free_failure(cudaError_t status, const char* call, Device device) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  if (status == cudaErrorCudartUnloading) return;
  log_warn("{} on {} failed: {}: {}", call, device.str(), cudaGetErrorName(status),
           cudaGetErrorString(status));
}

// Note [device free]: a zero-byte allocation holds no pointer and frees
// nothing (cudaFreeAsync is not documented to take null). A null stream
// handle is the legacy default stream of the *current* device, so the free
// is ordered there with the allocation's device current, then the caller's
// device is restored (the last reference may drop on any thread).
void free_device(void* data, Device device, const Stream& stream) {
  if (!data) return;
  int current = device.index;
  if (!stream.handle() && cudaGetDevice(&current) != cudaSuccess) current = device.index;
  const bool switch_device = current != device.index;
  cudaError_t status = switch_device ? cudaSetDevice(device.index) : cudaSuccess;
  if (status == cudaSuccess) status = cudaFreeAsync(data, stream.handle());
  report_free_failure(status, "cudaFreeAsync", device);
  if (switch_device) report_free_failure(cudaSetDevice(current), "cudaSetDevice", device);
}
#endif

// Note [host heap]: glibc serves blocks of 128 KiB and more with a fresh mmap
// and unmaps them on free, so a training step that allocates its activations
// anew page-faults through every one of them (about 10 ms a step for cnn at
// batch 64). Raising the mmap and trim thresholds once keeps freed blocks in
// the heap for reuse, which is what a caching allocator would buy.
void keep_freed_blocks() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
}

void* aligned_host(std::size_t bytes) {
  keep_freed_blocks();
  const std::size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* p = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
  if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  return p;
}

}  // namespace

// Note [capture arena]. Its storages may be freed on any thread, so a mutex.
struct detail::ArenaState : std::enable_shared_from_this<detail::ArenaState> {
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

namespace {
// The arena this thread allocates from now (Note [capture arena]).
thread_local detail::ArenaState* t_arena = nullptr;
constexpr std::size_t kArenaChunkBytes = std::size_t{256} << 20;
// Device allocations from the pool are numbered, so that a free can tell
// whether a live graph may have been captured reading the memory.
std::atomic<std::uint64_t> g_serial{1};
// The arenas whose graph lives: few (one per graph-stepped model), looked at
// on every free of pool memory only while there is one.
std::mutex g_live_mutex;
std::vector<detail::ArenaState*> g_live;
std::atomic<int> g_live_count{0};

// Note [capture arena]: a live graph, on `device`, captured after pool memory
// `serial` was allocated: the memory goes to its kept list instead of the pool.
bool keep_for_graph(void* data, std::size_t bytes, Device device, std::uint64_t serial,
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
}  // namespace

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
  const std::size_t size = std::max(kArenaChunkBytes, BlockList::rounded(bytes));
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
#if LOCKSTEP_WITH_CUDA
  for (Kept& k : going) {
    free_device(k.data, device, k.stream);
    counter(device).sub(k.bytes, k.kind);
  }
#endif
}

detail::ArenaState::~ArenaState() {
  free_kept();
#if LOCKSTEP_WITH_CUDA
  for (Chunk& c : chunks) report_free_failure(cudaFree(c.base), "cudaFree", device);
#endif
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

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::parameters:
      return "parameters";
    case MemoryKind::gradients:
      return "gradients";
    case MemoryKind::optimizer_state:
      return "optimizer_state";
    case MemoryKind::activations:
      return "activations";
    case MemoryKind::communication:
      return "communication";
    case MemoryKind::workspace:
      return "workspace";
    case MemoryKind::gathered:
      return "gathered";
    case MemoryKind::other:
      break;
  }
  return "other";
}

MemoryKind current_memory_kind() { return t_kind; }

MemoryKindScope::MemoryKindScope(MemoryKind kind) : previous_(t_kind) { t_kind = kind; }

MemoryKindScope::~MemoryKindScope() { t_kind = previous_; }

Storage::~Storage() {
  if (arena_) {  // Note [capture arena]
    counter(device_).sub(bytes_, kind_);
    arena_->give_back(data_, bytes_);
    return;
  }
  // Note [capture arena]: kept for a live graph, counted until freed.
  if (device_.is_cuda() && data_ && keep_for_graph(data_, bytes_, device_, serial_, kind_, stream_))
    return;
  counter(device_).sub(bytes_, kind_);
#if LOCKSTEP_WITH_CUDA
  if (device_.is_cuda()) {
    free_device(data_, device_, stream_);
    return;
  }
  if (pinned_) {
    report_free_failure(cudaFreeHost(data_), "cudaFreeHost", device_);
    return;
  }
#endif
  std::free(data_);
}

std::shared_ptr<Storage> allocate(Device device, std::size_t bytes, const Stream& stream) {
  if (!device.is_cuda()) {
    void* p = aligned_host(bytes);
    counter(device).add(bytes, t_kind);
    return std::make_shared<Storage>(p, bytes, device, false, Stream());
  }
  require_usable(device);
#if LOCKSTEP_WITH_CUDA
  if (stream.device().is_cuda() && !(stream.device() == device))
    throw InvalidArgument("allocation on " + device.str() + " ordered on a stream of " +
                          stream.device().str() + " (use a stream of the same device)");
  set_current_device(device);
  if (t_arena && t_arena->device == device && bytes > 0) {  // Note [capture arena]
    void* p = t_arena->take(bytes);
    counter(device).add(bytes, t_kind);
    auto storage = std::make_shared<Storage>(p, bytes, device, false, stream);
    storage->set_arena(t_arena->shared_from_this());
    return storage;
  }
  configure_pool(device.index);
  void* p = bytes > 0 ? allocate_device(device, bytes, stream) : nullptr;
  counter(device).add(bytes, t_kind);
  const Stream owner = stream.device().is_cuda() ? stream : Stream::default_for(device);
  auto storage = std::make_shared<Storage>(p, bytes, device, false, owner);
  storage->set_serial(g_serial.fetch_add(1));
  return storage;
#else
  (void)stream;
  return nullptr;  // unreachable: require_usable throws on CPU builds
#endif
}

std::shared_ptr<Storage> allocate_pinned(std::size_t bytes) {
#if LOCKSTEP_WITH_CUDA
  if (cuda_available()) {
    void* p = nullptr;
    LOCKSTEP_CHECK_CUDA(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable));
    g_host.add(bytes, t_kind);
    return std::make_shared<Storage>(p, bytes, Device::cpu(), true, Stream());
  }
#endif
  void* p = aligned_host(bytes);
  g_host.add(bytes, t_kind);
  return std::make_shared<Storage>(p, bytes, Device::cpu(), false, Stream());
}

MemoryStats memory_stats(Device device) {
  Counter& c = counter(device);
  MemoryStats s{c.current.load(), c.peak.load(), c.allocations.load(), {}};
  std::lock_guard lock(c.peak_mutex);
  s.peak_by_kind = c.peak_by_kind;
  for (std::size_t k = 0; k < kMemoryKinds; ++k) {
    s.current_by_kind[k] = c.by_kind[k].load();
    s.kind_peak_bytes[k] = c.kind_peak[k].load();
  }
  return s;
}

void reset_peak_memory(Device device) {
  Counter& c = counter(device);
  c.peak = c.current.load();
  c.snapshot();
  for (std::size_t k = 0; k < kMemoryKinds; ++k) c.kind_peak[k] = c.by_kind[k].load();
}

}  // namespace lockstep::core
