// DataParallel (distributed_type DATA_PARALLEL: K replicas on threads of one process) against
// one replica on the full batch: the hand-written MLP through the raw API (SGD with momentum,
// AdamW, gradient accumulation, clipping, a batch K does not divide) and, with LibTorch, the
// Fashion-MNIST CNN through the adapter's prepared-model call. Every parameter must match
// within a bound derived in tests/support/tolerance.hpp. Then the real path: `accel launch`
// with DATA_PARALLEL running raw_mlp, and bad settings refused with the key named.

#ifdef ACCEL_TEST_WITH_TORCH
#include <torch/torch.h>
#undef CHECK
#include "accelerate/torch/torch_accelerator.hpp"
#include "examples/fashion_mnist/fashion_mnist.hpp"
#endif
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <regex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "backends/dataparallel/data_parallel_strategy.hpp"
#include "backends/optim/adamw.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/common/image_batches.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "tests/support/mlp_magnitude.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/staging.hpp"
#include "tests/support/tolerance.hpp"

using namespace accel;
using namespace accel::test;

namespace {

const std::string kData = "/usr/share/datasets/fashion-mnist";

bool have_data() { return std::filesystem::exists(kData + "/train-images-idx3-ubyte.gz"); }

AcceleratorOptions options_for(int replicas, int accumulation) {
  AcceleratorOptions o;
  o.communicator = "local";
  o.gradient_accumulation_steps = accumulation;
  o.distributed_type = replicas > 0 ? "DATA_PARALLEL" : "NO";
  if (replicas > 0) o.data_parallel_replicas = replicas;
  return o;
}

// ---- the raw MLP

const examples::FloatImages& fashion_rows() {
  static const examples::FloatImages rows =
      examples::to_floats(examples::load_mnist_split(kData, "train", 2048));
  return rows;
}

struct MlpRun {
  bool adamw = false;
  int accumulation = 1;
  double clip = 0;
  std::size_t batch = 64;
  std::size_t odd_batch = 0;  // rows of every second micro-batch (0: batch)
  int steps = 20;             // optimizer steps
};

// Trains with `replicas` DataParallel replicas (0: distributed_type NO, one replica) and
// returns every parameter value (and checks the replicas ended equal to replica 0). With
// `magnitude`, also measures the gradients' magnitudes (tests/support/mlp_magnitude.hpp).
std::vector<float> train_mlp(int replicas, const MlpRun& run,
                             GradientMagnitude* magnitude = nullptr) {
  const examples::FloatImages& data = fashion_rows();
  Accelerator acc(options_for(replicas, run.accumulation));
  CHECK(acc.data_parallel_replicas() == std::max(1, replicas));
  raw_mlp::Mlp model({int(data.features), 48, 10}, 5);
  Sgd sgd(SgdOptions{.lr = 0.05f, .momentum = 0.9f});
  AdamW adamw(AdamWOptions{.lr = 2e-3});
  Optimizer& optimizer = run.adamw ? static_cast<Optimizer&>(adamw) : sgd;
  acc.prepare(
      model, [](raw_mlp::Mlp& m) { return raw_mlp::param_refs(m); }, optimizer);
  const std::size_t micro_batches = std::size_t(run.steps * run.accumulation);
  std::size_t next = 0;
  std::vector<double> step_magnitudes;
  for (std::size_t b = 0; b < micro_batches; ++b) {
    const std::size_t rows = b % 2 == 1 && run.odd_batch > 0 ? run.odd_batch : run.batch;
    const std::size_t first = next;
    next = (next + rows) % (data.labels.size() - 2 * run.batch);
    if (magnitude)
      add_magnitudes(
          step_magnitudes,
          gradient_magnitudes(
              model,
              std::span<const float>(data.x).subspan(first * data.features, rows * data.features),
              std::span<const int>(data.labels).subspan(first, rows), acc.loss_scale()));
    acc.forward_backward(
        model, rows, [&](raw_mlp::Mlp& m, std::size_t from, std::size_t n, auto ready) {
          return m.forward_backward(std::span<const float>(data.x).subspan(
                                        (first + from) * data.features, n * data.features),
                                    std::span<const int>(data.labels).subspan(first + from, n),
                                    acc.loss_scale(), [&](std::size_t l) {
                                      ready(2 * l);
                                      ready(2 * l + 1);
                                    });
        });
    if (acc.sync_gradients()) {
      if (magnitude) {
        fold_step(*magnitude, std::exchange(step_magnitudes, {}));
        if (run.clip > 0) fold_clip_share(*magnitude, model, run.clip);
      }
      if (run.clip > 0) acc.clip_grad_norm(run.clip);
      acc.optimizer_step();
      model.zero_grad();
    }
  }
  CHECK(acc.step() == std::uint64_t(run.steps));
  std::vector<float> out;
  for (const auto& l : model.layers()) {
    out.insert(out.end(), l.weight.begin(), l.weight.end());
    out.insert(out.end(), l.bias.begin(), l.bias.end());
  }
  if (auto* dp = dynamic_cast<DataParallelStrategy*>(
          &acc.strategy())) {  // replicas hold replica 0's values
    for (int k = 1; k < dp->count(); ++k)
      for (std::size_t i = 0; i < dp->params().size(); ++i) {
        const Buffer a = dp->params()[i].data, b = dp->replica_params(k)[i].data;
        CHECK(std::equal(static_cast<float*>(a.data), static_cast<float*>(a.data) + a.count,
                         static_cast<float*>(b.data)));
      }
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::abs(a[i] - b[i])));
  return d;
}

void expect_mlp_equivalence(const MlpRun& run, const std::string& what) {
  GradientMagnitude measured;
  const std::vector<float> one = train_mlp(0, run, &measured);
  // Each replica sums its chunk's rows, the replicas' sums are added with weights rows_k /
  // rows (two more roundings per term), over the micro-batches of a step. The raw loops are
  // compiled without -march and use no LibTorch: the same bits on every x86-64 CPU, so the
  // measured magnitudes hold everywhere.
  const std::size_t longest_sum =
      std::size_t(run.accumulation) * (std::max(run.batch, run.odd_batch) + 4) + 2;
  const double magnitude = run.clip > 0 ? clipped_magnitude({.max_magnitude = measured.max,
                                                             .norm_magnitude = measured.norm,
                                                             .share = measured.share,
                                                             .clip = run.clip,
                                                             .elements = one.size(),
                                                             .longest_sum = longest_sum,
                                                             .unit_roundoff = kUnitRoundoffF32})
                                        : measured.max;
  // AdamW: no fp32 bound exists (tolerance.hpp), and the raw MLP has no fp64 variant, so its
  // limit is empirical: 2.2e-6 measured at 4 replicas.
  const double limit = run.adamw ? 1e-5
                                 : reordering_bound({.lr = 0.05,
                                                     .momentum = 0.9,
                                                     .steps = run.steps,
                                                     .longest_sum = longest_sum,
                                                     .magnitude = magnitude,
                                                     .unit_roundoff = kUnitRoundoffF32});
  const std::vector<float> initial = [&] {
    raw_mlp::Mlp m({int(fashion_rows().features), 48, 10}, 5);
    std::vector<float> v;
    for (const auto& l : m.layers()) {
      v.insert(v.end(), l.weight.begin(), l.weight.end());
      v.insert(v.end(), l.bias.begin(), l.bias.end());
    }
    return v;
  }();
  CHECK(max_abs_diff(one, initial) > 1e-3);  // it trained
  for (int k : {2, 4}) {
    const double diff = max_abs_diff(train_mlp(k, run), one);
    MESSAGE(what << ", " << k << " replicas: max |diff| " << diff << " (limit " << limit
                 << std::string(run.adamw ? ", empirical" : "") << "; S max " << measured.max
                 << ", 2-norm " << measured.norm << ", clip share " << measured.share << ")");
    CHECK(diff <= limit);
  }
}

}  // namespace

TEST_CASE("chunk_rows splits rows as torch.chunk does") {
  auto counts = [](std::size_t rows, int k) {
    std::vector<std::size_t> c;
    std::size_t next = 0;
    for (const Shard& s : chunk_rows(rows, k)) {
      CHECK(s.offset == std::min(next, rows));
      next = s.offset + s.count;
      c.push_back(s.count);
    }
    CHECK(next == rows);
    return c;
  };
  CHECK(counts(10, 4) == std::vector<std::size_t>{3, 3, 3, 1});
  CHECK(counts(6, 4) == std::vector<std::size_t>{2, 2, 2, 0});
  CHECK(counts(2, 4) == std::vector<std::size_t>{1, 1, 0, 0});
  CHECK(counts(64, 2) == std::vector<std::size_t>{32, 32});
}

TEST_CASE("ReplicaPool runs every replica on its own thread and names the one that failed") {
  ReplicaPool pool(3);
  std::vector<std::thread::id> ids(3);
  pool.run([&](int k) { ids[std::size_t(k)] = std::this_thread::get_id(); });
  CHECK(ids[0] != ids[1]);
  CHECK(ids[1] != ids[2]);
  CHECK(ids[0] != std::this_thread::get_id());
  std::atomic<int> ran{0};
  try {
    pool.run([&](int k) {
      ++ran;
      if (k == 2) throw std::runtime_error("boom");
    });
    FAIL("no exception");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "replica 2: boom");
  }
  CHECK(ran == 3);
  pool.run([&](int) { ++ran; });  // usable after a failure
  CHECK(ran == 6);
}

TEST_CASE("raw MLP: DataParallel with 2 and 4 replicas equals one replica on the full batch") {
  if (skip_unless(have_data(), "Fashion-MNIST not installed at " + kData)) return;
  SUBCASE("SGD with momentum") { expect_mlp_equivalence({}, "SGD momentum"); }
  SUBCASE("AdamW, clipping") {
    expect_mlp_equivalence({.adamw = true, .clip = 0.5}, "AdamW, clip 0.5");
  }
  SUBCASE("gradient accumulation 2, a batch 4 does not divide (30 rows: 8, 8, 8, 6)") {
    expect_mlp_equivalence({.accumulation = 2, .clip = 1.0, .batch = 30, .steps = 20},
                           "accumulation 2, batch 30, clip 1");
  }
  SUBCASE(
      "accumulating micro-batches of different sizes (30 then 20 rows): replica weights "
      "change mid-accumulation") {
    expect_mlp_equivalence({.accumulation = 2, .batch = 30, .odd_batch = 20, .steps = 20},
                           "accumulation 2, batches 30 and 20");
  }
  SUBCASE("fewer rows than replicas get work (6 rows over 4: 2, 2, 2, 0)") {
    expect_mlp_equivalence({.batch = 6, .steps = 20}, "batch 6");
  }
}

TEST_CASE("raw MLP: prepare(params, ...) under DATA_PARALLEL says to give the model") {
  Accelerator acc(options_for(2, 1));
  raw_mlp::Mlp model({4, 3, 2}, 1);
  Sgd sgd(SgdOptions{.lr = 0.1f});
  try {
    acc.prepare(raw_mlp::param_refs(model), sgd);
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("prepare(model, params_of, optimizer)") != std::string::npos);
  }
}

// ---- the real path: accel launch

namespace {

// "epoch 1/1: loss L, test accuracy A" from raw_mlp's output.
std::string final_line(const std::string& out) {
  const auto at = out.find("epoch 1/1: loss");
  REQUIRE(at != std::string::npos);
  return out.substr(at, out.find(" (", at) - at);
}

}  // namespace

TEST_CASE("accel launch with DATA_PARALLEL runs raw_mlp on 2 replicas with one replica's result") {
  if (skip_unless(have_data(), "Fashion-MNIST not installed at " + kData)) return;
  if (skip_unless(std::filesystem::exists(bin_path("raw_mlp")), "raw_mlp example not built"))
    return;
  const std::vector<std::string> args = {bin_path("raw_mlp"),
                                         "--data_dir",
                                         kData,
                                         "--train_samples",
                                         "1000",
                                         "--test_samples",
                                         "500",
                                         "--epochs",
                                         "1",
                                         "--hidden",
                                         "32",
                                         "--batch_size",
                                         "50"};
  auto launch = [&](std::vector<std::string> head) {
    head.insert(head.begin(), "launch");
    head.insert(head.end(), args.begin(), args.end());
    auto r = run_accel(head, {}, std::chrono::seconds(120));
    INFO(describe(r));
    REQUIRE(r.exit_code() == 0);
    return r.workers.at(0).output;
  };
  const std::string one = launch({"--distributed_type", "NO", "--use_cpu"});
  const std::string two = launch({"--data_parallel", "--data_parallel_replicas", "2"});
  CHECK(two.find("data_parallel_replicas") != std::string::npos);  // the settings summary
  CHECK(two.find("2 replica(s)") != std::string::npos);
  CHECK(one.find("1 replica(s)") != std::string::npos);
  CHECK(final_line(two) == final_line(one));
  MESSAGE(final_line(two));
}

TEST_CASE("bad DATA_PARALLEL settings are refused naming the key") {
  if (skip_unless(std::filesystem::exists(bin_path("raw_mlp")), "raw_mlp example not built"))
    return;
  auto refused = [](const std::vector<std::string>& flags, const std::string& key) {
    std::vector<std::string> argv = {"launch"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back(bin_path("raw_mlp"));
    auto r = run_accel(argv, {}, std::chrono::seconds(60));
    std::string all;
    for (const auto& w : r.workers) all += w.output;
    INFO(all);
    CHECK(r.exit_code() != 0);
    CHECK(all.find(key) != std::string::npos);
  };
  refused({"--data_parallel", "--data_parallel_replicas", "-1"}, "data_parallel_replicas");
  refused({"--data_parallel", "--data_parallel_replicas=x"}, "data_parallel_replicas");
  refused({"--multi_cpu", "--data_parallel_replicas", "2"}, "data_parallel_replicas");
  if (cuda_device_count() == 0) {
    // gpu_ids with DATA_PARALLEL on the CPU (use_cpu detected true without a GPU) ...
    refused({"--data_parallel", "--gpu_ids", "0"}, "gpu_ids");
    // ... and DATA_PARALLEL on GPUs asked for where there is none.
    refused({"--data_parallel", "--use_cpu=false"}, "use_cpu false");
    refused({"--data_parallel", "--use_cpu=false"}, "no CUDA device is visible");
  } else {
    // DataParallel on GPUs with raw_mlp's parameters in host memory.
    refused({"--data_parallel", "--gpu_ids", "0"}, "is not on CUDA device 0");
  }
}

#ifdef ACCEL_TEST_WITH_TORCH
// ---- the Fashion-MNIST CNN through the LibTorch adapter

namespace {

struct CnnRun {
  bool frozen_norm = true;  // BatchNorm and Dropout in eval mode, the rest training
  int steps = 20;
  std::int64_t batch = 64;
  double lr = 0.05, momentum = 0.9;
  at::ScalarType dtype = at::kDouble;  // see tests/support/tolerance.hpp
};

// Trains the CNN with `replicas` replicas (0: distributed_type NO); returns the parameters and
// buffers, and checks every replica holds replica 0's parameters and buffers.
std::vector<at::Tensor> train_cnn(int replicas, const CnnRun& run) {
  static const fashion_mnist::Split data = fashion_mnist::load_split(kData, "train", 2048);
  TorchAccelerator acc(options_for(replicas, 1));
  torch::manual_seed(3);
  fashion_mnist::Net net;
  net->to(run.dtype);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(run.lr).momentum(run.momentum));
  auto [model, opt] = acc.prepare(net, sgd);
  model->train();
  if (run.frozen_norm)  // per-chunk batch statistics and random masks differ by design
    for (const auto& item : model->named_modules())
      if (item.key() == "bn1" || item.key() == "bn2" || item.key() == "dropout")
        item.value()->eval();
  for (int step = 0; step < run.steps; ++step) {
    const std::int64_t first = (step * run.batch) % (data.images.size(0) - run.batch);
    opt.zero_grad();
    const at::Tensor loss = torch::nn::functional::cross_entropy(
        model(data.images.narrow(0, first, run.batch).to(run.dtype)),
        data.labels.narrow(0, first, run.batch));
    acc.backward(loss);
    opt.step();
  }
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  for (const auto& b : model->buffers()) out.push_back(b.detach().clone().to(at::kDouble));
  for (int k = 1; k < acc.data_parallel_replicas(); ++k) {
    auto params = acc.replica_module(k).parameters();
    auto buffers = acc.replica_module(k).buffers();
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(params[i].equal(model->parameters()[i]));
    for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(buffers[i].equal(model->buffers()[i]));
  }
  return out;
}

double max_abs_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
  return d;
}

}  // namespace

TEST_CASE("Fashion-MNIST CNN: DataParallel with 2 and 4 replicas equals one replica") {
  if (skip_unless(have_data(), "Fashion-MNIST not installed at " + kData)) return;
  const CnnRun run;
  // The longest sum is conv1's weight gradient: 64 images x 26 x 26 output positions. Its
  // terms (standardised pixels, |x| <= 2.03, times the back-propagated gradient of the batch
  // mean, max |gradient| below 0.1) sum to well under 100 in magnitude.
  const double limit = reordering_bound({.lr = run.lr,
                                         .momentum = run.momentum,
                                         .steps = run.steps,
                                         .longest_sum = std::size_t(run.batch) * 26 * 26,
                                         .magnitude = 100,
                                         .unit_roundoff = kUnitRoundoffF64});
  const std::vector<at::Tensor> one = train_cnn(0, run);
  for (int k : {2, 4}) {
    const double diff = max_abs_diff(train_cnn(k, run), one);
    MESSAGE("CNN (fp64), SGD momentum, " << k << " replicas: max |diff| " << diff << " (limit "
                                         << limit << ")");
    CHECK(diff <= limit);
  }
}

TEST_CASE(
    "Fashion-MNIST CNN in training mode: replicas follow replica 0's parameters and buffers") {
  if (skip_unless(have_data(), "Fashion-MNIST not installed at " + kData)) return;
  // Per-chunk BatchNorm statistics and dropout: not the single replica's numbers, but every
  // replica must end with replica 0's parameters and buffers (checked inside train_cnn).
  const std::vector<at::Tensor> trained =
      train_cnn(2, {.frozen_norm = false, .steps = 5, .dtype = at::kFloat});
  CHECK(!trained.empty());
}

TEST_CASE("accel launch with DATA_PARALLEL runs examples/fashion_mnist end to end") {
  if (skip_unless(have_data(), "Fashion-MNIST not installed at " + kData)) return;
  if (skip_unless(std::filesystem::exists(bin_path("fashion_mnist")), "fashion_mnist not built"))
    return;
  auto r = run_accel(
      {"launch", "--data_parallel", "--data_parallel_replicas", "2", bin_path("fashion_mnist"),
       "--data_dir", kData, "--train_samples", "1000", "--test_samples", "500", "--epochs", "1"},
      {}, std::chrono::seconds(240));
  INFO(describe(r));
  REQUIRE(r.exit_code() == 0);
  const std::string& out = r.workers.at(0).output;
  static const std::regex epoch(R"(epoch 1: loss \d+\.\d+, test accuracy (\d\.\d+))");
  std::smatch m;
  REQUIRE(std::regex_search(out, m, epoch));
  CHECK(std::stod(m[1]) > 0.3);  // it learned something in one short epoch (10 classes)
  CHECK(out.find("warning: DATA_PARALLEL") == std::string::npos);  // it called model(x)
}

TEST_CASE("DataParallel workers get cores / K intra-op threads, the caller keeps its own") {
  const int before = at::get_num_threads();
  TorchAccelerator acc(options_for(2, 1));
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, opt] = acc.prepare(net, sgd);
  std::vector<int> inside(2, 0);
  acc.strategy().replicas()->run([&](int k) { inside[std::size_t(k)] = at::get_num_threads(); });
  CHECK(inside[0] == std::max(1, before / 2));
  CHECK(inside[1] == std::max(1, before / 2));
  CHECK(at::get_num_threads() == before);
  int fresh = 0;  // a thread started later gets LibTorch's default, not the workers' share
  std::thread([&] { fresh = at::get_num_threads(); }).join();
  CHECK(fresh == before);
  // The loop that calls model->forward instead of model(x) still trains (replica 0 alone).
  const at::Tensor x = torch::randn({8, 6});
  opt.zero_grad();
  acc.backward(model->forward(x).sum());
  CHECK(model->parameters()[0].grad().abs().sum().item<double>() > 0);
}
#endif
