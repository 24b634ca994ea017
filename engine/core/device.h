// Device (cpu, cuda:N) and run-time questions about GPUs. A CUDA build on a
// machine without a GPU or driver answers "no GPU" rather than failing, so all
// CPU work runs there.
#pragma once

#include <string>
#include <string_view>

namespace lockstep::core {

enum class DeviceKind { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool is_cuda() const { return kind == DeviceKind::cuda; }
  std::string str() const;  // "cpu", "cuda:0"
  bool operator==(const Device&) const = default;
};

// "cpu", "cuda" or "cuda:N"; throws InvalidArgument naming the text.
Device parse_device(std::string_view text);

// Visible GPUs; 0 on CPU builds and when there is no GPU or no driver. The
// first call on a CUDA build with a GPU also checks library versions
// (engine/core/versions.h).
int cuda_device_count();
inline bool cuda_available() { return cuda_device_count() > 0; }

// Throws InvalidArgument when `device` is a GPU this process cannot use.
void require_usable(Device device);

// Makes `device` current for this thread (cudaSetDevice); no-op for cpu.
void set_current_device(Device device);

}  // namespace lockstep::core
