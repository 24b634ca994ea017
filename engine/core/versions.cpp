// Library version check (engine/core/versions.h).
#include "engine/core/versions.h"

#include <fmt/core.h>

#include "engine/core/log.h"
#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include <cublasLt.h>
#include <cudnn_graph.h>
#include <cudnn_version.h>
#include <nccl.h>

#include "kernels/cuda/check.h"
#endif

namespace lockstep::core {
namespace {
std::string version_text(int v) {
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}
}  // namespace

std::optional<std::string> compare_library_version(const std::string& library, int built,
                                                   int runtime) {
  if (runtime / 10000 < built / 10000) {
    throw Error(fmt::format(
        "{} {} was loaded at run time, but lockstep was built against {}: a newer major version "
        "is required (put a matching {} first on LD_LIBRARY_PATH, or rebuild against {})",
        library, version_text(runtime), version_text(built), library, version_text(runtime)));
  }
  if (runtime / 10000 == built / 10000 && runtime / 100 % 100 < built / 100 % 100) {
    return fmt::format(
        "{} {} was loaded at run time, older than the {} lockstep was built "
        "against; features of the newer minor version are unavailable",
        library, version_text(runtime), version_text(built));
  }
  return std::nullopt;
}

void check_library_versions() {
#if LOCKSTEP_WITH_CUDA
  int nccl_runtime = 0;
  if (ncclGetVersion(&nccl_runtime) != ncclSuccess)
    throw Error("ncclGetVersion failed: libnccl is unusable (check LD_LIBRARY_PATH)");
  const struct {
    const char* name;
    int built;
    int runtime;
  } libraries[] = {
      {"cuDNN", CUDNN_VERSION, static_cast<int>(cudnnGetVersion())},
      {"cuBLASLt", CUBLAS_VERSION, static_cast<int>(cublasLtGetVersion())},
      {"NCCL", NCCL_VERSION_CODE, nccl_runtime},
  };
  for (const auto& lib : libraries) {
    if (auto warning = compare_library_version(lib.name, lib.built, lib.runtime))
      log_warn("{}", *warning);
    log_debug("{} built {} runtime {}", lib.name, version_text(lib.built),
              version_text(lib.runtime));
  }
#endif
}

}  // namespace lockstep::core
