// Overflow-checked size arithmetic: every element count, byte count and file
// offset that comes from a shape (a user's, or one read from a file) is
// computed here, so that a huge dimension is an error naming what was being
// sized instead of a wrapped product and an out-of-bounds access.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/error.h"

namespace lockstep {

namespace detail {
[[noreturn]] inline void throw_size_overflow(const char* what, const std::string& a, char op,
                                             const std::string& b) {
  throw InvalidArgument(std::string(what) + ": " + a + " " + op + " " + b +
                        " overflows a 64-bit size (the shape or offset is too large to be real)");
}
}  // namespace detail

// a * b, or InvalidArgument naming `what` when it overflows T (or either is negative).
template <typename T>
T checked_mul(T a, T b, const char* what) {
  static_assert(std::is_integral_v<T>);
  T product;
  if ((std::is_signed_v<T> && (a < 0 || b < 0)) || __builtin_mul_overflow(a, b, &product))
    detail::throw_size_overflow(what, std::to_string(a), '*', std::to_string(b));
  return product;
}

// a + b, or InvalidArgument naming `what` when it overflows T (or either is negative).
template <typename T>
T checked_add(T a, T b, const char* what) {
  static_assert(std::is_integral_v<T>);
  T sum;
  if ((std::is_signed_v<T> && (a < 0 || b < 0)) || __builtin_add_overflow(a, b, &sum))
    detail::throw_size_overflow(what, std::to_string(a), '+', std::to_string(b));
  return sum;
}

}  // namespace lockstep
