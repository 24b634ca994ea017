// The bootstrap (comm/world.h): launcher detection, MPI and NCCL start-up,
// orderly shutdown and the abort path.
//
// Note [watchdog ends the process]: library code reports errors by throwing,
// but a thread blocked in an MPI collective can be neither woken nor unwound,
// and OpenMPI has no fault tolerance. So when the watchdog gives up, or an
// exception would leave other ranks waiting forever, World::abort ends the
// process: MPI_Abort, which makes mpirun end every rank, or _Exit without MPI.
#include "comm/world.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include "comm/detail/check_mpi.h"
#include "comm/detail/mpi_communicator.h"
#include "comm/detail/mpi_peer_channel.h"
#include "comm/self_communicator.h"
#include "engine/core/log.h"
#include "kernels/error.h"

#if LOCKSTEP_WITH_CUDA
#include "comm/detail/nccl_communicator.h"
#endif

namespace lockstep::comm {
namespace {

// Set by OpenMPI's mpirun, by PMIx launchers (OpenMPI, srun --mpi=pmix), by
// PMI launchers (MPICH's hydra, srun --mpi=pmi2) and by srun itself.
constexpr const char* kLauncherVariables[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK",
                                              "SLURM_PROCID"};

void start_mpi(int& argc, char**& argv, bool& owns_mpi) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    throw Error(
        "comm::init: MPI was already finalized (by an earlier World); MPI starts once per "
        "process, so keep one World for the whole program");
  int provided = 0;
  if (initialized) {
    LOCKSTEP_CHECK_MPI(MPI_Query_thread(&provided));
  } else {
    LOCKSTEP_CHECK_MPI(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
    owns_mpi = true;
  }
  if (provided < MPI_THREAD_MULTIPLE)
    throw Error(
        "comm::init: the MPI library provides thread level " + std::to_string(provided) +
        ", lockstep needs MPI_THREAD_MULTIPLE (its communication thread runs collectives beside "
        "the training thread); use an MPI built with thread support");
}

}  // namespace

std::optional<std::string> detect_launcher(const EnvLookup& getenv) {
  for (const char* name : kLauncherVariables)
    if (getenv(name)) return std::string(name);
  return std::nullopt;
}

std::optional<std::string> detect_launcher() {
  return detect_launcher([](const char* name) { return std::getenv(name); });
}

bool host_overlap_pays(const World& world, int compute_threads) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const long machine = ::sysconf(_SC_NPROCESSORS_ONLN);
  const int bound = ::sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : 0;
  const long cores =
      bound > 0 && bound < machine ? bound : machine / std::max(1, world.local_size());
  return cores > compute_threads;
}

// Note [guarded main]: an error on one rank must end every rank. The rank
// that caught it logs it with its rank prefix and aborts the job (MPI_Abort
// ends the others, wherever they wait); the other ranks print nothing, so the
// message comes once. An error inside init itself, before there is a World,
// is printed by each process that met it.
int guarded_main(const std::string& name, int& argc, char**& argv, const InitOptions& options,
                 const std::function<int(World&)>& program) {
  std::unique_ptr<World> world;
  try {
    world = init(argc, argv, options);
    const int rc = program(*world);
    world->shutdown();
    return rc;
  } catch (const std::exception& e) {
    if (world && world->size() > 1) world->abort(name + ": " + e.what(), 1);
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    return 1;
  }
}

std::unique_ptr<World> init(int& argc, char**& argv, const InitOptions& options) {
  const Seconds timeout = comm_timeout_from_env();
  std::unique_ptr<World> world(new World());
  World* w = world.get();
  w->uncaught_at_init_ = std::uncaught_exceptions();
  // The handler runs on the watchdog thread, which World::shutdown stops
  // before the World goes away.
  auto on_failure = [w](const std::string& message) { w->abort(message); };
  install_flight_signal();

  if (detect_launcher()) {
    start_mpi(argc, argv, w->owns_mpi_);
    w->uses_mpi_ = true;
    LOCKSTEP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &w->rank_));
    LOCKSTEP_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &w->size_));
    MPI_Comm node = MPI_COMM_NULL;
    LOCKSTEP_CHECK_MPI(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w->rank_, MPI_INFO_NULL, &node));
    LOCKSTEP_CHECK_MPI(MPI_Comm_rank(node, &w->local_rank_));
    LOCKSTEP_CHECK_MPI(MPI_Comm_size(node, &w->local_size_));
    LOCKSTEP_CHECK_MPI(MPI_Comm_free(&node));
    core::set_log_rank(w->rank_);

    w->mpi_types_ = std::make_shared<detail::MpiTypes>();
    w->watchdog_ = std::make_shared<Watchdog>(
        timeout, on_failure, std::make_unique<detail::MpiPeerChannel>(MPI_COMM_WORLD));
    // lockstep's traffic on a communicator of its own, apart from any the
    // program sends on MPI_COMM_WORLD.
    MPI_Comm comm = MPI_COMM_NULL;
    LOCKSTEP_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
    w->host_ =
        std::make_unique<detail::MpiCommunicator>(comm, "world", w->mpi_types_, w->watchdog_);
  } else {
    core::set_log_rank(0);
    w->watchdog_ = std::make_shared<Watchdog>(timeout, on_failure);
    w->host_ = std::make_unique<SelfCommunicator>("world");
  }

  const int gpus = options.use_gpu ? core::cuda_device_count() : 0;
  if (gpus > 0) {
    if (w->local_size_ > gpus)
      throw InvalidArgument("comm::init: " + std::to_string(w->local_size_) +
                            " ranks on this node but " + std::to_string(gpus) +
                            " GPU(s) visible; NCCL needs one GPU per rank (start fewer ranks per "
                            "node, or pass InitOptions{.use_gpu = false} for CPU training)");
    w->device_ = core::Device::cuda(w->local_rank_ % gpus);
    core::set_current_device(w->device_);
#if LOCKSTEP_WITH_CUDA
    w->gpu_ = detail::create_nccl_world(*w->host_, w->device_, w->watchdog_);
#endif
  }
  core::log_debug("comm::init: rank {} of {} (local {} of {}), device {}, {}", w->rank_, w->size_,
                  w->local_rank_, w->local_size_, w->device_.str(),
                  w->uses_mpi_ ? "MPI" : "no launcher: a world of one");
  return world;
}

Communicator& World::for_device(core::Device device) {
  if (!device.is_cuda()) return *host_;
  if (gpu_ && gpu_->device() == device) return *gpu_;
  throw InvalidArgument("World::for_device: rank " + std::to_string(rank_) + " is bound to " +
                        device_.str() + ", it has no communicator for " + device.str());
}

World::~World() {
  if (shut_down_) return;
  if (std::uncaught_exceptions() > uncaught_at_init_ && size_ > 1) {
    // The exception may be this rank's alone, and MPI_Finalize waits for
    // every rank: leave MPI as it is. When this process exits, mpirun sees a
    // rank end without MPI_Finalize and ends the others.
    core::log_message(core::LogLevel::info,
                      "an exception is leaving the World's scope: skipping MPI_Finalize; the "
                      "launcher will end the other ranks");
#if LOCKSTEP_WITH_CUDA
    detail::NcclCommunicator::abort_all();
#endif
    if (watchdog_) {
      watchdog_->dump_flight("an exception left the World's scope");
      watchdog_->stop();
    }
    shut_down_ = true;
    return;
  }
  shutdown();
}

void World::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  gpu_.reset();
  host_.reset();
  if (watchdog_) watchdog_->stop();
  mpi_types_.reset();
  if (owns_mpi_) MPI_Finalize();
}

void World::abort(const std::string& message, int exit_code) {
  // A second caller (another thread) waits for the first to end the process.
  static std::atomic<bool> aborting{false};
  if (aborting.exchange(true))
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  core::log_message(core::LogLevel::info, message +
                                              "\nending the job: aborting communicators, then " +
                                              (uses_mpi_ ? "MPI_Abort" : "exit") + " with code " +
                                              std::to_string(exit_code));
  if (watchdog_) watchdog_->dump_flight(message);
#if LOCKSTEP_WITH_CUDA
  detail::NcclCommunicator::abort_all();
#endif
  if (uses_mpi_) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace lockstep::comm
