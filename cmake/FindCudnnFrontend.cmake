# Finds cudnn-frontend's headers (header-only, for cuDNN's fused attention:
# kernels/cuda/sdpa_cudnn.cpp, Note [one frontend translation unit]) where
# scripts/install-deps.sh unpacks them, or where CUDNN_FRONTEND_INCLUDE_DIR
# (a CMake variable or the environment) points: a folder with
# cudnn_frontend.h. Defines CudnnFrontend_FOUND, CudnnFrontend_VERSION and
# CudnnFrontend_INCLUDE_DIR. Absent, the build goes on without the fused
# attention (the unfused CUDA attention runs), and says so once.
set(lockstep_cudnn_frontend_pin 1.32.0)  # scripts/cudnn-frontend.txt pins the same
if(DEFINED ENV{XDG_CACHE_HOME} AND NOT "$ENV{XDG_CACHE_HOME}" STREQUAL "")
  set(lockstep_cache_home "$ENV{XDG_CACHE_HOME}")
else()
  set(lockstep_cache_home "$ENV{HOME}/.cache")
endif()
find_path(CudnnFrontend_INCLUDE_DIR cudnn_frontend.h
  HINTS ${CUDNN_FRONTEND_INCLUDE_DIR} $ENV{CUDNN_FRONTEND_INCLUDE_DIR}
        "${lockstep_cache_home}/lockstep/cudnn-frontend-${lockstep_cudnn_frontend_pin}/include"
  NO_DEFAULT_PATH)
if(CudnnFrontend_INCLUDE_DIR AND EXISTS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CudnnFrontend_INCLUDE_DIR}/cudnn_frontend_version.h" frontend_defines
       REGEX "#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define CUDNN_FRONTEND_${part}_VERSION ([0-9]+).*" "\\1"
           frontend_${part} "${frontend_defines}")
  endforeach()
  set(CudnnFrontend_VERSION "${frontend_MAJOR}.${frontend_MINOR}.${frontend_PATCH}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CudnnFrontend REQUIRED_VARS CudnnFrontend_INCLUDE_DIR
                                  VERSION_VAR CudnnFrontend_VERSION)
mark_as_advanced(CudnnFrontend_INCLUDE_DIR)
