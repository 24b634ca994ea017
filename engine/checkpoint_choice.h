// Which checkpoint a multi-rank run resumes from, decided once for all ranks
// (issue: ranks agree before the first step). Rank 0 picks; every rank then
// shows the agreement (comm::check_agreement) the name, step and checksum of
// the file it is about to read, so that a rank whose copy differs, or is
// missing, stops every rank with a message instead of resuming elsewhere.
//
// Note [checkpoint choice]: for --resume auto, only rank 0 lists and verifies
// its checkpoint directory and broadcasts the newest good file's name; each
// rank reads that name in its own directory (the same one on a shared file
// system); a rank given a file reads that file. The agreement field is
// "ckpt-<step>.h5 (crc32 ... size ...)" as verified on that rank, so equal
// fields mean the same bytes. A bad file becomes the field's value rather
// than an exception, so that the rank with the bad copy still joins the
// agreement and every rank reports it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "comm/communicator.h"
#include "engine/checkpoint_file.h"

namespace lockstep::engine {

// Collective over `comm`, called by every rank whether it resumes or not, so
// that ranks given different resume flags cannot wait on each other: the
// file name of rank 0's newest good checkpoint in its `directory` ("" when
// rank 0 has none, or passes no directory). Only rank 0 lists and verifies.
std::string newest_checkpoint_name_of_rank0(comm::Communicator& comm,
                                            const CheckpointDirectory* directory);

// ("checkpoint", what this rank would resume from): "none" for a fresh start,
// "ckpt-6.h5 (crc32 0badf00d size 12345)" for a verified file, or the reason
// the file cannot be used. Reads the whole file (its checksum); never throws
// for a missing or corrupt file (Note [checkpoint choice]).
std::pair<std::string, std::string> checkpoint_agreement_field(
    const std::optional<std::filesystem::path>& file);

}  // namespace lockstep::engine
