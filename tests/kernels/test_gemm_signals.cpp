// A signal that arrives while a CPU GEMM runs: its handler must run on the
// thread's own stack, whichever GEMM library is in use (Note [GEMM signal
// mask], kernels/cpu/gemm.cpp). oneDNN 2.6's f32 kernels point the stack
// pointer into a heap buffer, and a handler's frame written there corrupted
// the heap of lockstep-train under programs_stop. The test fails without
// the mask by aborting (glibc finds the corrupted heap) or at its check.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <thread>
#include <vector>

#include "kernels/gemm.h"

using namespace lockstep;

namespace {

std::atomic<std::uintptr_t> g_stack_low{0}, g_stack_high{0};
std::atomic<int> g_handled{0}, g_off_stack{0};

extern "C" void note_where_handled(int /*signal*/) {
  char here = 0;
  const auto at = reinterpret_cast<std::uintptr_t>(&here);
  if (at < g_stack_low.load() || at >= g_stack_high.load()) g_off_stack.fetch_add(1);
  g_handled.fetch_add(1);
}

// The calling thread's stack, [low, high).
void record_own_stack() {
  pthread_attr_t attr;
  REQUIRE(pthread_getattr_np(pthread_self(), &attr) == 0);
  void* low = nullptr;
  std::size_t size = 0;
  REQUIRE(pthread_attr_getstack(&attr, &low, &size) == 0);
  pthread_attr_destroy(&attr);
  g_stack_low = reinterpret_cast<std::uintptr_t>(low);
  g_stack_high = reinterpret_cast<std::uintptr_t>(low) + size;
}

}  // namespace

TEST_CASE("a signal during a cpu gemm is handled on the thread's own stack", "[kernels][gemm]") {
  struct sigaction action {
  }, previous{};
  action.sa_handler = note_where_handled;
  sigemptyset(&action.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &action, &previous) == 0);
  const kernels::cpu::GemmLibrary in_use = kernels::cpu::gemm_library();
  // mlp's fc3 forward at batch 16: a K above 84, where oneDNN 2.6's AVX-512
  // kernel puts its stack pointer into a heap buffer. Without the mask a run
  // dies in free() (the corrupted heap) or sees the handler off its stack.
  constexpr std::int64_t m = 16, n = 10, k = 512;
  const std::vector<float> a(m * k, 0.5f), b(n * k, 0.25f);
  std::vector<float> c(m * n, 0.0f);
  for (kernels::cpu::GemmLibrary library : kernels::cpu::gemm_libraries()) {
    DYNAMIC_SECTION(kernels::cpu::gemm_library_name(library)) {
      kernels::cpu::use_gemm_library(library);
      g_handled = g_off_stack = 0;
      std::fill(c.begin(), c.end(), 0.0f);
      std::atomic<bool> ready{false}, done{false};
      std::thread worker([&] {
        record_own_stack();
        ready = true;
        kernels::GemmArgs g;
        g.trans_b = true;
        g.m = m, g.n = n, g.k = k;
        g.a = a.data(), g.lda = k;
        g.b = b.data(), g.ldb = k;
        g.c = c.data(), g.ldc = n;
        // Until enough signals have come, not for a time: 200 of them, each
        // most likely inside a GEMM, which is nearly all this thread does.
        for (int i = 0; i == 0 || (i < 20000 && g_handled.load() < 200); ++i) kernels::cpu::gemm(g);
        done = true;
      });
      const pthread_t target = worker.native_handle();
      while (!ready.load()) std::this_thread::yield();  // its stack is known
      while (!done.load()) {
        pthread_kill(target, SIGUSR1);
        std::this_thread::yield();
      }
      worker.join();
      CHECK(g_handled.load() > 0);
      CHECK(g_off_stack.load() == 0);
      // Each element is k x 0.5 x 0.25 exactly: the GEMMs were not disturbed.
      CHECK(c[0] == static_cast<float>(k) * 0.125f);
      CHECK(c[m * n - 1] == static_cast<float>(k) * 0.125f);
    }
  }
  kernels::cpu::use_gemm_library(in_use);
  sigaction(SIGUSR1, &previous, nullptr);
}
