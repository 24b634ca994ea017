// lockstep_mpi_faults: a small data-parallel training loop that goes wrong on
// purpose, run under mpiexec by ctest (tests/mpi/CMakeLists.txt), which checks
// its exit status, its output and how long it took (expect_run.cmake).
//   train     five clean steps; every rank exits 0
//   mismatch  the last rank builds a different model: every rank reports it and exits 1
//   disagree  the last rank has another lr: every rank reports it and exits 1
//   die       rank 1 is killed (SIGKILL) in step 3: the launcher ends the job
//   stall     rank 1 sleeps before step 3's backward: the others' watchdogs end the job
//   stop      rank 1 is stopped (SIGSTOP) there instead: it cannot answer nor dump
//   stop-inside  rank 1 is stopped inside step 3's first allreduce, which the others
//             issue after it (0.5 s into it; they issue theirs at 1.5 s)
//   desync    in step 3 the last rank issues a barrier where the others allreduce
//   throw     rank 1 throws in step 3, out of main (comm::guarded_main): its message
//             comes once and the job ends, the others waiting in a collective
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/agreement.h"
#include "comm/gradient_synchronizer.h"
#include "comm/step_agreement.h"
#include "comm/world.h"

using namespace lockstep;

namespace {

int train(comm::World* world, const std::string& mode) {
  const int rank = world->rank();
  try {
    comm::check_agreement(
        world->host(), {{"model", "mlp"},
                        {"lr", mode == "disagree" && rank == world->size() - 1 ? "0.1" : "0.05"}});
    // Three layers in ready order, 256-byte aligned, in buckets of about 4 kB.
    const std::int64_t hidden = mode == "mismatch" && rank == world->size() - 1 ? 33 : 32;
    const std::vector<std::pair<std::string, core::Shape>> params = {
        {"fc2.bias", {10}}, {"fc2.weight", {10, hidden}}, {"fc1.weight", {hidden, 100}}};
    comm::SynchronizedModel model;
    std::int64_t offset = 0;
    for (const auto& [name, shape] : params) {
      model.segments.push_back({name, offset, core::shape_numel(shape), shape});
      offset = (offset + core::shape_numel(shape) + 63) / 64 * 64;
    }
    model.parameters = core::Tensor::zeros({offset}, DType::f32);
    model.gradients = core::Tensor::zeros({offset}, DType::f32);
    core::Tensor grads = model.gradients;
    comm::GradientSynchronizer sync(world->host(), std::move(model),
                                    {.bucket_cap_bytes = 4096, .first_bucket_cap_bytes = 1024});
    comm::StepAgreement agreement(world->host());
    for (int step = 0; step < 5; ++step) {
      sync.begin_step(step);
      if (step == 3 && rank == 1 && mode == "die") std::raise(SIGKILL);
      if (step == 3 && rank == 1 && mode == "stall") sleep(3600);
      if (step == 3 && rank == 1 && mode == "stop") std::raise(SIGSTOP);
      if (step == 3 && mode == "stop-inside") {
        if (rank == 1)
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            kill(getpid(), SIGSTOP);
          }).detach();
        else
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      }
      if (step == 3 && rank == 1 && mode == "throw")
        throw std::runtime_error("the test's error on rank 1 in step 3");
      if (step == 3 && mode == "desync") {
        float x[4] = {};
        if (rank == world->size() - 1)
          world->host().barrier();
        else
          world->host().allreduce(x, 4, DType::f32, comm::ReduceOp::sum);
      }
      grads.fill_(0.01 * (rank + 1));
      for (std::size_t s = 0; s < sync.segments().size(); ++s) sync.mark_ready(s);
      sync.finish();
      agreement.agree(1.0, 4);
    }
    std::fprintf(stderr, "rank %d finished 5 steps\n", rank);
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "train";
  return comm::guarded_main("lockstep_mpi_faults", argc, argv, {.use_gpu = false},
                            [&](comm::World& world) { return train(&world, mode); });
}
