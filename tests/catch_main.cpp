// The Catch2 main, alone in its translation unit: it takes ~15 s to compile,
// so every test binary links this one object instead of compiling it again.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
