// DataParallel step time: one training step (forward, backward, reduction, optimizer step,
// copy to the replicas) of the Fashion-MNIST CNN (LibTorch adapter, SGD momentum) and of the
// hand-written MLP (raw API, built-in SGD), global batch 128, with K = 1, 2, 4 replicas on
// threads of this process, against one replica with all cores (distributed_type NO). Median
// ms/step over --steps steps after --warmup, printed as a table. No thresholds: timings
// depend on the machine and on what else runs on it. "All cores" is LibTorch's intra-op thread
// count set to the machine's hardware threads (LibTorch's own default may count only physical
// cores), so the baseline is not handicapped against K threads. Run it with the launcher's
// malloc settings (GLIBC_TUNABLES as `accel launch` prints them), as a launched job runs:
// otherwise page faults on LibTorch's per-step temporaries dominate the one-replica row.
//
//   build/bin/data_parallel_bench [--steps 20] [--warmup 3] [--replicas 1,2,4] [--hidden 256]

#include <torch/torch.h>
#undef CHECK

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "accelerate/torch/torch_accelerator.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/fashion_mnist/fashion_mnist.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"

namespace {

struct Flags {
  int steps = 20, warmup = 3, hidden = 256;
  std::int64_t batch = 128;
  std::vector<int> replicas = {1, 2, 4};
};

accel::AcceleratorOptions options_for(int replicas) {
  accel::AcceleratorOptions o;
  o.communicator = "local";
  o.distributed_type = replicas > 0 ? "DATA_PARALLEL" : "NO";
  if (replicas > 0) o.data_parallel_replicas = replicas;
  return o;
}

template <typename Step>
double median_ms(const Flags& f, Step&& step) {
  for (int i = 0; i < f.warmup; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < f.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + std::ptrdiff_t(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

double cnn_step_ms(const Flags& f, int replicas) {
  // One replica gets every hardware thread; DataParallel splits the caller's count itself.
  const int caller_threads = at::get_num_threads();
  if (replicas == 0) at::set_num_threads(int(std::max(1u, std::thread::hardware_concurrency())));
  struct Restore {
    int n;
    ~Restore() { at::set_num_threads(n); }
  } restore{caller_threads};
  accel::TorchAccelerator acc(options_for(replicas));
  torch::manual_seed(1);
  fashion_mnist::Net net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  model->train();
  const at::Tensor x = torch::randn({f.batch, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {f.batch});
  return median_ms(f, [&] {
    opt.zero_grad();
    acc.backward(torch::nn::functional::cross_entropy(model(x), y));
    opt.step();
  });
}

double mlp_step_ms(const Flags& f, int replicas) {
  accel::Accelerator acc(options_for(replicas));
  raw_mlp::Mlp model({784, f.hidden, 10}, 1);
  accel::Sgd sgd(accel::SgdOptions{.lr = 0.01f, .momentum = 0.9f});
  acc.prepare(
      model, [](raw_mlp::Mlp& m) { return raw_mlp::param_refs(m); }, sgd);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(std::size_t(f.batch) * 784);
  for (float& v : x) v = normal(rng);
  std::vector<int> labels(std::size_t(f.batch));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = int(i % 10);
  return median_ms(f, [&] {
    acc.forward_backward(
        model, labels.size(), [&](raw_mlp::Mlp& m, std::size_t first, std::size_t n, auto ready) {
          return m.forward_backward(std::span<const float>(x).subspan(first * 784, n * 784),
                                    std::span<const int>(labels).subspan(first, n),
                                    acc.loss_scale(), [&](std::size_t l) {
                                      ready(2 * l);
                                      ready(2 * l + 1);
                                    });
        });
    if (acc.sync_gradients()) {
      acc.optimizer_step();
      model.zero_grad();
    }
  });
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--steps")
      f.steps = std::stoi(value);
    else if (key == "--warmup")
      f.warmup = std::stoi(value);
    else if (key == "--hidden")
      f.hidden = std::stoi(value);
    else if (key == "--batch")
      f.batch = std::stoll(value);
    else if (key == "--replicas") {
      f.replicas.clear();
      std::stringstream ss(value);
      for (std::string item; std::getline(ss, item, ',');) f.replicas.push_back(std::stoi(item));
    } else {
      std::fprintf(stderr, "data_parallel_bench: unknown flag %s\n", key.c_str());
      std::exit(2);
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "data_parallel_bench: %s needs a value\n", argv[argc - 1]);
    std::exit(2);
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  try {
    std::printf(
        "data_parallel_bench: global batch %lld, median of %d steps; one replica: %u "
        "intra-op threads (the CNN; the raw MLP is single-threaded)\n",
        static_cast<long long>(f.batch), f.steps,
        std::max(1u, std::thread::hardware_concurrency()));
    std::printf("%-22s %-22s %12s %10s\n", "model", "setup", "ms/step", "speedup");
    // The DataParallel rows first: once the caller has run with every hardware thread, its
    // OpenMP team stays around (spinning between regions) and would slow the replicas' workers.
    // One discarded run first: the process's first steps pay for LibTorch's first allocations
    // and page faults, which would otherwise land on whichever row comes first.
    (void)cnn_step_ms(f, f.replicas.front());
    std::vector<double> cnn_ms;
    for (int k : f.replicas) cnn_ms.push_back(cnn_step_ms(f, k));
    const double cnn_one = cnn_step_ms(f, 0);
    std::printf("%-22s %-22s %12.2f %10s\n", "fashion_mnist CNN", "one replica (NO)", cnn_one,
                "1.00");
    for (std::size_t i = 0; i < f.replicas.size(); ++i)
      std::printf("%-22s %-22s %12.2f %10.2f\n", "fashion_mnist CNN",
                  ("DATA_PARALLEL K=" + std::to_string(f.replicas[i])).c_str(), cnn_ms[i],
                  cnn_one / cnn_ms[i]);
    const std::string mlp = "raw MLP 784-" + std::to_string(f.hidden) + "-10";
    const double mlp_one = mlp_step_ms(f, 0);
    std::printf("%-22s %-22s %12.2f %10s\n", mlp.c_str(), "one replica (NO)", mlp_one, "1.00");
    for (int k : f.replicas) {
      const double ms = mlp_step_ms(f, k);
      std::printf("%-22s %-22s %12.2f %10.2f\n", mlp.c_str(),
                  ("DATA_PARALLEL K=" + std::to_string(k)).c_str(), ms, mlp_one / ms);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_parallel_bench: %s\n", e.what());
    return 1;
  }
}
