// A CPU-only run never reaches the CUDA runtime or NCCL, so it works on a machine with the
// CUDA toolkit but no GPU driver. The runs below preload tests/support/cuda_tripwire.c, which
// replaces every CUDA runtime and NCCL entry point the built code imports by one that logs its
// name and fails as a driverless machine would; each run must succeed and log nothing. The
// first case checks with nm that the tripwire's list covers what the binaries import, so a new
// call site cannot slip past.

#include <doctest/doctest.h>
#include <stdio.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "backends/comm/registry.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;
namespace fs = std::filesystem;

namespace {

const std::string kData = "/usr/share/datasets/fashion-mnist";

// The dynamic symbols `nm -D` lists for FILE (undefined or defined ones), without versions.
std::set<std::string> dynamic_symbols(const std::string& file, bool undefined) {
  const std::string command = std::string("nm -D ") +
                              (undefined ? "--undefined-only" : "--defined-only") + " '" + file +
                              "' 2>/dev/null";
  std::set<std::string> out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char line[1024];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    std::string name = line;
    name = name.substr(name.find_last_of(' ') + 1);
    name = name.substr(0, name.find_first_of("@\n"));
    out.insert(name);
  }
  ::pclose(pipe);
  return out;
}

// The public API and kernel launches; module registration at load time (__cudaRegister*,
// __cudaUnregisterFatBinary) needs no driver and stays with the real runtime.
bool must_be_tripped(const std::string& symbol) {
  if (symbol.starts_with("__cudaRegister") || symbol.starts_with("__cudaUnregister")) return false;
  return symbol.starts_with("cuda") || symbol.starts_with("nccl") || symbol.starts_with("__cuda");
}

struct TrippedRun {
  TempDir dir{"accel_cpu_only"};
  std::string log = dir / "cuda_calls.log";
  std::vector<std::pair<std::string, std::string>> env() const {
    return {{"LD_PRELOAD", ACCEL_CUDA_TRIPWIRE}, {"ACCEL_CUDA_TRIPWIRE_LOG", log}};
  }
  // The CUDA entry points the run called, one per line ("" when none).
  std::string calls() const { return fs::exists(log) ? read_file(log) : std::string(); }
};

// Returns what the run printed.
std::string expect_no_cuda(const std::vector<std::string>& accel_args, const std::string& what) {
  TrippedRun run;
  const auto r = run_accel(accel_args, run.env(), std::chrono::seconds(180));
  INFO(what << "\n" << describe(r));
  CHECK(r.exit_code() == 0);
  CHECK(run.calls() == "");
  return r.workers.empty() ? std::string() : r.workers.front().output;
}

}  // namespace

TEST_CASE("the tripwire covers every CUDA runtime and NCCL entry point the built code imports") {
  const std::set<std::string> tripped = dynamic_symbols(ACCEL_CUDA_TRIPWIRE, false);
  REQUIRE(tripped.count("cudaEventCreateWithFlags") == 1);
  std::vector<fs::path> files;
  for (const char* dir : {"lib", "bin"})
    for (const auto& entry : fs::directory_iterator(fs::path(ACCEL_BIN_DIR) / ".." / dir))
      if (entry.is_regular_file()) files.push_back(entry.path());
  std::size_t imports = 0;
  for (const fs::path& file : files)
    for (const std::string& symbol : dynamic_symbols(file.string(), true))
      if (must_be_tripped(symbol)) {
        ++imports;
        INFO(file.string() << " imports " << symbol);
        CHECK(tripped.count(symbol) == 1);
      }
  MESSAGE(imports << " CUDA/NCCL imports in " << files.size() << " built files");
}

TEST_CASE("comm_bench over every CPU communicator reaches no CUDA call") {
  expect_no_cuda(
      {"launch", "-q", "--main_process_port", "0", "--num_processes", "2", bin_path("comm_bench"),
       "--comms", "memcpy,shm,shm_symmetric,hierarchical,gloo,raw_gloo", "--min_bytes", "4K",
       "--max_bytes", "16K", "--iters", "2"},
      "comm_bench, forked workers");
  if (skip_unless(communicator_available("mpi") && !find_mpirun().empty(),
                  "MPI not built or mpirun not found"))
    return;
  // Every CPU table in one run, as bench/README runs it (one process group per process: the
  // others are made on the gloo group's store).
  const std::string out =
      expect_no_cuda({"launch", "-q", "--main_process_port", "0", "--use_mpi", "--num_processes",
                      "2", bin_path("comm_bench"), "--comms",
                      "memcpy,shm,shm_symmetric,hierarchical,gloo,raw_gloo,mpi,raw_mpi,raw_mpi_nb",
                      "--min_bytes", "4K", "--max_bytes", "16K", "--iters", "2"},
                     "comm_bench under mpirun");
  for (const char* table : {"memcpy", "shm", "shm_symmetric", "hierarchical", "gloo", "raw_gloo",
                            "mpi", "raw_mpi", "raw_mpi_nb"})
    CHECK_MESSAGE(out.find(std::string("# backend ") + table + " ") != std::string::npos, table);
}

TEST_CASE("accel test's collective checks reach no CUDA call") {
  expect_no_cuda({"test", "--main_process_port", "0", "--num_processes", "2"}, "accel test");
}

TEST_CASE("training on the CPU under every strategy reaches no CUDA call") {
  if (skip_unless(fs::exists(kData + "/train-images-idx3-ubyte.gz"),
                  "Fashion-MNIST not installed at " + kData))
    return;
  const std::vector<std::string> raw_mlp = {bin_path("raw_mlp"),
                                            "--data_dir",
                                            kData,
                                            "--train_samples",
                                            "600",
                                            "--test_samples",
                                            "200",
                                            "--epochs",
                                            "1",
                                            "--hidden",
                                            "16"};
  auto launch = [&](std::vector<std::string> flags, const std::vector<std::string>& program) {
    flags.insert(flags.begin(), {"launch", "-q", "--main_process_port", "0"});
    flags.insert(flags.end(), program.begin(), program.end());
    return flags;
  };
  expect_no_cuda(launch({"--num_processes", "2"}, raw_mlp), "raw_mlp, DDP over shm");
  expect_no_cuda(
      launch({"--num_processes", "2", "--comm_backend", "gloo", "--use_zero", "--zero_stage", "2"},
             raw_mlp),
      "raw_mlp, ZeRO-2 over Gloo");
  expect_no_cuda(launch({"--data_parallel", "--data_parallel_replicas", "2"}, raw_mlp),
                 "raw_mlp, DATA_PARALLEL");
  if (fs::exists(bin_path("fashion_mnist")))
    expect_no_cuda(launch({"--num_processes", "2"},
                          {bin_path("fashion_mnist"), "--data_dir", kData, "--train_samples", "256",
                           "--test_samples", "128", "--epochs", "1"}),
                   "fashion_mnist (LibTorch), DDP over shm");
}
