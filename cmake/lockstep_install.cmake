# Install rules, the CMake package config (so that a user's project can do
# find_package(lockstep) and link lockstep::lockstep) and the Python tools.
include(CMakePackageConfigHelpers)

set(lockstep_config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/lockstep)
install(EXPORT lockstepTargets NAMESPACE lockstep:: DESTINATION ${lockstep_config_dir})
configure_package_config_file(cmake/lockstepConfig.cmake.in
  ${PROJECT_BINARY_DIR}/lockstepConfig.cmake INSTALL_DESTINATION ${lockstep_config_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lockstepConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lockstepConfig.cmake
              ${PROJECT_BINARY_DIR}/lockstepConfigVersion.cmake
        DESTINATION ${lockstep_config_dir})

# The Python tools (metrics and benchmark plots, the JSON-lines reader they
# share, the scaling model, and the readers of what a run leaves behind: the
# flight dumps an aborted job's message points to, traces, TensorBoard
# scalars), beside each other as plot.py imports jsonl.py.
install(PROGRAMS tools/plot.py tools/scaling_model.py tools/flight.py tools/trace.py
                 tools/to_tensorboard.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/lockstep/tools)
install(FILES tools/jsonl.py DESTINATION ${CMAKE_INSTALL_DATADIR}/lockstep/tools)
