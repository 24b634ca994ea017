// The checkpoint a run resumes from, agreed by every rank (engine/checkpoint_choice.h).
#include "engine/checkpoint_choice.h"

#include "comm/agreement.h"
#include "kernels/error.h"

namespace lockstep::engine {

std::string newest_checkpoint_name_of_rank0(comm::Communicator& comm,
                                            const CheckpointDirectory* directory) {
  std::string name;
  if (comm.rank() == 0 && directory)
    if (const std::optional<std::filesystem::path> newest = directory->latest_good())
      name = newest->filename().string();
  return comm::broadcast_text(comm, name, 0);
}

std::pair<std::string, std::string> checkpoint_agreement_field(
    const std::optional<std::filesystem::path>& file) {
  if (!file) return {"checkpoint", "none"};
  std::string value;
  try {
    value = file->filename().string() + " (" + verify_checkpoint(*file) + ")";
  } catch (const Error& e) {
    value = e.what();
  }
  return {"checkpoint", value};
}

}  // namespace lockstep::engine
