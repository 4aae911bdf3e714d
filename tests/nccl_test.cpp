// NCCL on CUDA buffers: the collective matrix, one rank per visible GPU (1, 2 or 4 ranks as
// the GPUs allow); stream ordering against a compute stream; DDP and ZeRO on CUDA parameters
// (world 1). Skipped, saying why, where no GPU is visible (built only with ACCEL_WITH_NCCL).

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "backends/comm/local_communicator.hpp"
#include "backends/comm/registry.hpp"
#include "backends/optim/elementwise.hpp"
#include "backends/optim/sgd.hpp"
#include "backends/strategy_factory.hpp"
#include "backends/zero/zero_strategy.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/store/memory_store.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/staging.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

TEST_CASE("nccl collectives match the reference on CUDA buffers") {
  if (skip_unless(communicator_available("nccl"), "nccl communicator not built")) return;
  const int gpus = cuda_device_count();
  if (skip_unless(gpus > 0, "no CUDA device visible: the NCCL tests need a GPU")) return;
  for (int world : {1, 2, 4}) {
    if (world > gpus) break;
    CAPTURE(world);
    const auto result = run_ranks(world, "comm_collectives_worker", {"--backend", "nccl"});
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    CHECK_VERDICT(Verdicts(result), "every collective's result is the reference's", world);
  }
}

// ---- DDP and ZeRO with CUDA parameters over NCCL (world of one: NCCL refuses two ranks on
// one device), against the same loop with host parameters over the local communicator.
//
// The "model" is a few parameters whose gradients the host computes from their current
// values (so a wrong update would show in every later step); parameter 2 is never used, so
// its gradient is whatever its buffer holds. The loop keeps its gradients where the
// parameters live (host or GPU) and computes on a non-blocking stream of its own: the
// strategies' copies into their buckets are queued there without a host wait, so each
// collective must be ordered after them by the communicator's events, not by the legacy
// default stream (which a non-blocking stream does not synchronise with). The optimizer is the
// built-in Sgd: on host segments the CPU loop (host loop, or ZeRO with offload), on CUDA
// segments its CUDA kernels on that same compute stream (compute_context(comm); through a host
// copy in a build without the kernels). The kernels do the CPU loop's arithmetic (no fused
// multiply-add) and world 1 averages nothing: the results must agree (the test allows 1e-6).

namespace {

const std::vector<std::size_t> kParamSizes = {37, 300, 5, 1000, 64};
constexpr std::size_t kUnused = 2;

struct LoopSettings {
  StrategyKind kind = StrategyKind::ddp;  // or zero
  int stage = 1;
  OffloadDevice offload = OffloadDevice::none;
  int accumulation = 1;
  int steps = 6;
};

// Blocks until `stream`'s work is done (bounded), for the test's own host reads.
void sync(DeviceStream stream) {
  synchronize_stream(stream, 0, std::chrono::seconds(60), "nccl_test");
}

std::vector<std::vector<float>> train(Communicator& comm, const LoopSettings& settings,
                                      DeviceStream stream) {
  const bool gpu = comm.device() == DeviceKind::cuda;
  const MemoryKind memory = gpu ? MemoryKind::cuda : MemoryKind::host;
  std::vector<std::vector<float>> values, accumulated;
  std::vector<DeviceBuffer> data, grad;
  std::vector<ParamRef> params;
  for (std::size_t i = 0; i < kParamSizes.size(); ++i) {
    values.emplace_back(kParamSizes[i]);
    accumulated.emplace_back(kParamSizes[i], 0.0f);
    for (std::size_t k = 0; k < kParamSizes[i]; ++k) values[i][k] = std::sin(float(7 * i + k));
    data.emplace_back(kParamSizes[i], DType::f32, memory, comm.cuda_device());
    grad.emplace_back(kParamSizes[i], DType::f32, memory, comm.cuda_device());
    copy_buffer(data[i].view(), buffer_of(std::span(values[i])), stream);
    // Parameters 0 and 1 in param group 1, the rest in group 0: two flat buffers under ZeRO.
    params.push_back({"p" + std::to_string(i), data[i].view(), grad[i].view(), i < 2 ? 1u : 0u});
  }
  sync(stream);
  comm.set_compute_stream(stream);
  StrategyOptions options;
  options.kind = settings.kind;
  options.ddp.first_bucket_bytes = 256;  // several buckets
  options.ddp.bucket_cap_bytes = 1024;
  options.zero.stage = settings.stage;
  options.zero.bucket_cap_bytes = 1024;
  options.zero.offload_optimizer = settings.offload;
  auto strategy = make_strategy(comm, params, {}, options);
  strategy->prepare();
  if (auto* zero = dynamic_cast<ZeroStrategy*>(strategy.get()))
    CHECK(zero->offloads_optimizer() == (gpu && settings.offload == OffloadDevice::cpu));

  Sgd sgd(std::vector<SgdOptions>{{.lr = 0.05, .momentum = 0.9}, {.lr = 0.02, .momentum = 0.5}});
  std::vector<std::vector<float>> staged_values, staged_grads;  // host copies of CUDA segments
  for (int step = 0; step < settings.steps; ++step) {
    for (int micro = 0; micro < settings.accumulation; ++micro) {
      strategy->set_sync_enabled(micro + 1 == settings.accumulation);
      for (std::size_t i = 0; i < values.size(); ++i)
        copy_buffer(buffer_of(std::span(values[i])), data[i].view(), stream);
      sync(stream);  // the forward reads the current values on the host
      // Backward in reverse order, as the hooks would fire.
      for (std::size_t i = values.size(); i-- > 0;) {
        if (i == kUnused) continue;
        for (std::size_t k = 0; k < values[i].size(); ++k)
          accumulated[i][k] += 0.1f * values[i][k] + std::cos(float(step * 3 + micro + k + i));
        copy_buffer(grad[i].view(), buffer_of(std::span(accumulated[i])), stream);
        sync(stream);  // the host array is rewritten for the next parameter
        strategy->grad_ready(i);
      }
      strategy->sync_gradients();
    }
    std::vector<ParamSegment> segments = strategy->segments();
    const bool on_device = !segments.empty() && segments[0].values.device == DeviceKind::cuda;
    if (on_device && cuda_kernels_built()) {
      // The built-in Sgd's CUDA kernels, queued on the non-blocking compute stream after the
      // strategy's copies and before its all-gather, with no host wait in between.
      sgd.step(segments, compute_context(comm));
    } else if (on_device) {  // NCCL without the kernels (ACCEL_WITH_CUDA=OFF): a host copy
      if (staged_values.empty())
        for (const ParamSegment& s : segments) {
          staged_values.emplace_back(s.values.count);
          staged_grads.emplace_back(s.grad.count);
        }
      std::vector<ParamSegment> host = segments;
      for (std::size_t j = 0; j < segments.size(); ++j) {
        host[j].values = buffer_of(std::span(staged_values[j]));
        host[j].grad = buffer_of(std::span(staged_grads[j]));
        copy_buffer(host[j].values, segments[j].values, stream);
        copy_buffer(host[j].grad, segments[j].grad, stream);
      }
      sync(stream);
      sgd.step(host);
      for (std::size_t j = 0; j < segments.size(); ++j)
        copy_buffer(segments[j].values, host[j].values, stream);
    } else {
      sync(stream);  // DDP's averaged gradients were copied back on the stream
      sgd.step(segments);
    }
    strategy->after_optimizer_step();
    for (auto& a : accumulated) std::fill(a.begin(), a.end(), 0.0f);
  }
  for (std::size_t i = 0; i < values.size(); ++i)
    copy_buffer(buffer_of(std::span(values[i])), data[i].view(), stream);
  sync(stream);
  strategy.reset();
  comm.set_compute_stream(nullptr);
  return values;
}

double max_difference(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t k = 0; k < a[i].size(); ++k)
      worst = std::max(worst, std::abs(double(a[i][k]) - double(b[i][k])));
  return worst;
}

CommunicatorPtr nccl_world_of_one() {
  CommOptions o;
  o.store = std::make_shared<MemoryStore>();
  o.cuda_device = 0;
  o.timeout = std::chrono::seconds(120);
  return create_communicator("nccl", o);
}

struct ComputeStream {
  cudaStream_t stream = nullptr;
  ComputeStream() {
    cudaSetDevice(0);
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  }
  ~ComputeStream() { cudaStreamDestroy(stream); }
};

bool skip_without_gpu() {
  if (skip_unless(communicator_available("nccl"), "nccl communicator not built")) return true;
  return skip_unless(cuda_device_count() > 0, "no CUDA device visible: the NCCL tests need a GPU");
}

}  // namespace

TEST_CASE("DDP and ZeRO on CUDA parameters over NCCL match the host loop (world 1)") {
  if (skip_without_gpu()) return;
  auto nccl = nccl_world_of_one();
  LocalCommunicator local;
  ComputeStream compute;
  for (int accumulation : {1, 3}) {
    for (const auto& [kind, stage] : std::vector<std::pair<StrategyKind, int>>{
             {StrategyKind::ddp, 0}, {StrategyKind::zero, 1}, {StrategyKind::zero, 2}}) {
      CAPTURE(std::string(strategy_kind_name(kind)));
      CAPTURE(stage);
      CAPTURE(accumulation);
      LoopSettings s;
      s.kind = kind;
      s.stage = stage ? stage : 1;
      s.accumulation = accumulation;
      const auto host = train(local, s, nullptr);
      const auto cuda = train(*nccl, s, compute.stream);
      CHECK(max_difference(host, cuda) <= 1e-6);
      // The unused parameter's gradient buffer held zeros every step: it never moved.
      CHECK(cuda[kUnused][0] == std::sin(float(7 * kUnused)));
    }
  }
}

TEST_CASE("ZeRO optimizer offload to CPU gives the parameters of no offload (world 1, NCCL)") {
  if (skip_without_gpu()) return;
  auto nccl = nccl_world_of_one();
  ComputeStream compute;
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    LoopSettings s;
    s.kind = StrategyKind::zero;
    s.stage = stage;
    s.accumulation = 2;
    const auto plain = train(*nccl, s, compute.stream);
    s.offload = OffloadDevice::cpu;
    const auto offloaded = train(*nccl, s, compute.stream);
    // Both step with the same CPU Sgd on the same values: equal to the bit.
    CHECK(plain == offloaded);
  }
}

TEST_CASE("NCCL operations wait for the compute stream's earlier work, and it for them (world 1)") {
  if (skip_without_gpu()) return;
  auto nccl = nccl_world_of_one();
  ComputeStream compute;
  nccl->set_compute_stream(compute.stream);
  // 64 MiB: the upload queued before the all_gather takes milliseconds, so an all_gather that
  // did not wait for it would read the previous round's values (or zeros).
  const std::size_t n = (std::size_t(64) << 20) / sizeof(float);
  DeviceBuffer host(n, DType::f32, MemoryKind::pinned_host),
      back(n, DType::f32, MemoryKind::pinned_host);
  DeviceBuffer in(n, DType::f32, MemoryKind::cuda, 0), out(n, DType::f32, MemoryKind::cuda, 0);
  auto* h = static_cast<float*>(host.view().data);
  for (int round = 1; round <= 3; ++round) {
    CAPTURE(round);
    for (std::size_t i = 0; i < n; ++i) h[i] = float(round * 1000 + int(i % 997));
    copy_buffer(in.view(), host.view(), compute.stream);          // queued, not waited for
    WorkPtr work = nccl->all_gather(in.view(), out.view());       // world 1: a copy by NCCL
    work->wait_stream(compute.stream, std::chrono::seconds(60));  // no host wait for the GPU
    copy_buffer(back.view(), out.view(), compute.stream);  // after the all_gather, by the event
    sync(compute.stream);
    CHECK(std::memcmp(back.view().data, host.view().data, n * sizeof(float)) == 0);
    work->wait(std::chrono::seconds(60));
  }
  nccl->set_compute_stream(nullptr);
}
