// fp16 dynamic loss scaling (accelerate/loss_scaler.hpp): the scaler's schedule and checkpoint
// text in this process, unscaling of every float dtype, and over real processes
// (loss_scaling_worker) a step that overflowed on one rank skipped on all of them, with 1, 2
// and 3 ranks, under DDP and ZeRO stages 1, 2 and 3 (its one parameter sharded: persistence
// threshold 0).

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "accelerate/loss_scaler.hpp"
#include "backends/comm/local_communicator.hpp"
#include "backends/comm/registry.hpp"
#include "backends/optim/elementwise.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

TEST_CASE("the scale backs off on overflow and grows after growth_interval finite steps") {
  LocalCommunicator comm;
  DynamicLossScaler scaler(
      {.init_scale = 8, .growth_factor = 2, .backoff_factor = 0.5, .growth_interval = 2});
  CHECK(scaler.update(comm, true));
  CHECK(scaler.scale() == 8);
  CHECK(scaler.update(comm, true));
  CHECK(scaler.scale() == 16);
  CHECK_FALSE(scaler.update(comm, false));
  CHECK(scaler.scale() == 8);
  CHECK(scaler.growth_tracker() == 0);
  CHECK(scaler.update(comm, true));

  DynamicLossScaler restored;
  restored.load(scaler.save());
  CHECK(restored.scale() == 8);
  CHECK(restored.growth_tracker() == 1);
  CHECK_THROWS_AS(restored.load("not a scale"), CheckpointError);
  CHECK_THROWS_AS(restored.load("-4 0"), CheckpointError);
  CHECK_THROWS_AS(DynamicLossScaler({.init_scale = 0}), InvalidArgument);
}

TEST_CASE("unscaling divides every float dtype and finds an inf or a NaN") {
  std::vector<float> f = {2, -4, 8};
  std::vector<double> d = {16, 32};
  std::vector<Half> h = {to_half(64.0f)};
  std::vector<BFloat16> b = {to_bf16(128.0f)};
  const std::vector<Buffer> grads = {buffer_of(std::span(f)), buffer_of(std::span(d)),
                                     buffer_of(std::span(h)), buffer_of(std::span(b))};
  CHECK(unscale_gradients(grads, 2.0));
  CHECK(f == std::vector<float>{1, -2, 4});
  CHECK(d == std::vector<double>{8, 16});
  CHECK(to_float(h[0]) == 32.0f);
  CHECK(to_float(b[0]) == 64.0f);

  f[1] = std::numeric_limits<float>::infinity();
  CHECK_FALSE(unscale_gradients(grads, 2.0));
  f[1] = 0;
  d[0] = std::nan("");
  CHECK_FALSE(unscale_gradients(grads, 2.0));
}

TEST_CASE("a step that overflowed on one rank is skipped on every rank") {
  const std::vector<std::vector<std::string>> strategies = {
      {}, {"--zero", "1"}, {"--zero", "2"}, {"--zero", "3"}};
  for (const auto& strategy : strategies) {
    for (const int world : {1, 2, 3}) {
      CAPTURE(world);
      CAPTURE(strategy.size() == 2 ? "zero " + strategy[1] : std::string("ddp"));
      RanksOptions options;
      if (strategy.size() == 2 && strategy[1] == "3")
        options.env = {{"ACCEL_ZERO3_PARAM_PERSISTENCE_THRESHOLD", "0"}};
      const auto result = run_ranks(world, "loss_scaling_worker", strategy, options);
      INFO(describe(result));
      REQUIRE(result.exit_code() == 0);
      const Verdicts verdicts(result);
      CHECK_VERDICTS_PASSED(verdicts);
      CHECK_VERDICT(verdicts, "every rank skipped exactly the step that overflowed", world);
      CHECK_VERDICT(verdicts, "training equals one process skipping the same step", world);
    }
  }
}
