// The fuzzing entry points: one input (the bytes of a file) through the shard
// reader, the checkpoint reader, lockstep-shard's converters or the image
// decoder, with lockstep::Error as the only accepted outcome besides success.
// libFuzzer drives them (fuzz_shard.cpp, fuzz_checkpoint.cpp,
// fuzz_convert.cpp, fuzz_image.cpp, built
// with clang under LOCKSTEP_FUZZ) and the unit tests replay the seed corpus
// and every past crash through them (replay.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

// Note [declared sizes]: HDF5 1.10 allocates what a file declares for some
// metadata (a 9 TB cache entry, found by fuzzing) before it can tell that the
// file is too small. glibc's malloc then fails and HDF5 reports an error; under
// ASan the same allocation would abort. So the fuzzers and the replay test run
// with allocator_may_return_null=1 (and libFuzzer with a malloc limit above
// ASan's), which keeps HDF5's real behaviour; lockstep's own buffers are
// bounded by Note [hostile files] long before such sizes.

namespace lockstep::fuzz {

// Writes `data` to a shard file, opens it as a Dataset (both read paths) and
// reads a few rows (an encoded-image shard's decoded and cropped); 0 when it
// is read or refused with a lockstep::Error.
int shard_input(const std::uint8_t* data, std::size_t size);
// Writes `data` to a checkpoint file with a matching checksum file (so that
// the input reaches HDF5), reads it as a checkpoint and as a weights file.
int checkpoint_input(const std::uint8_t* data, std::size_t size);
// lockstep-shard's readers (examples/shard): `data` as an IDX images file,
// with a labels file whose count is the images' (bytes 4-7, where an images
// header holds it), converted to shards; then `data` as the source of
// lockstep-shard text, --seq, --shards and --val-fraction taken from its
// first three bytes.
int convert_input(const std::uint8_t* data, std::size_t size);
// `data` as one image file of an encoded-image shard: decoded (JPEG or PNG,
// io/image_decode.h), then a random-resized crop and a centre crop of it.
int image_input(const std::uint8_t* data, std::size_t size);

}  // namespace lockstep::fuzz
