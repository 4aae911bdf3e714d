// examples/raw_cuda at world 1 over the NCCL communicator, for a few dozen steps on a subset of
// Fashion-MNIST: the loss falls (DDP, ZeRO 1 and 2, fp16 with dynamic loss scaling, bf16), two
// runs with the same seed end with the same parameters bit for bit, ZeRO at world 1 ends
// where DDP does, and a run stopped at step N and resumed from its checkpoint (--checkpoint_dir:
// GPU parameters and optimizer state through save_state / load_state) ends where an
// uninterrupted run does. Skipped, saying why, without a GPU (after checking that raw_cuda itself
// says it needs one), without the NCCL communicator, or without the dataset.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "backends/comm/registry.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/staging.hpp"

using namespace accel;
using namespace accel::test;

namespace {

// ACCEL_TEST_FASHION_MNIST names another directory (scripts/gpu_check.sh --data DIR).
const std::string kData = [] {
  const char* dir = std::getenv("ACCEL_TEST_FASHION_MNIST");
  return std::string(dir && *dir ? dir : "/usr/share/datasets/fashion-mnist");
}();
constexpr int kSteps = 40;

struct Run {
  std::vector<double> losses;  // per optimizer step, from "step S loss X"
  std::vector<float> params;   // --save_params
  std::string output;
};

// raw_cuda as rank 0 of a world of one over NCCL (unless env names ACCEL_COMM_BACKEND); env
// adds the strategy's settings.
Run run_raw_cuda(const TempDir& dir, const std::string& name,
                 const std::vector<std::pair<std::string, std::string>>& env,
                 std::vector<std::string> extra = {}, int steps = kSteps) {
  const std::string params = dir / (name + ".params");
  std::vector<std::string> args = {
      "--data_dir",  kData, "--train_samples", "4096", "--test_samples", "512",
      "--epochs",    "1",   "--batch_size",    "64",   "--max_steps",    std::to_string(steps),
      "--log_every", "1",   "--seed",          "7",    "--save_params",  params};
  args.insert(args.end(), extra.begin(), extra.end());
  RanksOptions options;
  options.env = env;
  bool chooses_backend = false;
  for (const auto& [name, value] : env)
    chooses_backend = chooses_backend || name == "ACCEL_COMM_BACKEND";
  if (!chooses_backend) options.env.emplace_back("ACCEL_COMM_BACKEND", "nccl");
  const auto result = run_ranks(1, "raw_cuda", args, options);
  INFO(name << ": " << describe(result));
  REQUIRE(result.exit_code() == 0);
  Run run;
  run.output = result.workers[0].output;
  std::istringstream lines(run.output);
  std::string line;
  while (std::getline(lines, line)) {
    unsigned long long step = 0;
    double loss = 0;
    if (std::sscanf(line.c_str(), "step %llu loss %lf", &step, &loss) == 2)
      run.losses.push_back(loss);
  }
  const std::string bytes = read_file(params);
  run.params.resize(bytes.size() / sizeof(float));
  std::memcpy(run.params.data(), bytes.data(), run.params.size() * sizeof(float));
  return run;
}

// Largest |a[i] - b[i]| and how many elements differ at all (the message says, so a bitwise
// expectation shows even under a tolerance).
struct ParamDiff {
  double worst = 0;
  std::size_t differ = 0;
};
ParamDiff compare_params(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  ParamDiff d;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d.worst = std::max(d.worst, double(std::fabs(a[i] - b[i])));
    d.differ += a[i] != b[i];
  }
  return d;
}

double mean(const std::vector<double>& v, std::size_t first, std::size_t n) {
  double s = 0;
  for (std::size_t i = first; i < first + n; ++i) s += v[i];
  return s / double(n);
}

// The mean loss of the last 10 steps is below the first 10's (Fashion-MNIST from a random
// MLP: about 2.3 falling towards 1 within 40 steps at these settings).
void check_learns(const Run& run, const std::string& what) {
  INFO(what << ": " << run.output);
  REQUIRE(run.losses.size() == std::size_t(kSteps));
  for (double l : run.losses) REQUIRE(std::isfinite(l));
  CHECK(mean(run.losses, kSteps - 10, 10) < 0.8 * mean(run.losses, 0, 10));
}

// What every case but the first needs: the NCCL communicator, a GPU, the dataset (skipped,
// saying which is missing).
bool cannot_run() {
  if (skip_unless(communicator_available("nccl"), "nccl communicator not built")) return true;
  if (skip_unless(cuda_device_count() > 0, "no CUDA device visible: raw_cuda needs a GPU"))
    return true;
  return skip_unless(
      std::filesystem::exists(kData + "/train-images-idx3-ubyte.gz"),
      "Fashion-MNIST not installed at " + kData + " (Debian package dataset-fashion-mnist)");
}

}  // namespace

TEST_CASE("raw_cuda trains the MLP on a GPU under DDP, ZeRO 1/2, fp16 and bf16, reproducibly") {
  if (skip_unless(communicator_available("nccl"), "nccl communicator not built")) return;
  if (cuda_device_count() == 0) {
    // What a user without a GPU sees: a clear message and a non-zero exit.
    const auto result = run_ranks(1, "raw_cuda", {"--max_steps", "1"});
    INFO(describe(result));
    CHECK(result.exit_code() == 1);
    CHECK(result.workers[0].output.find("no CUDA device visible") != std::string::npos);
    skip_unless(false, "no CUDA device visible: raw_cuda needs a GPU");
    return;
  }
  if (skip_unless(
          std::filesystem::exists(kData + "/train-images-idx3-ubyte.gz"),
          "Fashion-MNIST not installed at " + kData + " (Debian package dataset-fashion-mnist)"))
    return;
  TempDir dir("raw_cuda_test");

  const Run ddp = run_raw_cuda(dir, "ddp", {}, {"--clip", "0"});
  check_learns(ddp, "DDP");
  const Run again = run_raw_cuda(dir, "ddp_again", {}, {"--clip", "0"});
  CHECK(again.params == ddp.params);  // bit for bit: cuBLAS and our kernels are deterministic
  CHECK(again.losses == ddp.losses);

  // ZeRO in a world of one: the same arithmetic on the same gradients (the optimizer steps
  // one flat slice instead of four parameters), within 1e-6 of DDP's parameters.
  for (const std::string stage : {"1", "2"}) {
    CAPTURE(stage);
    const Run zero = run_raw_cuda(dir, "zero" + stage,
                                  {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"}, {"ACCEL_ZERO_STAGE", stage}},
                                  {"--clip", "0"});
    CHECK(zero.output.find("strategy zero" + stage) != std::string::npos);
    check_learns(zero, "ZeRO " + stage);
    const ParamDiff d = compare_params(zero.params, ddp.params);
    INFO(d.differ << " of " << ddp.params.size() << " parameters differ at all");
    CHECK(d.worst <= 1e-6);
  }

  // Clipping on the GPU (the sum of squares and the multiply kernels) and AdamW.
  check_learns(
      run_raw_cuda(dir, "adamw_clip", {}, {"--optimizer", "adamw", "--lr", "0.002", "--clip", "1"}),
      "AdamW with clipping");

  // Mixed precision: f16 / bf16 compute copies of fp32 master weights; fp16 with the dynamic
  // loss scaler unscaling on the GPU. Reproducible too.
  const Run fp16 = run_raw_cuda(dir, "fp16", {}, {"--mixed_precision", "fp16"});
  check_learns(fp16, "fp16");
  CHECK(fp16.output.find("fp16: ") != std::string::npos);
  CHECK(run_raw_cuda(dir, "fp16_again", {}, {"--mixed_precision", "fp16"}).params == fp16.params);
  const Run bf16 = run_raw_cuda(dir, "bf16", {}, {"--mixed_precision", "bf16", "--clip", "0"});
  check_learns(bf16, "bf16");
  CHECK(bf16.output.find("bf16 compute") != std::string::npos);
  CHECK(bf16.params != ddp.params);  // it really computed in bf16
}

TEST_CASE(
    "raw_cuda in one process without NCCL, and DataParallel over one GPU, end where DDP does") {
  if (cannot_run()) return;
  TempDir dir("raw_cuda_one_process_test");
  // The same kernels on the same gradients: DDP's average over one rank, the world of one's
  // no-op and one replica's reduction change nothing, so the parameters should agree bit for
  // bit; the limit is 1e-6 and the message says how many differ at all.
  const Run ddp = run_raw_cuda(dir, "ddp", {}, {"--optimizer", "adamw", "--lr", "0.002"});
  const Run local = run_raw_cuda(dir, "local", {{"ACCEL_COMM_BACKEND", "local"}},
                                 {"--optimizer", "adamw", "--lr", "0.002"});
  const Run dp = run_raw_cuda(dir, "data_parallel",
                              {{"ACCEL_COMM_BACKEND", "local"},
                               {"ACCEL_DISTRIBUTED_TYPE", "DATA_PARALLEL"},
                               {"ACCEL_USE_CPU", "false"},
                               {"CUDA_VISIBLE_DEVICES", "0"}},
                              {"--optimizer", "adamw", "--lr", "0.002"});
  CHECK(local.output.find("strategy ddp") != std::string::npos);
  CHECK(dp.output.find("1 processes x 1 replica(s)") != std::string::npos);
  CHECK(dp.output.find("strategy data_parallel") != std::string::npos);
  check_learns(local, "the world of one on a GPU");
  check_learns(dp, "DataParallel over one GPU");
  for (const Run* run : {&local, &dp}) {
    const ParamDiff d = compare_params(run->params, ddp.params);
    MESSAGE(d.differ << " of " << ddp.params.size() << " parameters differ from DDP's, max "
                     << d.worst);
    CHECK(d.worst <= 1e-6);
  }
}

TEST_CASE(
    "raw_cuda stopped at step N and resumed from its checkpoint ends where a whole run does") {
  if (cannot_run()) return;
  TempDir dir("raw_cuda_resume_test");
  constexpr int kStop = kSteps / 2;  // mid-epoch: 64 batches of 64 in the 4096 samples
  struct Setting {
    std::string name;
    std::vector<std::pair<std::string, std::string>> env;
    std::vector<std::string> flags;
  };
  const std::vector<Setting> settings = {
      {"ddp_sgd", {}, {"--clip", "1"}},  // momentum state, clipping on the GPU
      {"zero1_adamw",
       {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"}, {"ACCEL_ZERO_STAGE", "1"}},
       {"--optimizer", "adamw", "--lr", "0.002"}},
      {"zero2_sgd", {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"}, {"ACCEL_ZERO_STAGE", "2"}}, {}},
  };
  for (const Setting& s : settings) {
    CAPTURE(s.name);
    const std::string ck = dir / (s.name + ".ck");
    std::vector<std::string> with_ck = s.flags;
    with_ck.insert(with_ck.end(), {"--checkpoint_dir", ck});
    const Run whole = run_raw_cuda(dir, s.name + "_whole", s.env, s.flags);
    const Run first = run_raw_cuda(dir, s.name + "_first", s.env, with_ck, kStop);
    REQUIRE(first.losses.size() == std::size_t(kStop));
    REQUIRE(std::filesystem::exists(ck + "/MANIFEST"));
    const Run resumed = run_raw_cuda(dir, s.name + "_resumed", s.env, with_ck);
    INFO(resumed.output);
    CHECK(resumed.output.find("resumed from") != std::string::npos);
    // Steps kStop+1 .. kSteps again, on the restored parameters, optimizer state and batches.
    REQUIRE(resumed.losses.size() == std::size_t(kSteps - kStop));
    CHECK(std::vector<double>(whole.losses.begin(), whole.losses.begin() + kStop) == first.losses);
    CHECK(std::vector<double>(whole.losses.begin() + kStop, whole.losses.end()) == resumed.losses);
    const ParamDiff d = compare_params(resumed.params, whole.params);
    INFO(d.differ << " of " << whole.params.size() << " parameters differ at all");
    CHECK(d.worst <= 1e-6);
  }
}
