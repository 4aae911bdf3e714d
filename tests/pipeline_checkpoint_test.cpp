// Pipeline checkpoints over real processes (pipeline_resume_worker does the rank's part): a
// checkpoint saved by 2 stages x 2 replicas resumes bitwise in the same shape and, within the
// first-order reordering bound, at 4 stages, at 2 stages x 1 replica, and without a pipeline
// (DDP, ZeRO-1, one process); accel merge-weights makes one LibTorch archive of it; a stage
// killed while writing a save leaves the previous checkpoint, which resumes; a checkpoint of
// another model, or one without a layout, is refused naming why.

#include <doctest/doctest.h>

#include <csignal>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/tolerance.hpp"

using namespace accel;
using namespace accel::test;

namespace {

constexpr int kSteps = 8;

using Env = std::vector<std::pair<std::string, std::string>>;

launch::GroupResult run_worker(int world, int stages, std::vector<std::string> more, Env env = {}) {
  more.insert(more.begin(), {"--stages", std::to_string(stages), "--steps", std::to_string(kSteps),
                             "--microbatches", "3"});
  RanksOptions options;
  options.env = std::move(env);
  return run_ranks(world, "pipeline_resume_worker", more, options);
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(!a.empty());
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

const Env kSharded = {{"ACCEL_STATE_DICT_TYPE", "SHARDED_STATE_DICT"}};

}  // namespace

TEST_CASE(
    "a PP 2 x DP 2 checkpoint resumes at PP 2 x DP 2 bitwise, and at PP 4, PP 2 x DP 1 and "
    "without a pipeline (DDP, ZeRO-1, one process) as the uninterrupted run; merge-weights "
    "makes a LibTorch archive of it") {
  TempDir dir("accel_pipeline_ck");
  const auto straight = run_worker(4, 2,
                                   {"--checkpoint", dir / "ck", "--save_at", "4", "--dump",
                                    dir / "straight", "--dump_at_save", dir / "at_save"});
  INFO(describe(straight));
  REQUIRE(straight.exit_code() == 0);
  const std::vector<double> expected = read_doubles(dir / "straight");

  struct Resume {
    std::string name;
    int world, stages;
    Env env;
  };
  Env zero1 = kSharded;
  zero1.insert(zero1.end(), {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"}, {"ACCEL_ZERO_STAGE", "1"}});
  const std::vector<Resume> resumes = {
      {"PP 2 x DP 2", 4, 2, {}},       {"PP 4", 4, 4, {}},
      {"PP 2 x DP 1", 2, 2, {}},       {"DDP world 2", 2, 0, kSharded},
      {"ZeRO-1 world 2", 2, 0, zero1}, {"one process", 1, 0, kSharded},
  };
  for (const Resume& r : resumes) {
    CAPTURE(r.name);
    const auto resumed =
        run_worker(r.world, r.stages, {"--resume", dir / "ck", "--dump", dir / "resumed"}, r.env);
    INFO(describe(resumed));
    REQUIRE(resumed.exit_code() == 0);
    CHECK(count_in_output(resumed, "loaded step 4") == 1);
    const double d = max_difference(read_doubles(dir / "resumed"), expected);
    // The same shape replays the same arithmetic. Another one sums each gradient in another
    // order over steps 5 to 8 (fp32, as the adapter reshards float optimizer state only): the
    // tanh MLP is smooth, so first order holds (tolerance.hpp); the weights' group has the
    // larger lr / (1 - momentum); a gradient element sums 12 rows, the micro-batches' or ranks'
    // partials (at most 4) and two scalings; terms: mse error 2 |y^ - y| / 60 < 0.3 per row,
    // tanh outputs below 1, randn inputs below 5, weights below 1: well under 50.
    const double limit = r.name == "PP 2 x DP 2"
                             ? 0.0
                             : reordering_bound({.lr = 0.05,
                                                 .momentum = 0.9,
                                                 .steps = kSteps - 4,
                                                 .longest_sum = 12 + 4 + 2,
                                                 .magnitude = 50,
                                                 .unit_roundoff = kUnitRoundoffF32});
    MESSAGE("PP 2 x DP 2 step 4 -> " << r.name << ": max |resumed - uninterrupted| " << d
                                     << " (limit " << limit << ")");
    CHECK(d <= limit);
  }

  // One LibTorch archive of the stages' layers, loaded by the plain model: the values at the
  // save, the BatchNorm's statistics with them.
  const auto merged = run_accel({"merge-weights", dir / "ck", dir / "model.pt"});
  INFO(describe(merged));
  REQUIRE(merged.exit_code() == 0);
  namespace nn = torch::nn;
  nn::Sequential plain(nn::Linear(10, 16), nn::BatchNorm1d(16), nn::Tanh(), nn::Linear(16, 12),
                       nn::Tanh(), nn::Linear(12, 5));
  torch::load(plain, dir / "model.pt");
  std::vector<double> loaded;
  for (const auto& p : plain->parameters()) {
    const torch::Tensor d = p.detach().to(torch::kDouble).contiguous().flatten();
    loaded.insert(loaded.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
  CHECK(max_difference(loaded, read_doubles(dir / "at_save")) == 0.0);
  const torch::Tensor mean = plain[1]->as<nn::BatchNorm1d>()->running_mean;
  CHECK(torch::equal(mean, torch::linspace(-0.5, 0.5, 16)));
}

TEST_CASE("a stage killed while writing the second save leaves the first, which resumes") {
  TempDir dir("accel_pipeline_kill");
  const auto straight = run_worker(4, 2, {"--dump", dir / "straight"});
  INFO(describe(straight));
  REQUIRE(straight.exit_code() == 0);
  // Rank 1 (stage 1) dies writing its blobs of the save after step 4.
  RanksOptions options;
  options.stop_on_failure = false;
  const auto killed =
      run_ranks(4, "pipeline_resume_worker",
                {"--stages", "2", "--steps", std::to_string(kSteps), "--microbatches", "3",
                 "--checkpoint", dir / "ck", "--save_at", "2,4", "--kill_rank", "1", "--kill_save",
                 "2", "--kill_point", "fs:write"},
                options);
  INFO(describe(killed));
  REQUIRE_FALSE(killed.timed_out);
  CHECK(killed.workers.at(1).signal == SIGKILL);
  const auto resumed = run_worker(4, 2, {"--resume", dir / "ck", "--dump", dir / "resumed"});
  INFO(describe(resumed));
  REQUIRE(resumed.exit_code() == 0);
  CHECK(count_in_output(resumed, "loaded step 2") == 1);
  CHECK(max_difference(read_doubles(dir / "resumed"), read_doubles(dir / "straight")) == 0.0);
}

TEST_CASE("a checkpoint of another model or without a layout is refused, naming why") {
  TempDir dir("accel_pipeline_refused");
  const auto saved = run_worker(2, 2, {"--checkpoint", dir / "ck", "--save_at", "1"});
  INFO(describe(saved));
  REQUIRE(saved.exit_code() == 0);
  const auto wider = run_worker(2, 2, {"--resume", dir / "ck", "--wider"});
  CHECK(wider.exit_code() == 1);
  CHECK(count_in_output(wider,
                        "the pipeline's model differs from the checkpoint's "
                        "(parameters.layout): the checkpoint has 'param 0 f32 160 "
                        "0.weight shape [16,10]', this job has 'param 0 f32 200 0.weight "
                        "shape [20,10]'") == 2);
  // Without a pipeline and by default (FULL_STATE_DICT): a LibTorch archive of the whole model.
  const auto full = run_worker(2, 0, {"--checkpoint", dir / "full", "--save_at", "1"});
  REQUIRE(full.exit_code() == 0);
  const auto refused = run_worker(2, 2, {"--resume", dir / "full"});
  CHECK(refused.exit_code() == 1);
  CHECK(count_in_output(refused,
                        "has no parameters.layout: saved with state_dict_type "
                        "FULL_STATE_DICT") == 2);
}
