// Tensor: a contiguous, typed view of shared Storage. Views at an offset share
// the storage (the flat parameter and gradient buffers are carved this way);
// copies between devices and dtype casts are explicit and take a Stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/memory.h"
#include "engine/core/stream.h"
#include "kernels/checked_math.h"
#include "kernels/dtype.h"
#include "kernels/error.h"

namespace lockstep::core {

using Shape = std::vector<std::int64_t>;

// The element count; throws InvalidArgument on a negative size or when the
// product overflows (kernels/checked_math.h).
std::int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"

// Tensor::copy_to_host calls of a non-empty tensor so far in this process, on
// any device (on a GPU each one waits for its stream): how a test checks that
// a step reads its values once (Note [one read per step], engine/step_readback.h).
std::int64_t host_copies();

class Tensor {
 public:
  Tensor() = default;  // undefined: holds no storage

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      const Stream& stream = {});
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      const Stream& stream = {});
  // Copies numel elements of `dtype` from host memory.
  static Tensor from_host(const void* data, const Shape& shape, DType dtype,
                          Device device = Device::cpu(), const Stream& stream = {});
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype,
                            Device device = Device::cpu(), const Stream& stream = {});

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const {
    return static_cast<std::size_t>(
        checked_mul(numel(), static_cast<std::int64_t>(dtype_size(dtype_)), "tensor bytes"));
  }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* data() const { return static_cast<char*>(storage_->data()) + offset_bytes_; }
  // Typed pointer; throws InvalidArgument when T does not store this dtype.
  template <typename T>
  T* data_as() const;

  // A tensor of `shape` sharing storage, starting `element_offset` elements in.
  Tensor view(std::int64_t element_offset, const Shape& shape) const;
  Tensor reshape(const Shape& shape) const { return view(0, shape); }
  // A tensor of `dtype` and `shape` over this one's bytes from `byte_offset`
  // (a multiple of the dtype's size): one buffer holding values of several
  // dtypes, read back in one copy (engine/step_readback.h).
  Tensor view_bytes(std::size_t byte_offset, const Shape& shape, DType dtype) const;

  // Copies `src` (same shape and dtype, any device) into this tensor.
  void copy_from(const Tensor& src, const Stream& stream = {});
  Tensor to(Device device, const Stream& stream = {}) const;
  Tensor cast(DType dtype, const Stream& stream = {}) const;
  void fill_(double value, const Stream& stream = {});
  // Copies to host memory; synchronises `stream` first when the tensor is on a GPU.
  void copy_to_host(void* dst, const Stream& stream = {}) const;
  template <typename T>
  std::vector<T> to_vector(const Stream& stream = {}) const;

 private:
  std::shared_ptr<Storage> storage_;
  std::size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

namespace detail {
// Whether C++ type T holds elements of `dtype` (16-bit floats as std::uint16_t bits).
template <typename T>
constexpr bool stores(DType dtype) {
  if constexpr (std::is_same_v<T, float>)
    return dtype == DType::f32;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return dtype == DType::f16 || dtype == DType::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return dtype == DType::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return dtype == DType::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return dtype == DType::u8;
  else
    return false;
}
[[noreturn]] void throw_element_type_mismatch(DType dtype, std::size_t element_bytes);

template <typename T>
void check_element_type(DType dtype) {
  if (!stores<T>(dtype)) throw_element_type_mismatch(dtype, sizeof(T));
}
}  // namespace detail

template <typename T>
T* Tensor::data_as() const {
  detail::check_element_type<T>(dtype_);
  return static_cast<T*>(data());
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, DType dtype,
                           Device device, const Stream& stream) {
  detail::check_element_type<T>(dtype);
  if (static_cast<std::int64_t>(values.size()) != shape_numel(shape))
    throw InvalidArgument("from_vector: " + std::to_string(values.size()) +
                          " values do not fill shape " + shape_str(shape));
  return from_host(values.data(), shape, dtype, device, stream);
}

template <typename T>
std::vector<T> Tensor::to_vector(const Stream& stream) const {
  detail::check_element_type<T>(dtype_);
  std::vector<T> out(static_cast<std::size_t>(numel()));
  copy_to_host(out.data(), stream);
  return out;
}

}  // namespace lockstep::core
