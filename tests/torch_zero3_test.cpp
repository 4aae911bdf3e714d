// ZeRO-3 for LibTorch models over real processes (torch_zero3_worker; the model is
// tests/support/tiny_transformer.hpp): every unit mechanism (the root, ShardedUnit blocks in a
// ModuleList, a Sequential's children) at world 2, 3 (uneven slices) and 4 equals one process
// and DDP, and ZeRO-2 bitwise; the memory a rank holds and the bytes a step moves (the worker
// checks both); checkpoints across world sizes and strategies, merged into a plain LibTorch
// model; activation checkpointing bitwise under DDP and ZeRO-3; misuse.

#include <torch/torch.h>
#undef CHECK  // LibTorch's glog CHECK; doctest's below

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/comm/registry.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/tiny_transformer.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

constexpr int kSteps = 20, kAccumulation = 4, kGlobalRows = 12;
constexpr std::size_t kParameters = 7312;  // the tiny transformer's, the tied weight once

// Persistent below 100 elements: the biases, LayerNorms and positions stay gathered, the
// matrices and the embedding are sharded.
std::vector<std::pair<std::string, std::string>> stage3_env(const std::string& backend) {
  return {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"},
          {"ACCEL_ZERO_STAGE", "3"},
          {"ACCEL_ZERO3_PARAM_PERSISTENCE_THRESHOLD", "100"},
          {"ACCEL_CPU_COMMUNICATOR", backend}};
}

std::vector<std::pair<std::string, std::string>> ddp_env(const std::string& backend) {
  return {{"ACCEL_DISTRIBUTED_TYPE", "MULTI_CPU"}, {"ACCEL_CPU_COMMUNICATOR", backend}};
}

// A gradient element of the mean cross-entropy is a sum over the step's tokens (K micro-
// batches of 12 sequences of 6) of an activation times an output error: LayerNorm keeps the
// activations within sqrt(16) = 4, the softmax errors of a mean over the tokens sum to at
// most 2, weights stay below 1 (initialised below 0.25, AdamW moves them by at most lr per
// step): every element's sum of |terms| well under 100. Clipped to norm 1 (ClippedRun).
double magnitude(std::size_t longest_sum) {
  return clipped_magnitude({.max_magnitude = 100,
                            .norm_magnitude = 100 * std::sqrt(double(kParameters)),
                            .clip = 1.0,
                            .elements = kParameters,
                            .longest_sum = longest_sum});
}

double adamw_bound(std::size_t longest_sum) {
  return adam_reordering_bound({.lr = 0.01,
                                .eps = 1e-5,
                                .steps = kSteps,
                                .longest_sum = longest_sum,
                                .magnitude = magnitude(longest_sum)});
}

// Against one process: every sum over the global batch's tokens splits and reorders, then the
// world's partial sums and two roundings of the 1 / (rows K) scale.
double one_process_limit(int world) {
  return adamw_bound(std::size_t(kAccumulation * kGlobalRows * 6 + world + 2));
}

// Against DDP at the same world size: the same per-rank gradients from the same kernels; only
// the sum of the world's partials (and the clip norm's) is ordered otherwise.
double ddp_limit(int world) { return adamw_bound(std::size_t(world + 2)); }

std::string output_of(const launch::GroupResult& r) {
  std::string all;
  for (const auto& w : r.workers) all += w.output;
  return all;
}

void expect_ok(const launch::GroupResult& r) {
  INFO(describe(r));
  REQUIRE(r.exit_code() == 0);
  CHECK_VERDICTS_PASSED(Verdicts(r));
}

std::string line_with(const launch::GroupResult& r, const std::string& what) {
  const std::string all = output_of(r);
  const auto at = all.find(what);
  return at == std::string::npos ? std::string() : all.substr(at, all.find('\n', at) - at);
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(!a.empty());
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

RanksOptions with_env(std::vector<std::pair<std::string, std::string>> env) {
  RanksOptions o;
  o.env = std::move(env);
  return o;
}

// Runs `units` at `world` under stage 3 over `backend` (run: our ranks or mpirun) and checks
// it against one process (in the worker) and the DDP parameters `ddp`.
template <typename Run>
void expect_stage3(Run run, const std::string& backend, int world, const std::string& units,
                   const std::vector<double>& ddp, const TempDir& dir,
                   const std::vector<std::pair<std::string, std::string>>& extra_env = {}) {
  CAPTURE(backend);
  CAPTURE(world);
  CAPTURE(units);
  const std::string dump = dir / ("zero3_" + backend + "_" + units + std::to_string(world));
  auto env = stage3_env(backend);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  const auto r =
      run(world, "torch_zero3_worker",
          {"--units", units, "--limit", std::to_string(one_process_limit(world)), "--dump", dump},
          with_env(env));
  expect_ok(r);
  const Verdicts verdicts(r);
  CHECK_VERDICT(verdicts, "ZeRO-3 memory", world);
  const std::string memory = verdicts.detail("ZeRO-3 memory", 0);
  const double d = max_difference(read_doubles(dump), ddp);
  MESSAGE(backend << " world " << world << " units " << units << ": "
                  << verdicts.detail("training equals one process", 0) << "; max |zero3 - ddp| "
                  << d << " (limit " << ddp_limit(world) << "); " << memory << "; "
                  << line_with(r, "prefetch hits") << "; bus bytes "
                  << verdicts.detail("bus bytes of the last step", 0));
  CHECK_VERDICT(verdicts, "bus bytes of the last step", world);
  CHECK(d <= ddp_limit(world));
}

std::vector<double> ddp_parameters(int world, const TempDir& dir) {
  const std::string dump = dir / ("ddp" + std::to_string(world));
  const auto r = run_ranks(
      world, "torch_zero3_worker",
      {"--units", "root", "--limit", std::to_string(one_process_limit(world)), "--dump", dump},
      with_env(ddp_env("gloo")));
  expect_ok(r);
  MESSAGE("ddp world " << world << ": " << Verdicts(r).detail("training equals one process", 0));
  return read_doubles(dump);
}

std::vector<std::string> joined(std::vector<std::string> first,
                                const std::vector<std::string>& more) {
  first.insert(first.end(), more.begin(), more.end());
  return first;
}

// accel merge-weights of checkpoint `ck` into `out`, loaded by a plain model (no accelerator):
// its parameters as doubles, in parameter order (the tied weight under both names).
std::vector<double> merged_parameters(const std::string& ck, const std::string& out, bool wrapped) {
  const auto merged = run_accel({"merge-weights", ck, out});
  INFO(describe(merged));
  REQUIRE(merged.exit_code() == 0);
  Transformer plain(TransformerShape{}, wrapped);
  torch::load(plain, out);
  std::vector<double> loaded;
  for (const auto& p : plain->parameters()) {
    const torch::Tensor d = p.detach().to(torch::kDouble).flatten().contiguous();
    loaded.insert(loaded.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
  return loaded;
}

}  // namespace

TEST_CASE("the bounds the equivalence checks use are within the issue's 1e-6 of DDP") {
  for (int world : {2, 3, 4}) {
    MESSAGE("world " << world << ": limit against DDP " << ddp_limit(world)
                     << ", against one process " << one_process_limit(world));
    CHECK(ddp_limit(world) <= 1e-6);
  }
}

TEST_CASE(
    "ZeRO-3 LibTorch units (root, ModuleList children, ShardedUnit, Sequential) at 2, 3, 4 "
    "over gloo equal DDP and one process; memory per rank") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir dir("accel_torch_zero3");
  for (int world : {2, 3, 4}) {
    const std::vector<double> ddp = ddp_parameters(world, dir);
    for (const char* units : {"root", "automatic", "wrapper", "sequential"})
      expect_stage3(run_ranks, "gloo", world, units, ddp, dir);
    // Units kept gathered from forward to backward: one all-gather per micro-batch fewer.
    if (world == 4)
      for (const char* units : {"automatic", "wrapper"})
        expect_stage3(run_ranks, "gloo", world, units, ddp, dir,
                      {{"ACCEL_RESHARD_AFTER_FORWARD", "false"}});
  }
}

TEST_CASE(
    "HYBRID_SHARD: ZeRO-3 within each of 2 machines of 2 ranks, replicated across them, equals "
    "DDP and one process; slices of half the parameters") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir dir("accel_torch_zero3_hybrid");
  const std::vector<double> ddp = ddp_parameters(4, dir);
  // _HYBRID_SHARD_ZERO2: stage 2 within each machine, the plain model.
  for (const std::string units : {"automatic", "sequential", "zero2"}) {
    CAPTURE(units);
    auto env = stage3_env("gloo");
    if (units == "zero2") {
      env = zero_env(2);
      env.emplace_back("ACCEL_CPU_COMMUNICATOR", "gloo");
    }
    env.emplace_back("ACCEL_HYBRID_SHARD", "true");
    RanksOptions options = with_env(env);
    options.nodes = 2;  // RANK = NODE_RANK x 2 + LOCAL_RANK, as the launcher numbers them
    const std::string dump = dir / ("hybrid_" + units);
    const auto r = run_ranks(4, "torch_zero3_worker",
                             {"--units", units == "zero2" ? "automatic" : units, "--limit",
                              std::to_string(one_process_limit(4)), "--dump", dump},
                             options);
    expect_ok(r);
    // Rank 0's slices: 1/2 of the parameters (its machine's 2 ranks), not 1/4.
    const Verdicts verdicts(r);
    const std::string memory = verdicts.detail("ZeRO-3 memory", 0);
    if (units != "zero2")
      CHECK(memory.find("slices of 3656 of 7312 elements") != std::string::npos);
    CHECK(!line_with(r, "ZeRO: gradient replicas 2, this rank steps 3656 elements").empty());
    const double d = max_difference(read_doubles(dump), ddp);
    MESSAGE("HYBRID_SHARD 2 x 2, units "
            << units << ": " << verdicts.detail("training equals one process", 0)
            << "; max |hybrid - ddp| " << d << " (limit " << ddp_limit(4) << "); " << memory);
    CHECK(d <= ddp_limit(4));
  }
  // Its checkpoints (the LibTorch archive, or each first-machine rank's slices) resume as
  // plain ZeRO-3 at 2 from step 10 (fp32: the adapter reshards float optimizer state).
  for (const std::string type : {"FULL_STATE_DICT", "SHARDED_STATE_DICT"}) {
    CAPTURE(type);
    auto env = stage3_env("gloo");
    env.emplace_back("ACCEL_STATE_DICT_TYPE", type);
    auto hybrid_env = env;
    hybrid_env.emplace_back("ACCEL_HYBRID_SHARD", "true");
    RanksOptions options = with_env(hybrid_env);
    options.nodes = 2;
    const std::string ck = dir / ("ck_" + type);
    expect_ok(run_ranks(4, "torch_zero3_worker",
                        {"--units", "automatic", "--float", "--checkpoint", ck, "--save_at", "10",
                         "--dump", dir / "hybrid_straight"},
                        options));
    expect_ok(run_ranks(
        2, "torch_zero3_worker",
        {"--units", "automatic", "--float", "--resume", ck, "--dump", dir / "hybrid_resumed"},
        with_env(env)));
    const double d =
        max_difference(read_doubles(dir / "hybrid_resumed"), read_doubles(dir / "hybrid_straight"));
    MESSAGE("HYBRID_SHARD 2 x 2 checkpoint (" << type << ") resumed as ZeRO-3 at 2: max "
                                              << "|resumed - uninterrupted| " << d);
    CHECK(d <= 1e-5);
  }
}

TEST_CASE("ZeRO-3 LibTorch is bitwise ZeRO-2 (fp64, and bf16 autocast)") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir dir("accel_torch_zero3_vs_2");
  // The same local gradients, reduce-scattered in the same buckets; the forward reads the
  // same values, gathered instead of all-gathered after the step: the same bits.
  struct Case {
    std::string units;
    std::vector<std::string> more;
    std::vector<std::pair<std::string, std::string>> extra_env;
  };
  const std::vector<Case> cases = {{"root", {}, {}},
                                   {"wrapper", {"--float"}, {{"ACCEL_MIXED_PRECISION", "bf16"}}}};
  for (const Case& c : cases) {
    CAPTURE(c.units);
    std::vector<std::vector<double>> values;
    for (int stage : {2, 3}) {
      auto env = stage == 3 ? stage3_env("gloo") : zero_env(2);
      env.insert(env.end(), c.extra_env.begin(), c.extra_env.end());
      std::vector<std::string> args = {"--units", c.units, "--dump", dir / "zero"};
      args.insert(args.end(), c.more.begin(), c.more.end());
      expect_ok(run_ranks(3, "torch_zero3_worker", args, with_env(env)));
      values.push_back(read_doubles(dir / "zero"));
    }
    CHECK(values[0] == values[1]);
  }
}

TEST_CASE("ZeRO-3 LibTorch over shm and mpi at 3 equals DDP") {
  TempDir dir("accel_torch_zero3_comm");
  const std::vector<double> ddp = ddp_parameters(3, dir);
  if (communicator_available("shm")) expect_stage3(run_ranks, "shm", 3, "wrapper", ddp, dir);
  if (skip_unless(communicator_available("mpi") && !find_mpirun().empty(),
                  "mpi communicator or mpirun not available"))
    return;
  expect_stage3(run_under_mpirun, "mpi", 3, "sequential", ddp, dir);
}

TEST_CASE(
    "a ZeRO-3 LibTorch checkpoint of 4 ranks resumes at 2 (ZeRO-3, DDP) and 1, a DDP one "
    "under ZeRO-3 at 3, and merges into a plain model") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir dir("accel_torch_zero3_resume");
  // fp32: the adapter reshards float optimizer state. The uninterrupted runs save at step 10.
  const std::vector<std::string> common = {"--units", "wrapper", "--float"};
  expect_ok(run_ranks(4, "torch_zero3_worker",
                      joined(common, {"--checkpoint", dir / "ck_zero3", "--save_at", "10", "--dump",
                                      dir / "straight_zero3"}),
                      with_env(stage3_env("gloo"))));
  expect_ok(run_ranks(2, "torch_zero3_worker",
                      joined(common, {"--checkpoint", dir / "ck_ddp", "--save_at", "10", "--dump",
                                      dir / "straight_ddp"}),
                      with_env(ddp_env("gloo"))));
  struct Resume {
    std::string name;
    int world;
    std::vector<std::pair<std::string, std::string>> env;
    std::string from, straight;
  };
  const std::vector<Resume> resumes = {
      {"zero3 world 2", 2, stage3_env("gloo"), "ck_zero3", "straight_zero3"},
      {"ddp world 2", 2, ddp_env("gloo"), "ck_zero3", "straight_zero3"},
      {"world 1", 1, {{"ACCEL_DISTRIBUTED_TYPE", "NO"}}, "ck_zero3", "straight_zero3"},
      {"zero3 world 3 from ddp", 3, stage3_env("gloo"), "ck_ddp", "straight_ddp"},
  };
  for (const Resume& r : resumes) {
    CAPTURE(r.name);
    expect_ok(run_ranks(r.world, "torch_zero3_worker",
                        joined(common, {"--resume", dir / r.from, "--dump", dir / "resumed"}),
                        with_env(r.env)));
    // fp32 AdamW has no derived bound (tolerance.hpp: 1 / eps times fp32 rounding exceeds a
    // step); 1e-5 is the issue's, for steps 11-20 over other splits of the global batch.
    const double d = max_difference(read_doubles(dir / "resumed"), read_doubles(dir / r.straight));
    MESSAGE("stage-3 LibTorch resume, " << r.name << ": max |resumed - uninterrupted| " << d);
    CHECK(d <= 1e-5);
  }
  // merge-weights: the plain model (no accelerator) loads the archive and holds the values the
  // uninterrupted run had at step 10, when it saved (get_state_dict then, bitwise).
  const std::vector<double> loaded = merged_parameters(dir / "ck_zero3", dir / "model.pt", true);
  CHECK(loaded.size() == kParameters + 32 * 16);  // the tied weight under both names
  CHECK(loaded == read_doubles(dir / "straight_zero3.at_save"));
}

TEST_CASE(
    "SHARDED_STATE_DICT: each ZeRO-3 rank writes its own slices (no archive); 4 ranks resume "
    "at 2 (ZeRO-3, DDP) and 1, and merge into a plain model with the tied weight") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir dir("accel_torch_zero3_sharded");
  const std::vector<std::string> common = {"--units", "automatic", "--float"};
  auto sharded = [](std::vector<std::pair<std::string, std::string>> env) {
    env.emplace_back("ACCEL_STATE_DICT_TYPE", "SHARDED_STATE_DICT");
    return env;
  };
  expect_ok(run_ranks(
      4, "torch_zero3_worker",
      joined(common, {"--checkpoint", dir / "ck", "--save_at", "10", "--dump", dir / "straight"}),
      with_env(sharded(stage3_env("gloo")))));
  // Each rank's slices (a quarter of the parameters each), the layout, no whole-model archive.
  const std::string ck = dir / "ck";
  CHECK_FALSE(std::filesystem::exists(ck + "/state.model"));
  REQUIRE(std::filesystem::exists(ck + "/parameters.layout"));
  std::uintmax_t slice_bytes = 0;
  for (int r = 0; r < 4; ++r) {
    const std::string blob = ck + "/parameters.rank" + std::to_string(r);
    REQUIRE(std::filesystem::exists(blob));
    CHECK(std::filesystem::file_size(blob) <= (kParameters / 4 + 4) * sizeof(float));
    slice_bytes += std::filesystem::file_size(blob);
  }
  CHECK(slice_bytes == kParameters * sizeof(float));
  const std::string layout = read_file(ck + "/parameters.layout");
  CHECK(layout.find(" head.weight\n") != std::string::npos);  // the tied weight's other name
  struct Resume {
    std::string name;
    int world;
    std::vector<std::pair<std::string, std::string>> env;
  };
  const std::vector<Resume> resumes = {
      {"zero3 world 2", 2, stage3_env("gloo")},
      {"ddp world 2", 2, ddp_env("gloo")},
      {"world 1", 1, {{"ACCEL_DISTRIBUTED_TYPE", "NO"}}},
  };
  for (const Resume& r : resumes) {
    CAPTURE(r.name);
    expect_ok(run_ranks(r.world, "torch_zero3_worker",
                        joined(common, {"--resume", ck, "--dump", dir / "resumed"}),
                        with_env(sharded(r.env))));
    const double d = max_difference(read_doubles(dir / "resumed"), read_doubles(dir / "straight"));
    MESSAGE("SHARDED_STATE_DICT resume, " << r.name << ": max |resumed - uninterrupted| " << d);
    CHECK(d <= 1e-5);  // as the FULL_STATE_DICT resumes above
  }
  const std::vector<double> loaded = merged_parameters(ck, dir / "model.pt", false);
  CHECK(loaded == read_doubles(dir / "straight.at_save"));
}

TEST_CASE(
    "project checkpoints over real processes: ZeRO-3 at 2 saves checkpoint_0, 3 resume "
    "from the newest") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir dir("accel_torch_zero3_project");
  auto env = stage3_env("gloo");
  env.insert(env.end(), {{"ACCEL_AUTOMATIC_CHECKPOINT_NAMING", "true"},
                         {"ACCEL_TOTAL_LIMIT", "1"},
                         {"ACCEL_PROJECT_DIR", dir / "project"}});
  const std::vector<std::string> common = {"--units", "wrapper", "--float"};
  const auto straight = run_ranks(
      2, "torch_zero3_worker",
      joined(common, {"--checkpoint", "project", "--save_at", "10", "--dump", dir / "straight"}),
      with_env(env));
  expect_ok(straight);
  CHECK(output_of(straight).find("saved " + dir / "project/checkpoints/checkpoint_0") !=
        std::string::npos);
  expect_ok(run_ranks(3, "torch_zero3_worker",
                      joined(common, {"--resume", "project", "--dump", dir / "resumed"}),
                      with_env(env)));
  const double d = max_difference(read_doubles(dir / "resumed"), read_doubles(dir / "straight"));
  MESSAGE("project checkpoint of world 2 resumed at 3: max |resumed - uninterrupted| " << d);
  CHECK(d <= 1e-5);
}

TEST_CASE(
    "activation checkpointing under DDP and ZeRO-3: bitwise the same parameters with "
    "dropout on, the blocks recomputed") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir dir("accel_torch_zero3_ckpt");
  struct Case {
    std::string name, units;
    std::vector<std::pair<std::string, std::string>> env;
  };
  const std::vector<Case> cases = {{"ddp wrapper", "wrapper", ddp_env("gloo")},
                                   {"zero3 wrapper", "wrapper", stage3_env("gloo")},
                                   {"zero3 sequential", "sequential", stage3_env("gloo")}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    std::vector<std::string> runs;
    std::vector<double> without;
    for (const char* on : {"false", "true"}) {
      auto env = c.env;
      env.emplace_back("ACCEL_ACTIVATION_CHECKPOINTING", on);
      const std::string dump = dir / (c.units + on);
      const auto r = run_ranks(
          2, "torch_zero3_worker",
          {"--units", c.units, "--dropout", "0.1", "--steps", "5", "--dump", dump}, with_env(env));
      expect_ok(r);
      runs.push_back(line_with(r, "block forwards"));
      const std::vector<double> values = read_doubles(dump);
      if (without.empty())
        without = values;
      else
        CHECK(values == without);  // bitwise
    }
    MESSAGE(c.name << ": without " << runs[0] << "; with " << runs[1]);
    // 5 steps of 4 micro-batches, 3 blocks: 60 forwards, and as many recomputes with it (the
    // Sequential's embedding and head share the tied weight: not recomputed, and not blocks).
    CHECK(runs[0].find("block forwards 60 ") != std::string::npos);
    CHECK(runs[1].find("block forwards 120 ") != std::string::npos);
  }
}

TEST_CASE("ZeRO-3 LibTorch misuse fails on every rank, naming what was wrong") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  RanksOptions options = with_env(stage3_env("gloo"));
  options.stop_on_failure = false;
  // Rank 1 runs the blocks in reverse: both ranks name both units, before any all-gather.
  const auto order =
      run_ranks(2, "torch_zero3_worker", {"--units", "wrapper", "--misuse", "order"}, options);
  INFO(describe(order));
  for (const auto& w : order.workers) {
    CHECK(w.exit_code == 3);
    CHECK(w.output.find("the ranks gather units in different orders") != std::string::npos);
    CHECK(w.output.find("'blocks.0.q.weight'") != std::string::npos);
    CHECK(w.output.find("'blocks.2.q.weight'") != std::string::npos);
  }
  // A block called by itself: its unit and the root's parameter named, and the fix.
  const auto outside =
      run_ranks(2, "torch_zero3_worker", {"--units", "wrapper", "--misuse", "outside"}, options);
  INFO(describe(outside));
  for (const auto& w : outside.workers) {
    CHECK(w.exit_code == 3);
    CHECK(w.output.find("unit 'blocks.0' ran outside the prepared model's call") !=
          std::string::npos);
    CHECK(w.output.find("'embed.tokens.weight'") != std::string::npos);
  }
  // The model's own forward, not the prepared call: its first sharded parameter named (the
  // embedding, tied to the head: the root's), whichever units the model has.
  for (const char* units : {"wrapper", "automatic"}) {
    CAPTURE(units);
    const auto direct =
        run_ranks(2, "torch_zero3_worker", {"--units", units, "--misuse", "direct"}, options);
    INFO(describe(direct));
    for (const auto& w : direct.workers) {
      CHECK(w.exit_code == 3);
      CHECK(w.output.find("parameter 'embed.tokens.weight' was used outside the prepared "
                          "model's call") != std::string::npos);
    }
  }
}
