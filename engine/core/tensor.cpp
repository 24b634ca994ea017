// Tensor (engine/core/tensor.h). A CPU Stream means "synchronous": a copy that
// touches a GPU but is given the CPU stream runs on the device's default
// stream and waits for it before returning.
#include "engine/core/tensor.h"

#include <atomic>
#include <cstring>

#include "engine/core/ops.h"
#include "kernels/checked_math.h"

#if LOCKSTEP_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace lockstep::core {

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw InvalidArgument("tensor shape " + shape_str(shape) + " has a negative size");
    n = checked_mul(n, d, "element count of a tensor shape");
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace detail {
void throw_element_type_mismatch(DType dtype, std::size_t element_bytes) {
  throw InvalidArgument(std::string("tensor of dtype ") + dtype_name(dtype) + " accessed as a " +
                        std::to_string(element_bytes) +
                        "-byte C++ type that does not store it (f32: float, f16/bf16: "
                        "std::uint16_t, i32: std::int32_t, i64: std::int64_t, u8: std::uint8_t)");
}
}  // namespace detail

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, const Stream& stream) {
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = allocate(device, t.nbytes(), stream);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, const Stream& stream) {
  Tensor t = empty(shape, dtype, device, stream);
  t.fill_(0.0, stream);
  return t;
}

Tensor Tensor::from_host(const void* data, const Shape& shape, DType dtype, Device device,
                         const Stream& stream) {
  Tensor t = empty(shape, dtype, device, stream);
  if (t.nbytes() == 0) return t;  // memcpy may not take the null of an empty buffer
  if (!device.is_cuda()) {
    std::memcpy(t.data(), data, t.nbytes());
    return t;
  }
#if LOCKSTEP_WITH_CUDA
  const Stream s = stream.device().is_cuda() ? stream : Stream::default_for(device);
  LOCKSTEP_CHECK_CUDA(
      cudaMemcpyAsync(t.data(), data, t.nbytes(), cudaMemcpyHostToDevice, s.handle()));
  if (!stream.device().is_cuda()) s.synchronize();
#endif
  return t;
}

std::int64_t Tensor::dim(int i) const {
  const int rank = static_cast<int>(shape_.size());
  if (i < -rank || i >= rank)
    throw InvalidArgument("dimension " + std::to_string(i) + " is out of range for shape " +
                          shape_str(shape_));
  return shape_[i < 0 ? i + rank : i];
}

Tensor Tensor::view(std::int64_t element_offset, const Shape& shape) const {
  const std::size_t element = dtype_size(dtype_);
  const std::int64_t count = shape_numel(shape);
  if (element_offset < 0 ||
      static_cast<std::size_t>(checked_mul(checked_add(element_offset, count, "tensor view end"),
                                           static_cast<std::int64_t>(element),
                                           "tensor view bytes")) > nbytes())
    throw InvalidArgument("view of " + shape_str(shape) + " at element " +
                          std::to_string(element_offset) + " does not fit in a tensor of shape " +
                          shape_str(shape_));
  Tensor v = *this;
  v.offset_bytes_ = offset_bytes_ + static_cast<std::size_t>(element_offset) * element;
  v.shape_ = shape;
  return v;
}

Tensor Tensor::view_bytes(std::size_t byte_offset, const Shape& shape, DType dtype) const {
  const std::size_t element = dtype_size(dtype);
  const auto bytes = static_cast<std::size_t>(
      checked_mul(shape_numel(shape), static_cast<std::int64_t>(element), "tensor view bytes"));
  if (byte_offset % element != 0 || byte_offset > nbytes() || bytes > nbytes() - byte_offset)
    throw InvalidArgument(std::string("view of ") + dtype_name(dtype) + " " + shape_str(shape) +
                          " at byte " + std::to_string(byte_offset) +
                          " does not fit, aligned, in a tensor of " + std::to_string(nbytes()) +
                          " bytes");
  Tensor v = *this;
  v.offset_bytes_ = offset_bytes_ + byte_offset;
  v.shape_ = shape;
  v.dtype_ = dtype;
  return v;
}

void Tensor::copy_from(const Tensor& src, const Stream& stream) {
  if (src.shape_ != shape_ || src.dtype_ != dtype_)
    throw InvalidArgument("copy_from: source " + shape_str(src.shape_) + " " +
                          dtype_name(src.dtype_) + " does not match destination " +
                          shape_str(shape_) + " " + dtype_name(dtype_) +
                          " (cast or reshape the source first)");
  if (nbytes() == 0) return;
  if (!device().is_cuda() && !src.device().is_cuda()) {
    std::memcpy(data(), src.data(), nbytes());
    return;
  }
#if LOCKSTEP_WITH_CUDA
  const Device gpu = device().is_cuda() ? device() : src.device();
  const Stream s = stream.device().is_cuda() ? stream : Stream::default_for(gpu);
  set_current_device(gpu);  // Note [default stream device], engine/core/stream.cpp
  LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(data(), src.data(), nbytes(), cudaMemcpyDefault, s.handle()));
  if (!stream.device().is_cuda()) s.synchronize();
#else
  (void)stream;
#endif
}

Tensor Tensor::to(Device device, const Stream& stream) const {
  Tensor out = empty(shape_, dtype_, device, stream.device() == device ? stream : Stream());
  out.copy_from(*this, stream);
  return out;
}

Tensor Tensor::cast(DType dtype, const Stream& stream) const {
  Tensor out = empty(shape_, dtype, device(), stream);
  ops::cast(*this, out, stream);
  return out;
}

void Tensor::fill_(double value, const Stream& stream) { ops::fill(*this, value, stream); }

namespace {
std::atomic<std::int64_t> host_copy_count{0};
}  // namespace

std::int64_t host_copies() { return host_copy_count.load(std::memory_order_relaxed); }

void Tensor::copy_to_host(void* dst, const Stream& stream) const {
  if (nbytes() == 0) return;
  host_copy_count.fetch_add(1, std::memory_order_relaxed);
  if (!device().is_cuda()) {
    std::memcpy(dst, data(), nbytes());
    return;
  }
#if LOCKSTEP_WITH_CUDA
  const Stream s = stream.device().is_cuda() ? stream : Stream::default_for(device());
  set_current_device(device());  // Note [default stream device], engine/core/stream.cpp
  LOCKSTEP_CHECK_CUDA(cudaMemcpyAsync(dst, data(), nbytes(), cudaMemcpyDeviceToHost, s.handle()));
  s.synchronize();
#else
  (void)stream;
#endif
}

}  // namespace lockstep::core
