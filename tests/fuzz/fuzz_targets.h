// The fuzzing entry points: one input (the bytes of a file) through the shard
// reader or the checkpoint reader, with lockstep::Error as the only accepted
// outcome besides success. libFuzzer drives them (fuzz_shard.cpp,
// fuzz_checkpoint.cpp, built with clang under LOCKSTEP_FUZZ) and the unit
// tests replay the seed corpus and every past crash through them (replay.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::fuzz {

// Writes `data` to a shard file, opens it as a Dataset (both read paths) and
// reads a few rows; 0 when it is read or refused with a lockstep::Error.
int shard_input(const std::uint8_t* data, std::size_t size);
// Writes `data` to a checkpoint file with a matching checksum file (so that
// the input reaches HDF5), reads it as a checkpoint and as a weights file.
int checkpoint_input(const std::uint8_t* data, std::size_t size);

}  // namespace lockstep::fuzz
