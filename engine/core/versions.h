// Start-up check of the CUDA libraries found at run time against the headers
// the build used: the GPU machine's cuDNN, cuBLAS or NCCL can be older than
// the build machine's, and an older major version breaks the ABI.
#pragma once

#include <optional>
#include <string>

namespace lockstep::core {

// Versions are encoded major*10000 + minor*100 + patch (cuDNN 9, cuBLAS 12+,
// NCCL 2.9+ all use this). Older major: throws Error naming both versions.
// Older minor: returns the warning text. Otherwise: nullopt.
std::optional<std::string> compare_library_version(const std::string& library, int built,
                                                   int runtime);

// Runs compare_library_version for cuDNN, cuBLASLt and NCCL and logs warnings.
// Called once by cuda_device_count() when a GPU is present; no-op on CPU builds.
void check_library_versions();

}  // namespace lockstep::core
