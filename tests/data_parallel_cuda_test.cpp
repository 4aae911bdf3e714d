// DataParallelStrategy with GPU replicas (backends/dataparallel), driven directly with
// gradients the test writes: after sync_gradients replica 0 holds the weighted sum of every
// replica's gradient (bit for bit the same sum computed on the CPU) and the other replicas'
// gradients are zero; prepare, after_optimizer_step and sync_buffers copy replica 0's
// parameters and buffers to the others; gradient storage the strategy allocates lives on each
// replica's GPU. Replicas share GPU 0 (their gradients read in place), and with two GPUs sit
// on GPUs 0 and 1 (staged on GPU 0 through cross-device copies). A parameter on the wrong
// device is refused naming the replica. Skipped without the CUDA kernels or a GPU.
//
// The end-to-end GPU path (examples/raw_cuda under DATA_PARALLEL, through the Accelerator) is
// in raw_cuda_test.

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/comm/local_communicator.hpp"
#include "backends/dataparallel/data_parallel_strategy.hpp"
#include "backends/optim/elementwise.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/error.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/staging.hpp"

using namespace accel;
using namespace accel::test;

namespace {

constexpr Milliseconds kWait{30000};
const std::vector<std::size_t> kSizes = {100003, 7, 1};  // the last: gradient from the strategy

bool no_gpu() {
  if (skip_unless(cuda_kernels_built(), "this build has no CUDA kernels (ACCEL_WITH_CUDA=OFF)"))
    return true;
  return skip_unless(cuda_device_count() > 0,
                     "no CUDA device visible: DataParallel on GPUs needs one");
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> out(n);
  for (float& v : out) v = d(rng);
  return out;
}

// Every device's legacy default stream drained: what the strategy queued is done.
void drain(const std::vector<int>& devices) {
  for (int d : devices) synchronize_stream(nullptr, d, kWait, "data_parallel_cuda_test");
}

void upload(Buffer dst, const std::vector<float>& host) {
  copy_buffer(dst, buffer_of(std::span(host)), nullptr);
}

std::vector<float> download(Buffer src, const std::vector<int>& devices) {
  drain(devices);
  std::vector<float> host(src.count);
  copy_buffer(buffer_of(std::span(host)), src, nullptr);
  drain(devices);
  return host;
}

// One replica's parameters (and gradients, but for the last parameter's) and one buffer, on
// its GPU.
struct Replica {
  std::vector<DeviceBuffer> params, grads;
  DeviceBuffer buffer;
  Replica(int device) : buffer(5, DType::f32, MemoryKind::cuda, device) {
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      params.emplace_back(kSizes[i], DType::f32, MemoryKind::cuda, device);
      if (i + 1 < kSizes.size())
        grads.emplace_back(kSizes[i], DType::f32, MemoryKind::cuda, device);
    }
  }
  std::vector<ParamRef> refs() const {
    std::vector<ParamRef> out;
    for (std::size_t i = 0; i < kSizes.size(); ++i)
      out.push_back({"p" + std::to_string(i), params[i].view(),
                     i < grads.size() ? grads[i].view()
                                      : Buffer{nullptr, kSizes[i], DType::f32, DeviceKind::cuda}});
    return out;
  }
};

void check_replicas(const std::vector<int>& devices) {
  CAPTURE(devices.size());
  CAPTURE(devices.back());
  std::mt19937 rng(17);
  const int k_count = int(devices.size());
  std::vector<std::unique_ptr<Replica>> replicas;
  for (int d : devices) {
    CudaDeviceGuard on(d);
    replicas.push_back(std::make_unique<Replica>(d));
  }
  std::vector<std::vector<float>> values;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    values.push_back(random_floats(kSizes[i], rng));
    upload(replicas[0]->params[i].view(), values.back());
  }
  const std::vector<float> buffer_values = random_floats(5, rng);
  upload(replicas[0]->buffer.view(), buffer_values);

  LocalCommunicator comm;
  comm.use_cuda_device(devices[0]);
  DataParallelOptions options;
  options.replicas = k_count;
  options.cuda_devices = devices;
  for (int k = 1; k < k_count; ++k) {
    options.replica_params.push_back(replicas[std::size_t(k)]->refs());
    options.replica_buffers.push_back({replicas[std::size_t(k)]->buffer.view()});
  }
  CudaDeviceGuard on(devices[0]);  // the loop's thread: replica 0's GPU
  DataParallelStrategy dp(comm, replicas[0]->refs(), {replicas[0]->buffer.view()},
                          std::move(options));
  dp.prepare();
  for (int k = 0; k < k_count; ++k) {
    CAPTURE(k);
    for (std::size_t i = 0; i < kSizes.size(); ++i)
      CHECK(download(dp.replica_params(k)[i].data, devices) == values[i]);
    CHECK(download(replicas[std::size_t(k)]->buffer.view(), devices) == buffer_values);
    // The gradient storage the strategy allocated is on the replica's GPU.
    CHECK(cuda_device_of(dp.grad_slot(k, kSizes.size() - 1).data) == devices[std::size_t(k)]);
  }

  // Weighted (DataParallel's shares of the rows), then plain sums.
  for (const bool weighted : {true, false}) {
    CAPTURE(weighted);
    std::vector<double> weights(std::size_t(k_count), 1.0);
    if (weighted)
      for (int k = 0; k < k_count; ++k)
        weights[std::size_t(k)] = double(k + 1) / double(k_count * (k_count + 1) / 2);
    std::vector<std::vector<std::vector<float>>> grads(devices.size());  // [k][i]
    for (int k = 0; k < k_count; ++k)
      for (std::size_t i = 0; i < kSizes.size(); ++i) {
        grads[std::size_t(k)].push_back(random_floats(kSizes[i], rng));
        CudaDeviceGuard replica(devices[std::size_t(k)]);
        upload(dp.grad_slot(k, i), grads[std::size_t(k)][i]);
      }
    drain(devices);
    dp.set_weights(weights);
    dp.sync_gradients();
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      CAPTURE(i);
      std::vector<float> expected = grads[0][i];
      std::vector<Buffer> sources;
      for (int k = 1; k < k_count; ++k)
        sources.push_back(buffer_of(std::span(grads[std::size_t(k)][i])));
      weighted_sum(buffer_of(std::span(expected)), sources, weights, 1.0);
      CHECK(download(dp.grad_slot(0, i), devices) == expected);
      for (int k = 1; k < k_count; ++k)
        CHECK(download(dp.grad_slot(k, i), devices) == std::vector<float>(kSizes[i], 0.0f));
    }
  }

  // The optimizer changed replica 0: the others follow, and so do the buffers.
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    values[i] = random_floats(kSizes[i], rng);
    upload(replicas[0]->params[i].view(), values[i]);
  }
  const std::vector<float> new_buffer = random_floats(5, rng);
  upload(replicas[0]->buffer.view(), new_buffer);
  dp.after_optimizer_step();
  dp.sync_buffers();
  for (int k = 1; k < k_count; ++k) {
    CAPTURE(k);
    for (std::size_t i = 0; i < kSizes.size(); ++i)
      CHECK(download(dp.replica_params(k)[i].data, devices) == values[i]);
    CHECK(download(replicas[std::size_t(k)]->buffer.view(), devices) == new_buffer);
  }

  // The replica's work ran with its GPU current.
  std::vector<int> seen(std::size_t(k_count), -1);
  dp.run([&](int k) { seen[std::size_t(k)] = current_cuda_device(); });
  CHECK(seen == devices);
}

}  // namespace

TEST_CASE("DataParallel on GPU replicas: weighted sums into replica 0, zeroed others, copies") {
  if (no_gpu()) return;
  SUBCASE("two replicas sharing GPU 0") { check_replicas({0, 0}); }
  SUBCASE("three replicas sharing GPU 0") { check_replicas({0, 0, 0}); }
  if (cuda_device_count() >= 2) {
    SUBCASE("replicas on GPUs 0 and 1") { check_replicas({0, 1}); }
    SUBCASE("replicas on GPUs 1 and 0 (replica 0 not on GPU 0)") { check_replicas({1, 0}); }
  } else {
    MESSAGE("one GPU visible: the cross-device cases (GPUs 0 and 1) did not run");
  }
}

TEST_CASE("DataParallel on GPUs refuses a replica whose parameters are elsewhere") {
  if (no_gpu()) return;
  Replica first(0);
  std::vector<float> host(kSizes[0]);
  std::vector<ParamRef> second = first.refs();
  second[0].data = buffer_of(std::span(host));  // replica 1's first parameter in host memory
  second[0].data.device = DeviceKind::cuda;     // even when it claims to be on a GPU
  LocalCommunicator comm;
  DataParallelOptions options;
  options.replicas = 2;
  options.cuda_devices = {0, 0};
  options.replica_params = {second};
  options.replica_buffers = {{first.buffer.view()}};
  CHECK_THROWS_WITH_AS(
      DataParallelStrategy(comm, first.refs(), {first.buffer.view()}, std::move(options)),
      doctest::Contains("replica 1: parameter 'p0' is not on CUDA device 0"), InvalidArgument);
}
