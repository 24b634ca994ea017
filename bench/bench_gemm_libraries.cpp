// bench_gemm_libraries: which CPU GEMM library is fastest on this machine?
// The f32 sgemm of every library a Debian or PyPI user can install that is
// present here (OpenBLAS, BLIS, oneDNN from Debian; MKL from PyPI's mkl wheel),
// each loaded with dlopen and called directly, at the shapes of lockstep's
// CPU layers (the presets' Linear layers, gpt-tiny's attention per head, the
// cnn's im2col convolution), timed in interleaved batches on the same buffers.
// It answers the question behind Note [CPU GEMM libraries] (kernels/gemm.h);
// bench_gemm measures lockstep's own path against the libraries it links.
#include <dlfcn.h>
#include <fmt/core.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/report.h"
#include "examples/common/flags.h"

using namespace lockstep;

namespace {

// cblas_sgemm's and dnnl_sgemm's signatures (row-major layout 101, no
// transpose 111, transpose 112 in CBLAS's enumeration).
using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                            int, float, float*, int);
using DnnlSgemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);

struct Library {
  std::string name, path;
  CblasSgemm cblas = nullptr;
  DnnlSgemm dnnl = nullptr;
};

struct Candidate {
  const char* name;
  std::vector<std::string> paths;  // the first that loads
  const char* threads_symbol;      // its thread setter; null: OpenMP's
};

// Loads `c` and sets its threads; nullopt (with the reason printed) when absent.
std::optional<Library> load(const Candidate& c, int threads) {
  std::string reasons;
  for (const std::string& path : c.paths) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      reasons += std::string(reasons.empty() ? "" : "; ") + dlerror();
      continue;
    }
    Library l{c.name, path};
    if (l.name == "oneDNN")
      l.dnnl = reinterpret_cast<DnnlSgemm>(dlsym(handle, "dnnl_sgemm"));
    else
      l.cblas = reinterpret_cast<CblasSgemm>(dlsym(handle, "cblas_sgemm"));
    // OpenMP's setter (found through the library's own dependencies) acts on
    // the calling thread, which makes every call.
    void* setter = dlsym(handle, c.threads_symbol ? c.threads_symbol : "omp_set_num_threads");
    if ((!l.cblas && !l.dnnl) || !setter) {
      fmt::print("{}: {} lacks sgemm or its thread setter, left out\n", c.name, path);
      return std::nullopt;
    }
    reinterpret_cast<void (*)(int)>(setter)(threads);
    return l;
  }
  fmt::print("{}: not installed here ({})\n", c.name, reasons);
  return std::nullopt;
}

struct Shape {
  const char* kind;
  int m, n, k;
  bool trans_a, trans_b;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_gemm_libraries: the f32 sgemm of each installed CPU GEMM library"};
  int threads = 1, trials = 7;
  double batch_s = 0.15;
  std::string mkl_path = "libmkl_rt.so.3", json_path;
  app.add_option("--threads", threads, "threads per library")->capture_default_str();
  app.add_option("--trials", trials, "timed batches per library and shape (median reported)")
      ->capture_default_str();
  app.add_option("--batch-seconds", batch_s, "length of one timed batch")->capture_default_str();
  app.add_option("--mkl", mkl_path,
                 "MKL's libmkl_rt (PyPI's mkl wheel installs it under its lib/ directory)")
      ->capture_default_str();
  app.add_option("--json", json_path, "write JSON lines here");
  app.get_option("--threads")->check(examples::threads_per_rank());
  app.get_option("--trials")->check(examples::within(1, 1000));
  app.get_option("--batch-seconds")->check(examples::within(1e-3, 60));
  app.get_option("--json")->check(examples::non_empty());
  CLI11_PARSE(app, argc, argv);

  // MKL threads through GNU OpenMP (or none), not Intel's runtime, which PyPI's
  // mkl wheel does not bring; an explicit MKL_THREADING_LAYER wins.
  setenv("MKL_THREADING_LAYER", threads == 1 ? "SEQUENTIAL" : "GNU", 0);
  const std::string lib = "/usr/lib/x86_64-linux-gnu/";
  const std::vector<Candidate> candidates = {
      {"OpenBLAS",
       {lib + "openblas-pthread/libopenblas.so.0", "libopenblas.so.0"},
       "openblas_set_num_threads"},
      {"BLIS",
       {lib + "blis-openmp/libblis.so.4", lib + "blis-pthread/libblis.so.4", "libblis.so.4"},
       "bli_thread_set_num_threads"},
      {"MKL", {mkl_path}, "MKL_Set_Num_Threads"},
      {"oneDNN", {"libdnnl.so.2"}, nullptr}};
  std::vector<Library> libraries;
  for (const Candidate& c : candidates)
    if (auto l = load(c, threads)) libraries.push_back(*l);
  if (libraries.empty()) {
    fmt::print(stderr, "bench_gemm_libraries: no CPU GEMM library loaded\n");
    return 1;
  }
  const std::vector<Shape> shapes = {
      {"mlp-fwd", 256, 1024, 784, false, true},   {"mlp-dgrad", 256, 784, 1024, false, false},
      {"mlp-wgrad", 1024, 784, 256, true, false}, {"gpt-qkv", 2048, 384, 128, false, true},
      {"gpt-fc", 2048, 512, 128, false, true},    {"gpt-proj", 2048, 128, 512, false, true},
      {"attn-qk", 128, 128, 32, false, true},     {"attn-pv", 128, 32, 128, false, false},
      {"conv-fwd", 64, 196, 288, false, false},   {"conv-dgrad", 288, 196, 64, true, false},
      {"conv-wgrad", 64, 288, 196, false, true},  {"conv1-fwd", 32, 784, 9, false, false}};
  bench::JsonLines json(json_path);
  fmt::print("{:<10} {:>5} {:>5} {:>5}", "shape", "m", "n", "k");
  for (const Library& l : libraries) fmt::print(" {:>9}", l.name);
  fmt::print("  fastest   (GF/s, {} thread{})\n", threads, threads == 1 ? "" : "s");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<std::size_t>(s.m) * s.k),
        b(static_cast<std::size_t>(s.k) * s.n), c(static_cast<std::size_t>(s.m) * s.n);
    for (float& v : a) v = normal(rng);
    for (float& v : b) v = normal(rng);
    const int lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    std::vector<std::function<double(int)>> contenders;
    for (const Library& l : libraries)
      contenders.push_back([&, l](int calls) {
        return bench::batch_seconds(
            [&] {
              if (l.dnnl)
                l.dnnl(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a.data(),
                       lda, b.data(), ldb, 0.0f, c.data(), s.n);
              else
                l.cblas(101, s.trans_a ? 112 : 111, s.trans_b ? 112 : 111, s.m, s.n, s.k, 1.0f,
                        a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
            },
            [] {}, calls);
      });
    const std::vector<double> seconds = bench::interleaved_medians(contenders, trials, batch_s);
    const double flop = 2.0 * s.m * s.n * s.k;
    std::size_t best = 0;
    fmt::print("{:<10} {:>5} {:>5} {:>5}", s.kind, s.m, s.n, s.k);
    for (std::size_t i = 0; i < libraries.size(); ++i) {
      fmt::print(" {:>9.1f}", flop / seconds[i] / 1e9);
      if (seconds[i] < seconds[best]) best = i;
      json.write({bench::field("bench", "gemm_libraries"), bench::field("shape", s.kind),
                  bench::field("m", static_cast<long long>(s.m)),
                  bench::field("n", static_cast<long long>(s.n)),
                  bench::field("k", static_cast<long long>(s.k)),
                  bench::field("threads", static_cast<long long>(threads)),
                  bench::field("library", libraries[i].name),
                  bench::field("gflops", flop / seconds[i] / 1e9)});
    }
    fmt::print("  {}\n", libraries[best].name);
  }
  std::string loaded;
  for (const Library& l : libraries) loaded += (loaded.empty() ? "" : ", ") + l.name + " " + l.path;
  bench::print_legend("none: each library's own sgemm on the same buffers (" + loaded +
                          "), timed in interleaved batches, median of " + std::to_string(trials),
                      "GF/s: higher is better", "");
  return 0;
}
