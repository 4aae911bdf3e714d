// Where the strategies keep their buffers, checked without a GPU: with CPU parameters the
// ZeRO optimizer offload is a no-op (same segments, same results, bitwise), the config's
// offload_optimizer_device reaches the strategy through the Accelerator, and parameters on
// another device than the communicator's are refused naming the parameter and both sides.
// (With a GPU, nccl_test runs DDP and ZeRO on CUDA buffers.)

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "backends/comm/local_communicator.hpp"
#include "backends/optim/sgd.hpp"
#include "backends/strategy_factory.hpp"
#include "backends/zero/zero_strategy.hpp"
#include "foundation/error.hpp"
#include "tests/support/files.hpp"

using namespace accel;

namespace {

// A few steps of SGD with momentum on gradients that depend on the values, under ZeRO-2.
std::vector<std::vector<float>> train_zero(OffloadDevice offload, bool* offloaded) {
  LocalCommunicator comm;
  std::vector<std::vector<float>> values = {std::vector<float>(7), std::vector<float>(40)};
  std::vector<std::vector<float>> grads = {std::vector<float>(7), std::vector<float>(40)};
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::size_t k = 0; k < values[i].size(); ++k) values[i][k] = std::sin(float(i * 100 + k));
  std::vector<ParamRef> params;
  for (std::size_t i = 0; i < values.size(); ++i)
    params.push_back(
        {"p" + std::to_string(i), buffer_of(std::span(values[i])), buffer_of(std::span(grads[i]))});
  StrategyOptions options;
  options.kind = StrategyKind::zero;
  options.zero.stage = 2;
  options.zero.bucket_cap_bytes = 64;
  options.zero.offload_optimizer = offload;
  auto strategy = make_strategy(comm, params, {}, options);
  auto& zero = dynamic_cast<ZeroStrategy&>(*strategy);
  strategy->prepare();
  *offloaded = zero.offloads_optimizer();
  // One flat buffer, all of it this rank's: the optimizer steps it in place, no host copy.
  const std::vector<ParamSegment> segments = strategy->segments();
  REQUIRE(segments.size() == 1);
  CHECK(segments[0].values.data == zero.param_slot(0).data);
  Sgd sgd(SgdOptions{.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 5; ++step) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      for (std::size_t k = 0; k < values[i].size(); ++k)
        grads[i][k] = 0.5f * values[i][k] + std::cos(float(step + k));
      strategy->grad_ready(i);
    }
    strategy->sync_gradients();
    sgd.step(strategy->segments());
    strategy->after_optimizer_step();
  }
  return values;
}

}  // namespace

TEST_CASE("ZeRO optimizer offload with CPU parameters changes nothing") {
  bool offloaded_none = true, offloaded_cpu = true;
  const auto plain = train_zero(OffloadDevice::none, &offloaded_none);
  const auto offload = train_zero(OffloadDevice::cpu, &offloaded_cpu);
  CHECK_FALSE(offloaded_none);
  CHECK_FALSE(offloaded_cpu);
  CHECK(plain == offload);                 // bitwise
  CHECK(plain[1][3] != std::sin(103.0f));  // and training did move the values
}

TEST_CASE("parameters on another device than the communicator's are refused, naming them") {
  LocalCommunicator comm;
  float values[4] = {}, grads[4] = {};
  // Marked CUDA (never dereferenced: the strategies check before touching anything).
  std::vector<ParamRef> params = {{"encoder.weight",
                                   Buffer{values, 4, DType::f32, DeviceKind::cuda},
                                   Buffer{grads, 4, DType::f32, DeviceKind::cuda}}};
  for (const StrategyKind kind : {StrategyKind::ddp, StrategyKind::zero}) {
    CAPTURE(std::string(strategy_kind_name(kind)));
    StrategyOptions options;
    options.kind = kind;
    CHECK_THROWS_WITH_AS(make_strategy(comm, params, {}, options),
                         doctest::Contains("parameter 'encoder.weight' is in CUDA memory, but "
                                           "the local communicator works on CPU buffers"),
                         InvalidArgument);
  }
  // A gradient elsewhere than its parameter.
  params[0].data.device = DeviceKind::cpu;
  StrategyOptions options;
  CHECK_THROWS_WITH_AS(make_strategy(comm, params, {}, options),
                       doctest::Contains("the gradient of 'encoder.weight' is on another device"),
                       InvalidArgument);
}

TEST_CASE("the Accelerator hands offload_optimizer_device to ZeRO") {
  // A world of one in this process; the setting from the environment, as a launcher passes it.
  test::TempDir home;
  ::setenv("XDG_CONFIG_HOME", home.path.c_str(), 1);  // no user config file
  ::setenv("ACCEL_OFFLOAD_OPTIMIZER_DEVICE", "cpu", 1);
  AcceleratorOptions options;
  options.distributed_type = "ZERO";
  options.zero_stage = 2;
  Accelerator accelerator(options);
  ::unsetenv("ACCEL_OFFLOAD_OPTIMIZER_DEVICE");
  CHECK(accelerator.strategy_options().kind == StrategyKind::zero);
  CHECK(accelerator.strategy_options().zero.offload_optimizer == OffloadDevice::cpu);
  std::vector<float> w(6, 1.0f), g(6, 0.0f);
  accelerator.prepare_parameters({{"w", buffer_of(std::span(w)), buffer_of(std::span(g))}});
  // CPU parameters: nothing to offload, the optimizer steps the flat buffer itself.
  auto& zero = dynamic_cast<ZeroStrategy&>(accelerator.strategy());
  CHECK_FALSE(zero.offloads_optimizer());
  CHECK(zero.segments()[0].values.data == zero.param_slot(0).data);
}
