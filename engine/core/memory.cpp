// Allocators and their counters (engine/core/memory.h); Storage frees into
// the capture arena (engine/core/capture_arena.h).
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

#include "engine/core/detail/capture_arena_state.h"
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

void detail::release_pool_memory(void* data, std::size_t bytes, Device device, MemoryKind kind,
                                 const Stream& stream) {
#if LOCKSTEP_WITH_CUDA
  free_device(data, device, stream);
#else
  (void)data, (void)stream;
#endif
  counter(device).sub(bytes, kind);
}

void detail::release_arena_chunk(void* base, Device device) {
#if LOCKSTEP_WITH_CUDA
  report_free_failure(cudaFree(base), "cudaFree", device);
#else
  (void)base, (void)device;
#endif
}

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
  if (device_.is_cuda() && data_ &&
      detail::keep_for_graph(data_, bytes_, device_, serial_, kind_, stream_))
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
  detail::ArenaState* arena = detail::thread_arena();
  if (arena && arena->device == device && bytes > 0) {  // Note [capture arena]
    void* p = arena->take(bytes);
    counter(device).add(bytes, t_kind);
    auto storage = std::make_shared<Storage>(p, bytes, device, false, stream);
    storage->set_arena(arena->shared_from_this());
    return storage;
  }
  configure_pool(device.index);
  void* p = bytes > 0 ? allocate_device(device, bytes, stream) : nullptr;
  counter(device).add(bytes, t_kind);
  const Stream owner = stream.device().is_cuda() ? stream : Stream::default_for(device);
  auto storage = std::make_shared<Storage>(p, bytes, device, false, owner);
  storage->set_serial(detail::next_allocation_serial());
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
