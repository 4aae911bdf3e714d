// The CUDA kernels behind the built-in optimizers, clipping and fp16 unscaling
// (backends/optim/cuda) against the CPU code on the same data: the built-in Sgd / AdamW
// stepping GPU segments against the same optimizer stepping host copies, unscale_gradients
// with an inf and a NaN, the sum of squares and the clipping multiply. Skipped, saying why,
// where no GPU is visible or the build has no CUDA kernels.
//
// Tolerances: the kernels are compiled without fused multiply-add and take the same float
// scalars as the CPU loops, so the optimizers are expected within 1e-6 relative (they should
// in fact be bitwise equal; the message says how many elements differ at all); unscaling and
// scaling go through double exactly as the CPU does: bitwise; the sum of squares is summed in
// another order: 1e-10 relative (n x double's epsilon for the largest buffer, 1e6 elements).

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/optim/adamw.hpp"
#include "backends/optim/elementwise.hpp"
#include "backends/optim/sgd.hpp"
#include "foundation/error.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/staging.hpp"

#if ACCEL_TEST_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>
#endif

using namespace accel;
using namespace accel::test;

namespace {

bool no_gpu() {
  if (skip_unless(cuda_kernels_built(), "this build has no CUDA kernels (ACCEL_WITH_CUDA=OFF)"))
    return true;
  return skip_unless(cuda_device_count() > 0,
                     "no CUDA device visible: the CUDA kernel tests need a GPU");
}

#if ACCEL_TEST_HAVE_CUDA_KERNELS
void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(rc));
}

// A device copy of a host vector, freed at the end.
template <typename T>
struct DeviceVector {
  T* ptr = nullptr;
  std::size_t count = 0;
  explicit DeviceVector(const std::vector<T>& host) : count(host.size()) {
    check_cuda(cudaMalloc(&ptr, std::max<std::size_t>(1, count * sizeof(T))), "cudaMalloc");
    upload(host);
  }
  ~DeviceVector() { cudaFree(ptr); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  void upload(const std::vector<T>& host) {
    check_cuda(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> out(count);
    check_cuda(cudaMemcpy(out.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return out;
  }
  Buffer view() const { return Buffer{ptr, count, dtype_of<T>(), DeviceKind::cuda}; }
};

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = d(rng);
  return out;
}

// Largest |a - b| / max(1, |b|), and how many elements differ at all.
struct Diff {
  double max_rel = 0;
  std::size_t differing = 0;
};
Diff compare(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  REQUIRE(gpu.size() == cpu.size());
  Diff d;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    if (gpu[i] == cpu[i]) continue;
    ++d.differing;
    const double rel =
        std::fabs(double(gpu[i]) - double(cpu[i])) / std::max(1.0, std::fabs(double(cpu[i])));
    d.max_rel =
        std::isnan(rel) ? std::numeric_limits<double>::infinity() : std::max(d.max_rel, rel);
  }
  return d;
}

// The float arrays of Optimizer::save_state's bytes (step count, segment count, then per
// segment its count, its slot count and the slots).
std::vector<float> state_floats(const std::string& bytes) {
  auto u64 = [&](std::size_t at) {
    std::uint64_t v = 0;
    REQUIRE(at + 8 <= bytes.size());
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  };
  std::vector<float> out;
  std::size_t at = 16;
  for (std::uint64_t k = 0, segments = u64(8); k < segments; ++k) {
    const std::uint64_t n = u64(at) * u64(at + 8);
    at += 16;
    REQUIRE(at + n * sizeof(float) <= bytes.size());
    const std::size_t first = out.size();
    out.resize(first + n);
    std::memcpy(out.data() + first, bytes.data() + at, n * sizeof(float));
    at += n * sizeof(float);
  }
  REQUIRE(at == bytes.size());
  return out;
}

// Two segments of odd sizes (more than one block, not a multiple of it) in two param groups,
// stepped `steps` times on the GPU and on the CPU with the same gradients; the parameters and
// the saved state must agree.
void run_against_cpu(Optimizer& gpu_opt, Optimizer& cpu_opt, int steps) {
  std::mt19937 rng(7);
  const std::vector<std::size_t> sizes = {100003, 517};
  std::vector<std::vector<float>> cpu_values, cpu_grads;
  std::vector<std::unique_ptr<DeviceVector<float>>> gpu_values, gpu_grads;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    cpu_values.push_back(random_floats(sizes[k], rng));
    cpu_grads.emplace_back(sizes[k], 0.0f);
    gpu_values.push_back(std::make_unique<DeviceVector<float>>(cpu_values.back()));
    gpu_grads.push_back(std::make_unique<DeviceVector<float>>(cpu_grads.back()));
  }
  auto segments = [&](bool gpu) {
    std::vector<ParamSegment> out;
    for (std::size_t k = 0; k < sizes.size(); ++k)
      out.push_back({k, gpu ? gpu_values[k]->view() : buffer_of(std::span(cpu_values[k])),
                     gpu ? gpu_grads[k]->view() : buffer_of(std::span(cpu_grads[k]))});
    return out;
  };
  for (int step = 0; step < steps; ++step) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      cpu_grads[k] = random_floats(sizes[k], rng, 0.1f);
      gpu_grads[k]->upload(cpu_grads[k]);
    }
    gpu_opt.step(segments(true));
    cpu_opt.step(segments(false));
  }
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const Diff d = compare(gpu_values[k]->download(), cpu_values[k]);
    INFO("segment " << k << ": " << d.differing << " of " << sizes[k]
                    << " values differ, max relative difference " << d.max_rel);
    CHECK(d.max_rel <= 1e-6);
  }
  CHECK(gpu_opt.state_bytes() == cpu_opt.state_bytes());
  // The state, read back from GPU memory by save_state, against the CPU's.
  const std::string gpu_state = gpu_opt.save_state(), cpu_state = cpu_opt.save_state();
  REQUIRE(gpu_state.size() == cpu_state.size());
  const Diff state = compare(state_floats(gpu_state), state_floats(cpu_state));
  INFO("state: " << state.differing << " values differ, max relative difference " << state.max_rel);
  CHECK(state.max_rel <= 1e-6);

  // A state loaded into a fresh optimizer goes to the GPU at its next step and continues as
  // the CPU's does.
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    cpu_grads[k] = random_floats(sizes[k], rng, 0.1f);
    gpu_grads[k]->upload(cpu_grads[k]);
  }
  gpu_opt.load_state(gpu_state);
  gpu_opt.step(segments(true));
  cpu_opt.step(segments(false));
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const Diff d = compare(gpu_values[k]->download(), cpu_values[k]);
    INFO("after load_state, segment " << k << ": max relative difference " << d.max_rel);
    CHECK(d.max_rel <= 1e-6);
  }
}
#endif

}  // namespace

TEST_CASE("SGD on GPU segments matches the CPU SGD (momentum, dampening, Nesterov, decay)") {
  if (no_gpu()) return;
#if ACCEL_TEST_HAVE_CUDA_KERNELS
  const std::vector<std::pair<std::string, SgdOptions>> variants = {
      {"plain", {.lr = 0.1}},
      {"weight decay", {.lr = 0.05, .weight_decay = 0.01}},
      {"momentum", {.lr = 0.05, .momentum = 0.9}},
      {"momentum + dampening + decay",
       {.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 1e-3}},
      {"nesterov", {.lr = 0.05, .momentum = 0.8, .weight_decay = 1e-4, .nesterov = true}},
  };
  for (const auto& [name, options] : variants) {
    CAPTURE(name);
    // Group 1 (the small segment) with other hyperparameters, as a bias group would be.
    SgdOptions second = options;
    second.lr *= 0.5;
    Sgd gpu({options, second}), cpu({options, second});
    run_against_cpu(gpu, cpu, 4);
  }
#endif
}

TEST_CASE("AdamW and Adam (L2) on GPU segments match the CPU optimizer") {
  if (no_gpu()) return;
#if ACCEL_TEST_HAVE_CUDA_KERNELS
  for (const bool decoupled : {true, false}) {
    CAPTURE(decoupled);
    const AdamWOptions options{
        .lr = 1e-2, .weight_decay = 0.05, .decoupled_weight_decay = decoupled};
    AdamWOptions second = options;
    second.weight_decay = 0;
    AdamW gpu({options, second}), cpu({options, second});
    run_against_cpu(gpu, cpu, 5);
  }
#endif
}

TEST_CASE("unscale_gradients on GPU buffers: the CPU's results, an inf or a NaN found") {
  if (no_gpu()) return;
#if ACCEL_TEST_HAVE_CUDA_KERNELS
  std::mt19937 rng(3);
  std::vector<float> f = random_floats(70001, rng, 1000.0f);
  std::vector<double> d(333);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = double(f[i]) * 3.0;
  std::vector<Half> h(4097);
  std::vector<BFloat16> b(4097);
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = to_half(f[i]);
    b[i] = to_bf16(f[i]);
  }
  DeviceVector<float> gf(f);
  DeviceVector<double> gd(d);
  DeviceVector<Half> gh(h);
  DeviceVector<BFloat16> gb(b);
  const std::vector<Buffer> gpu = {gf.view(), gd.view(), gh.view(), gb.view()};
  const std::vector<Buffer> cpu = {buffer_of(std::span(f)), buffer_of(std::span(d)),
                                   buffer_of(std::span(h)), buffer_of(std::span(b))};
  const double scale = 65536.0 / 3.0;  // not a power of two: rounding shows
  CHECK(unscale_gradients(gpu, scale));
  CHECK(unscale_gradients(cpu, scale));
  auto same_bits = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  CHECK(same_bits(gf.download(), f));
  CHECK(same_bits(gd.download(), d));
  CHECK(same_bits(gh.download(), h));
  CHECK(same_bits(gb.download(), b));

  // An inf in the f32 buffer and a NaN in the f16 one: found, and those two are left as they
  // are while the others are unscaled, as on the CPU.
  f[12345] = std::numeric_limits<float>::infinity();
  h[17] = to_half(std::nanf(""));
  gf.upload(f);
  gh.upload(h);
  CHECK_FALSE(unscale_gradients(gpu, 4.0));
  CHECK_FALSE(unscale_gradients(cpu, 4.0));
  CHECK(same_bits(gf.download(), f));
  CHECK(same_bits(gd.download(), d));
  CHECK(same_bits(gh.download(), h));
  CHECK(same_bits(gb.download(), b));
  CHECK(std::isinf(gf.download()[12345]));

  // Only the NaN left: still not finite.
  f[12345] = 1.0f;
  gf.upload(f);
  CHECK_FALSE(unscale_gradients(gpu, 4.0));

  fill_zero(gh.view());
  for (Half v : gh.download()) REQUIRE(v.bits == 0);
#endif
}

TEST_CASE("the sum of squares and the clipping multiply on GPU buffers match the CPU") {
  if (no_gpu()) return;
#if ACCEL_TEST_HAVE_CUDA_KERNELS
  std::mt19937 rng(5);
  for (const std::size_t n : {std::size_t(1), std::size_t(255), std::size_t(1000003)}) {
    CAPTURE(n);
    std::vector<float> f = random_floats(n, rng);
    std::vector<BFloat16> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = to_bf16(f[i]);
    DeviceVector<float> gf(f);
    DeviceVector<BFloat16> gb(b);
    double gpu_sum = 0.5, cpu_sum = 0.5;  // adds to what is there, as clip_grad_norm sums segments
    add_sum_of_squares(gf.view(), gpu_sum);
    add_sum_of_squares(gb.view(), gpu_sum);
    add_sum_of_squares(buffer_of(std::span(f)), cpu_sum);
    add_sum_of_squares(buffer_of(std::span(b)), cpu_sum);
    CHECK(std::fabs(gpu_sum - cpu_sum) <= 1e-10 * cpu_sum);
    // The same bits every run: a fixed reduction order.
    double again = 0.5;
    add_sum_of_squares(gf.view(), again);
    add_sum_of_squares(gb.view(), again);
    CHECK(again == gpu_sum);

    const double coef = 0.3712;
    scale_in_place(gf.view(), coef);
    scale_in_place(gb.view(), coef);
    scale_in_place(buffer_of(std::span(f)), coef);
    scale_in_place(buffer_of(std::span(b)), coef);
    CHECK(gf.download() == f);
    const auto back = gb.download();
    CHECK(std::memcmp(back.data(), b.data(), n * sizeof(BFloat16)) == 0);
  }
#endif
}

TEST_CASE("DataParallel's gradient sum on GPU buffers matches the CPU bit for bit") {
  if (no_gpu()) return;
#if ACCEL_TEST_HAVE_CUDA_KERNELS
  // Plain sums add one source at a time in the dtype; weighted sums accumulate in double and
  // round once, on both sides (no fused multiply-add in the kernel): so bitwise.
  std::mt19937 rng(11);
  const std::size_t n = 300007;
  const std::vector<double> weights = {0.4, 0.35, 0.25}, ones = {1.0, 1.0, 1.0};
  auto run = [&](auto element, const std::vector<double>& w, double divide_by) {
    using T = decltype(element);
    std::vector<std::vector<T>> host(3);
    for (auto& h : host) {
      const std::vector<float> f = random_floats(n, rng);
      h.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<T, BFloat16>)
          h[i] = to_bf16(f[i]);
        else
          h[i] = T(f[i]);
      }
    }
    std::vector<std::unique_ptr<DeviceVector<T>>> gpu;
    for (const auto& h : host) gpu.push_back(std::make_unique<DeviceVector<T>>(h));
    const Buffer gpu_sources[] = {gpu[1]->view(), gpu[2]->view()};
    const Buffer cpu_sources[] = {buffer_of(std::span(host[1])), buffer_of(std::span(host[2]))};
    weighted_sum(gpu[0]->view(), gpu_sources, w, divide_by);
    weighted_sum(buffer_of(std::span(host[0])), cpu_sources, w, divide_by);
    const std::vector<T> back = gpu[0]->download();
    CHECK(std::memcmp(back.data(), host[0].data(), n * sizeof(T)) == 0);
  };
  SUBCASE("weighted f32") { run(float{}, weights, 1.0); }
  SUBCASE("weighted f32, divided (folding mid-accumulation)") { run(float{}, weights, 0.4); }
  SUBCASE("weighted f64") { run(double{}, weights, 1.0); }
  SUBCASE("plain f32") { run(float{}, ones, 1.0); }
  SUBCASE("plain f64") { run(double{}, ones, 1.0); }
  SUBCASE("plain bf16") { run(BFloat16{}, ones, 1.0); }
#endif
}

#if !ACCEL_TEST_HAVE_CUDA_KERNELS
// A build without the kernels (ACCEL_WITH_CUDA=OFF, with or without NCCL): a CUDA buffer is
// refused before anything is allocated or touched, naming the operation (the buffers are
// marked CUDA and never dereferenced).
TEST_CASE("without the CUDA kernels, CUDA buffers are refused naming the operation") {
  CHECK_FALSE(cuda_kernels_built());
  float values[4] = {}, grads[4] = {};
  const Buffer v{values, 4, DType::f32, DeviceKind::cuda},
      g{grads, 4, DType::f32, DeviceKind::cuda};
  Sgd sgd(SgdOptions{.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_WITH_AS(sgd.step({ParamSegment{0, v, g, 0}}),
                       doctest::Contains("SGD: segment 0 is in CUDA memory, and this build"),
                       InvalidArgument);
  CHECK(sgd.state_bytes() == 0);
  double sum = 0;
  CHECK_THROWS_WITH_AS(add_sum_of_squares(g, sum), doctest::Contains("clip_grad_norm"),
                       InvalidArgument);
  const Buffer grads_list[] = {g};
  CHECK_THROWS_WITH_AS(unscale_gradients(grads_list, 2.0), doctest::Contains("fp16 loss scaling"),
                       InvalidArgument);
}
#endif
