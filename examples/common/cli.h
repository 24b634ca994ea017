// CLI11 for the lockstep programs (examples/ and bench/), its own code
// compiled without optimisation (Note [CLI11 unoptimised]).
#pragma once

// Note [CLI11 unoptimised]: CLI11 (Debian 12's 2.1.2) is header-only, and
// compiling its code at -O3 in every program's main took about a third of
// the main's compile time: examples/shard/main.cpp took 26.4 s with it at
// -O3 and 16.7 s with it at -O0 (gcc 12, the 2-vCPU AMD EPYC VM), where 12
// mains are compiled by CI's first stage and 3 more by the container's. The
// flags are parsed once per run, so CLI11's own functions (and the templates
// it defines) are compiled without optimisation, and the rest of the main as
// its build says. The standard headers CLI11 includes come first, so that
// their templates, which the mains use too, stay optimised. Every program
// gets CLI11 from here (most through flags.h): a main that included
// <CLI/CLI.hpp> itself before this file would compile it optimised again
// (the include guard).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <limits>
#include <locale>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <sys/types.h>

#if defined(__clang__)
#pragma clang optimize off
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("O0")
#endif
#include <CLI/CLI.hpp>
#if defined(__clang__)
#pragma clang optimize on
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
