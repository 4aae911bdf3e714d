// Ranks that must agree and do not are refused on every rank, naming the rank and both
// values, before any collective shaped by what differs (accelerate/process/rank_agreement.hpp):
// rank_agreement_worker over real processes with one thing different on rank 1, over shm and
// Gloo; and the repro, `accel launch` with rank 1 given other flags through `sh -c`.
// The LibTorch adapter's own values (param group options, its data loader) are checked in
// torch_accelerator_test.

#include <doctest/doctest.h>

#include <filesystem>

#include "backends/comm/registry.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

std::vector<std::string> cpu_backends() {
  std::vector<std::string> out;
  for (const char* b : {"shm", "gloo"})
    if (communicator_available(b)) out.push_back(b);
  return out;
}

launch::GroupResult run_worker(int world, const std::string& backend,
                               std::vector<std::string> args) {
  RanksOptions options;
  options.env = {{"ACCEL_COMM_BACKEND", backend}};
  options.stop_on_failure = false;  // every rank must reach its own verdict
  options.timeout = std::chrono::seconds(60);
  return run_ranks(world, "rank_agreement_worker", args, options);
}

// Every rank exited 3 (RankMismatchError, not a crash or a hang) saying `message`.
void expect_refused(const launch::GroupResult& result, const std::string& message) {
  INFO(describe(result));
  for (const auto& w : result.workers) {
    CAPTURE(w.label);
    CHECK(w.signal == 0);
    CHECK(w.exit_code == 3);
    CHECK(w.output.find(message) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("ranks that differ in what must agree are refused on every rank, naming both values") {
  const std::vector<std::string> backends = cpu_backends();
  if (skip_unless(!backends.empty(), "neither the shm nor the gloo communicator is built")) return;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hidden",
       "prepare: ranks differ: rank 1: parameter 'layer0.weight' shape is [16, 16], "
       "rank 0 has [32, 16]"},
      {"name", "rank 1: parameter 0's name is 'fc0.weight', rank 0 has 'layer0.weight'"},
      {"count", "rank 1: number of parameters is 5, rank 0 has 4"},
      {"dtype", "rank 1: parameter 'layer0.bias' dtype is i32, rank 0 has f32"},
      {"group", "rank 1: parameter 'layer0.bias' param group is 1, rank 0 has 0"},
      {"lr", "rank 1: SGD param group 0 lr is 0.2, rank 0 has 0.1"},
      {"momentum", "rank 1: SGD param group 0 momentum is 0.5, rank 0 has 0.9"},
      {"accumulation", "rank 1: gradient_accumulation_steps is 2, rank 0 has 1"},
      {"mixed_precision", "rank 1: mixed_precision is 'bf16', rank 0 has 'no'"},
      {"strategy", "rank 1: strategy is 'zero stage 2', rank 0 has 'ddp'"},
      {"dataset_size",
       "make_sampler: ranks differ: rank 1: the sampler's dataset size is 90, "
       "rank 0 has 100"},
      {"batch_size", "rank 1: the sampler's batch_size is 2, rank 0 has 4"},
      {"sampler_seed", "rank 1: the sampler's seed is 5, rank 0 has 11"},
      {"shuffle", "rank 1: the sampler's shuffle is false, rank 0 has true"},
  };
  for (const std::string& backend : backends)
    for (const auto& [item, message] : cases) {
      CAPTURE(backend);
      CAPTURE(item);
      expect_refused(run_worker(2, backend, {"--differ", item}), message);
    }
}

TEST_CASE("ranks that agree train; a different seed is rank 0's after set_seed, not a mismatch") {
  const std::vector<std::string> backends = cpu_backends();
  if (skip_unless(!backends.empty(), "neither the shm nor the gloo communicator is built")) return;
  for (const std::string& backend : backends)
    for (const char* item : {"none", "seed"}) {
      CAPTURE(backend);
      CAPTURE(item);
      const auto result = run_worker(2, backend, {"--differ", item});
      INFO(describe(result));
      CHECK(result.exit_code() == 0);
      CHECK_VERDICT(Verdicts(result), "agreed", 2);
    }
}

TEST_CASE("several ranks that differ: the lowest is described, all are listed") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  expect_refused(run_worker(3, "gloo", {"--differ", "hidden", "--also_rank2"}),
                 "rank 1: parameter 'layer0.weight' shape is [16, 16], rank 0 has [32, 16] "
                 "(ranks 1, 2 differ from rank 0)");
}

TEST_CASE("accel launch with rank 1 given another --hidden: every worker fails naming it") {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  if (skip_unless(std::filesystem::exists(data + "/train-images-idx3-ubyte.gz"),
                  "Fashion-MNIST not installed at " + data))
    return;
  if (skip_unless(std::filesystem::exists(bin_path("raw_mlp")), "raw_mlp example not built"))
    return;
  const std::vector<std::string> backends = cpu_backends();
  if (skip_unless(!backends.empty(), "neither the shm nor the gloo communicator is built")) return;
  // The repro: before, shm trained on with a wrong loss and Gloo aborted.
  const std::string script = "H=64; [ \"$RANK\" = 1 ] && H=32; exec " + bin_path("raw_mlp") +
                             " --epochs 1 --hidden $H --train_samples 500 --test_samples 100 "
                             "--data_dir " +
                             data;
  for (const std::string& backend : backends) {
    CAPTURE(backend);
    const auto result = run_accel(
        {"launch", "-q", "--num_processes", "2", "--comm_backend", backend, "sh", "-c", script});
    INFO(describe(result));
    CHECK(result.exit_code() == 1);
    const std::string& out = result.workers.front().output;
    const std::string message =
        "raw_mlp: prepare: ranks differ: rank 1: parameter 'layer0.weight' shape is [32, 784], "
        "rank 0 has [64, 784]";
    // The launcher stops the others at the first exit, so only the first worker to exit is
    // sure to have printed it (every rank's own verdict: the test cases above).
    CHECK(out.find("stderr:\n" + message) != std::string::npos);  // the launcher's summary
    CHECK(out.find("test accuracy") == std::string::npos);
    CHECK(out.find("terminate called") == std::string::npos);
  }
}
