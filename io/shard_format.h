// ShardFormat: what every shard of a dataset agrees on (docs/data-format.md):
// the inputs' dtype and per-sample shape, and what the samples are trained
// towards (integer labels, float targets, or the next tokens), or that the
// inputs are encoded images; ShardLayout: how a shard's rows are read.
// Shared by the writers and the reader.
#pragma once

#include <cstddef>
#include <string>

#include "engine/core/tensor.h"
#include "kernels/dtype.h"

namespace lockstep::io {

// Dataset names inside a shard.
inline constexpr const char* kInputsName = "inputs";
inline constexpr const char* kLabelsName = "labels";
inline constexpr const char* kTargetsName = "targets";
inline constexpr const char* kOffsetsName = "offsets";

struct ShardFormat {
  DType input_dtype = DType::u8;   // u8, f16 or f32; i32 for tokens
  core::Shape sample_shape;        // one sample, e.g. {1, 28, 28}; inputs are [N, ...]
  DType label_dtype = DType::i64;  // as stored: any integer type, read as i64; labels are [N]
  bool has_labels = true;
  // A target shard: float 'targets' [N, ...target_shape] (stored f32 or f16,
  // read as f32) in place of 'labels', for regression and multi-label losses.
  bool has_targets = false;
  core::Shape target_shape{};  // one sample's targets, e.g. {4}
  // An encoded-image shard (docs/data-format.md): 'inputs' u8 [total bytes],
  // the encoded files (JPEG or PNG) back to back, and 'offsets' i64 [N+1],
  // row i's bytes being [offsets[i], offsets[i+1]); labels as ever. Its
  // sample_shape is empty: a row's shape is known only once decoded.
  bool encoded = false;

  // A token shard (docs/data-format.md): neither labels nor targets, inputs
  // i32 [N, T+1] (stored as i32 or u16), each row a window whose first T
  // tokens are the inputs and last T the targets.
  bool is_tokens() const { return !has_labels && !has_targets; }

  std::size_t sample_bytes() const {
    return static_cast<std::size_t>(checked_mul(core::shape_numel(sample_shape),
                                                static_cast<std::int64_t>(dtype_size(input_dtype)),
                                                "bytes of one sample"));
  }
  // "inputs u8 [1, 28, 28], labels i64"; "encoded images, labels i64"
  std::string str() const {
    return (encoded ? std::string("encoded images")
                    : std::string("inputs ") + dtype_name(input_dtype) + " " +
                          core::shape_str(sample_shape)) +
           (has_labels    ? std::string(", labels ") + dtype_name(label_dtype)
            : has_targets ? ", targets f32 " + core::shape_str(target_shape)
                          : ", no labels");
  }
  bool operator==(const ShardFormat&) const = default;
};

// How a shard's inputs are read: `contiguous` with pread at the offset HDF5
// reports, from any thread and without the HDF5 lock; `hdf5` through the
// library under the lock (chunked, compressed, compact or big-endian
// datasets). Note [contiguous reads] in io/detail/shard_file.h.
enum class ShardLayout { contiguous, hdf5 };

}  // namespace lockstep::io
