// comm::init and World: the bootstrap of a data-parallel job. Launched by
// mpirun/mpiexec or srun, init starts MPI (MPI_THREAD_MULTIPLE), learns the
// rank, world size and local rank, binds the GPU (local rank modulo the visible
// GPUs) and, on CUDA builds with a usable GPU, creates the NCCL communicator.
// Launched directly, the World is one rank and MPI is never initialized.
// The World owns the watchdog and ends the job when a collective cannot finish.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "engine/core/device.h"

namespace lockstep::comm {

namespace detail {
class MpiTypes;
}

// What a job that lockstep aborts exits with (EX_SOFTWARE).
inline constexpr int kAbortExitCode = 70;

struct InitOptions {
  // Bind a GPU and create the NCCL communicator when one is usable. false
  // keeps every rank on the CPU (e.g. several ranks on a machine with one GPU:
  // NCCL needs a GPU per rank).
  bool use_gpu = true;
};

using EnvLookup = std::function<const char*(const char*)>;
// The environment variable that shows a launcher started this process
// (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK or SLURM_PROCID), if any.
std::optional<std::string> detect_launcher(const EnvLookup& getenv);
std::optional<std::string> detect_launcher();

class World;
// Starts the World (see above). The timeout of every collective comes from
// LOCKSTEP_COMM_TIMEOUT (seconds; default 600). Sets the log rank.
std::unique_ptr<World> init(int& argc, char**& argv, const InitOptions& options = {});

// A program's main, guarded (Note [guarded main]): starts the World, runs
// `program` and shuts the World down, returning program's exit status. An
// exception is printed once, by the rank that had it ("NAME: rank R: what"),
// and ends the whole job with exit status 1 (World::abort) instead
// of `terminate called` on every rank or a hang of the others in their next
// collective; one process prints it and returns 1.
int guarded_main(const std::string& name, int& argc, char**& argv, const InitOptions& options,
                 const std::function<int(World&)>& program);

// Whether this rank has a core beyond its `compute_threads` for the gradient
// synchroniser's communication thread (SynchronizerOptions::host_overlap,
// Note [host overlap]). Its cores: its CPU affinity when the launcher bound it
// to fewer than all of the machine's cores, else the machine's cores shared
// by the node's ranks.
bool host_overlap_pays(const World& world, int compute_threads);

class World {
 public:
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks of this node
  int local_size() const { return local_size_; }
  // The GPU bound to this rank, or cpu.
  core::Device device() const { return device_; }
  bool uses_mpi() const { return uses_mpi_; }

  // Host buffers: MPI ("world"), or Self in a world of one.
  Communicator& host() { return *host_; }
  // The communicator for buffers on `device`: host() for cpu, NCCL
  // ("world.nccl") for this rank's GPU; throws InvalidArgument otherwise.
  Communicator& for_device(core::Device device);
  Watchdog& watchdog() { return *watchdog_; }

  // Orderly end: ncclCommDestroy, MPI_Finalize. Every rank must call it (or
  // destroy its World); communicators duplicated from this World and the
  // objects that hold them (GradientSynchronizer) must be gone by then.
  void shutdown();

  // Ends the job: logs `message`, aborts the NCCL communicators, then
  // MPI_Abort (every rank ends) or, in a world without MPI, _Exit.
  [[noreturn]] void abort(const std::string& message, int exit_code = kAbortExitCode);

 private:
  friend std::unique_ptr<World> init(int& argc, char**& argv, const InitOptions& options);
  World() = default;

  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  core::Device device_;
  bool uses_mpi_ = false;
  bool owns_mpi_ = false;  // false when the program had initialized MPI itself
  bool shut_down_ = false;
  int uncaught_at_init_ = 0;
  std::shared_ptr<Watchdog> watchdog_;
  std::shared_ptr<const detail::MpiTypes> mpi_types_;
  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Communicator> gpu_;
};

}  // namespace lockstep::comm
