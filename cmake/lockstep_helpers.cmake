# Helpers shared by the component CMakeLists: one place for warnings,
# sanitizers and the CUDA compile flags, so every target builds the same way.

set(lockstep_warnings -Wall -Wextra)
if(LOCKSTEP_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
endif()
# LOCKSTEP_FUZZ: libFuzzer's coverage (lockstep_fuzz_coverage) in the code the
# fuzzers run: the libraries, lockstep-shard's readers and the harnesses
# (tests/fuzz links the fuzzer itself). The test binaries and program mains go
# without: under clang 14's sanitizers the coverage made a test source
# (tests/engine/test_optim.cpp) 15% and Catch2's runner 25% slower to
# compile, for hooks that are no-ops outside a fuzzer; the four fuzzers
# start from the same coverage as before (libFuzzer's INITED line). And
# everywhere, __FILE__ relative to the source root: error messages name
# source files, and their length must not depend on where the checkout lies,
# or neither would the inputs a fixed seed tries (.ci/run, fuzzing). The
# second map covers a compiler launcher such as ccache, which hands the
# compiler paths relative to the build folder ("../io/...").
set(lockstep_fuzz_coverage "")
if(LOCKSTEP_FUZZ)
  set(lockstep_fuzz_coverage $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-ffile-prefix-map=${PROJECT_SOURCE_DIR}/=>
                      $<$<COMPILE_LANGUAGE:CXX>:-ffile-prefix-map=../=>)
endif()

# lockstep_component(NAME <target> SOURCES ...): a shared library exported as
# lockstep::<name-without-prefix>, with its headers found from the source root
# (#include "kernels/gemm.h") both in the build and after install.
function(lockstep_component target export_name)
  add_library(${target} SHARED ${ARGN})
  add_library(lockstep::${export_name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name} INSTALL_RPATH "$ORIGIN"
                        CUDA_SEPARABLE_COMPILATION OFF)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/lockstep>)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${lockstep_warnings}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra> ${lockstep_fuzz_coverage})
  if(LOCKSTEP_WITH_CUDA)
    target_compile_definitions(${target} PUBLIC LOCKSTEP_WITH_CUDA=1)
  else()
    target_compile_definitions(${target} PUBLIC LOCKSTEP_WITH_CUDA=0)
  endif()
  # Note [library precompiled header]: the standard and fmt headers most
  # sources include, parsed once per library instead of once per source (C++
  # sources only). They are 2.3 s of the 3.9 s gcc 12 takes to parse
  # engine/run_report.cpp, which it compiles in 8.8 s at -O3. A source with
  # its own code-generation flags skips it (kernels/CMakeLists.txt).
  foreach(header algorithm chrono cmath cstdint cstring filesystem functional map memory mutex
          optional string utility vector fmt/format.h)
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<${header}$<ANGLE-R>>")
  endforeach()
  install(TARGETS ${target} EXPORT lockstepTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# Installs a component's public headers under include/lockstep/<folder>/.
function(lockstep_install_headers folder)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lockstep/${folder}
          FILES_MATCHING PATTERN "*.h"
          PATTERN "cpu" EXCLUDE PATTERN "cuda" EXCLUDE PATTERN "detail" EXCLUDE)
endfunction()

# lockstep_install_program(<target>): installs a program into bin/ with a
# runpath to the installed libraries ($ORIGIN/../lib), so that it starts from
# the install tree without LD_LIBRARY_PATH (.ci/run's install-tree stage runs
# each installed program's --help that way).
function(lockstep_install_program target)
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()
