// Device parsing and GPU discovery (engine/core/device.h).
#include "engine/core/device.h"

#include <charconv>
#include <mutex>
#include <string>

#include "engine/core/versions.h"
#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace lockstep::core {

std::string Device::str() const { return is_cuda() ? "cuda:" + std::to_string(index) : "cpu"; }

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.substr(0, 5) == "cuda:") {
    int index = -1;
    const auto digits = text.substr(5);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0)
      return Device::cuda(index);
  }
  throw InvalidArgument("device '" + std::string(text) + "' is not cpu, cuda or cuda:N");
}

int cuda_device_count() {
#if LOCKSTEP_WITH_CUDA
  static const int count = [] {
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    // No driver, or a driver without devices, means "no GPU" (Note: not an error).
    if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver ||
        status == cudaErrorInitializationError) {
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return 0;
    }
    LOCKSTEP_CHECK_CUDA(status);
    if (n > 0) check_library_versions();
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

void require_usable(Device device) {
  if (!device.is_cuda()) return;
#if LOCKSTEP_WITH_CUDA
  const int count = cuda_device_count();
  if (count == 0)
    throw InvalidArgument("device " + device.str() +
                          " requested, but no GPU is usable here (pass Device::cpu() instead)");
  if (device.index >= count)
    throw InvalidArgument("device " + device.str() + " requested, but only " +
                          std::to_string(count) +
                          " GPU(s) are visible (check CUDA_VISIBLE_DEVICES)");
#else
  throw InvalidArgument("device " + device.str() +
                        " requested, but lockstep was built without CUDA (LOCKSTEP_WITH_CUDA=OFF)");
#endif
}

void set_current_device(Device device) {
  if (!device.is_cuda()) return;
  require_usable(device);
#if LOCKSTEP_WITH_CUDA
  LOCKSTEP_CHECK_CUDA(cudaSetDevice(device.index));
#endif
}

}  // namespace lockstep::core
