// Tensor ops along a dimension (engine/core/tensor_ops.h): softmax, sum, mean,
// max, slice and concat. Each sees its input as [outer, dim, inner] around the
// chosen dimension and hands that extent to kernels/dim_reduce.h or dim_copy.h.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/detail/op_checks.h"
#include "engine/core/dispatch.h"
#include "engine/core/tensor_ops.h"
#include "kernels/dim_copy.h"
#include "kernels/dim_reduce.h"

namespace lockstep::core::ops {
namespace {

using kernels::DimExtent;
using kernels::DimReduce;

DimExtent extent_around(const Shape& shape, int dim) {
  DimExtent e;
  for (int d = 0; d < dim; ++d) e.outer *= shape[d];
  e.dim = shape[dim];
  for (std::size_t d = dim + 1; d < shape.size(); ++d) e.inner *= shape[d];
  return e;
}

Tensor softmax_op(const char* op, const Tensor& x, int dim, bool log, const Stream& stream) {
  detail::require_float_dtype(op, x);
  const DimExtent e = extent_around(x.shape(), detail::normalize_dim(op, x, dim));
  Tensor y;
  dispatch_stream(
      x.device(), stream,
      [&] {
        y = Tensor::empty(x.shape(), x.dtype());
        kernels::cpu::softmax_dim(x.data(), y.data(), x.dtype(), e, log);
      },
      [&](const Stream& s) {
        y = Tensor::empty(x.shape(), x.dtype(), x.device(), s);
        kernels::cuda::softmax_dim(x.data(), y.data(), x.dtype(), e, log, s.handle());
      });
  return y;
}

Tensor reduce_op(const char* op, DimReduce kind, const Tensor& x, int dim, bool keepdim,
                 const Stream& stream) {
  detail::require_float_dtype(op, x);
  const int d = detail::normalize_dim(op, x, dim);
  const DimExtent e = extent_around(x.shape(), d);
  if (kind == DimReduce::max && e.dim == 0)
    throw InvalidArgument(std::string(op) + ": dim " + std::to_string(dim) + " of " +
                          shape_str(x.shape()) + " is empty, and an empty max has no value");
  Shape shape = x.shape();
  if (keepdim)
    shape[d] = 1;
  else
    shape.erase(shape.begin() + d);
  Tensor out;
  dispatch_stream(
      x.device(), stream,
      [&] {
        out = Tensor::empty(shape, x.dtype());
        kernels::cpu::reduce_dim(kind, x.data(), out.data(), x.dtype(), e);
      },
      [&](const Stream& s) {
        out = Tensor::empty(shape, x.dtype(), x.device(), s);
        kernels::cuda::reduce_dim(kind, x.data(), out.data(), x.dtype(), e, s.handle());
      });
  return out;
}

// One row-block copy into the output, `dst_offset_bytes` into it.
struct Piece {
  kernels::RowCopy copy;
  std::size_t dst_offset_bytes = 0;
};

// A new tensor of `shape` on `device`, filled by the pieces' copies.
Tensor copy_into_new(const Shape& shape, DType type, Device device, std::vector<Piece> pieces,
                     const Stream& stream) {
  Tensor out;
  std::vector<kernels::RowCopy> copies;
  auto bind = [&] {
    for (Piece& p : pieces) {
      p.copy.dst = static_cast<char*>(out.data()) + p.dst_offset_bytes;
      copies.push_back(p.copy);
    }
  };
  dispatch_stream(
      device, stream,
      [&] {
        out = Tensor::empty(shape, type);
        bind();
        for (const kernels::RowCopy& c : copies) kernels::cpu::copy_rows(c);
      },
      [&](const Stream& s) {
        out = Tensor::empty(shape, type, device, s);
        bind();
        for (const kernels::RowCopy& c : copies) kernels::cuda::copy_rows(c, s.handle());
      });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int dim, const Stream& s) {
  return softmax_op("softmax", x, dim, false, s);
}
Tensor log_softmax(const Tensor& x, int dim, const Stream& s) {
  return softmax_op("log_softmax", x, dim, true, s);
}
Tensor sum(const Tensor& x, int dim, bool keepdim, const Stream& s) {
  return reduce_op("sum", DimReduce::sum, x, dim, keepdim, s);
}
Tensor mean(const Tensor& x, int dim, bool keepdim, const Stream& s) {
  return reduce_op("mean", DimReduce::mean, x, dim, keepdim, s);
}
Tensor max(const Tensor& x, int dim, bool keepdim, const Stream& s) {
  return reduce_op("max", DimReduce::max, x, dim, keepdim, s);
}

Tensor slice(const Tensor& x, int dim, std::int64_t start, std::int64_t end, const Stream& stream) {
  detail::require_defined("slice", x, "the input");
  const int d = detail::normalize_dim("slice", x, dim);
  const std::int64_t size = x.shape()[d];
  const std::int64_t first = start < 0 ? start + size : start;
  const std::int64_t last = end < 0 ? end + size : end;
  if (first < 0 || last < first || last > size)
    throw InvalidArgument("slice: [" + std::to_string(start) + ", " + std::to_string(end) +
                          ") along dim " + std::to_string(dim) + " of " + shape_str(x.shape()) +
                          " is not a range of 0.." + std::to_string(size) +
                          " (need 0 <= start <= end <= size)");
  const DimExtent e = extent_around(x.shape(), d);
  Shape shape = x.shape();
  shape[d] = last - first;
  kernels::RowCopy copy;
  copy.src = static_cast<const char*>(x.data()) + first * e.inner * dtype_size(x.dtype());
  copy.src_stride = e.dim * e.inner;
  copy.dst_stride = shape[d] * e.inner;
  copy.rows = e.outer;
  copy.row_elems = shape[d] * e.inner;
  copy.element_bytes = dtype_size(x.dtype());
  return copy_into_new(shape, x.dtype(), x.device(), {Piece{copy, 0}}, stream);
}

Tensor concat(const std::vector<Tensor>& parts, int dim, const Stream& stream) {
  if (parts.empty()) throw InvalidArgument("concat: no tensors given (pass at least one)");
  for (const Tensor& p : parts) detail::require_defined("concat", p, "a part");
  const Tensor& first = parts.front();
  const int d = detail::normalize_dim("concat", first, dim);
  Shape shape = first.shape();
  shape[d] = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const Tensor& p = parts[k];
    detail::require_same_device("concat", first, p);
    Shape expect = first.shape();
    expect[d] = p.shape().size() == expect.size() ? p.shape()[d] : -1;
    if (p.shape() != expect || p.dtype() != first.dtype())
      throw InvalidArgument("concat: part " + std::to_string(k) + " is " + shape_str(p.shape()) +
                            " " + dtype_name(p.dtype()) + " but part 0 is " +
                            shape_str(first.shape()) + " " + dtype_name(first.dtype()) +
                            " (parts must agree in dtype and in every dimension but dim " +
                            std::to_string(dim) + ")");
    shape[d] += p.shape()[d];
  }
  const DimExtent e = extent_around(shape, d);
  std::vector<Piece> pieces;
  const std::size_t element = dtype_size(first.dtype());
  std::int64_t offset = 0;  // along dim
  for (const Tensor& p : parts) {
    kernels::RowCopy copy;
    copy.src = p.data();
    copy.src_stride = p.shape()[d] * e.inner;
    copy.dst_stride = e.dim * e.inner;
    copy.rows = e.outer;
    copy.row_elems = p.shape()[d] * e.inner;
    copy.element_bytes = element;
    pieces.push_back({copy, static_cast<std::size_t>(offset * e.inner) * element});
    offset += p.shape()[d];
  }
  return copy_into_new(shape, first.dtype(), first.device(), std::move(pieces), stream);
}

}  // namespace lockstep::core::ops
