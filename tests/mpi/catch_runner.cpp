// Catch2's implementation without its main, alone in its translation unit:
// main.cpp supplies a main that starts MPI first. Like tests/catch_main.cpp it
// is compiled once and without the project's warning flags (GCC 12 reports
// false maybe-uninitialized warnings inside Catch2's std::regex use).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
