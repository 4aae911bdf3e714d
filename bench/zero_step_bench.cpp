// zero_step_bench: one training step of the raw MLP (about 24M parameters: 784-4096-4096-
// 1024-10) with AdamW through the Accelerator, under whatever strategy the config picks, so
// DDP and ZeRO are compared by running it twice:
//
//   accel launch --multi_cpu --num_processes 2 build/bin/zero_step_bench
//   accel launch --use_zero --zero_stage 2 --num_processes 2 build/bin/zero_step_bench
//   accel launch --use_zero --zero_stage 3 --num_processes 2 build/bin/zero_step_bench
//
// Each layer is a ZeRO-3 unit, gathered around its forward and its backward through
// acc.gather_parameters (which does nothing under the other strategies).
//
// Rank 0 prints the median step time (forward, backward, reduce, clip, optimizer step,
// all-gather), and every rank its peak resident memory (getrusage), the strategy's gradient
// bytes, the optimizer state bytes and the bytes moved per step. Reported, not asserted.
//   zero_step_bench [--steps N] [--batch_size N]

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "accelerate/accelerator.hpp"
#include "backends/optim/adamw.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/unit_scopes.hpp"

int main(int argc, char** argv) {
  int steps = 6;
  std::size_t batch = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--steps")
      steps = std::stoi(argv[i + 1]);
    else if (flag == "--batch_size")
      batch = std::stoul(argv[i + 1]);
  }
  try {
    accel::Accelerator acc;
    raw_mlp::Mlp model({784, 4096, 4096, 1024, 10}, 1);
    std::vector<accel::ParamRef> params;
    std::size_t total = 0;
    for (std::size_t l = 0; l < model.layers().size(); ++l) {
      auto& L = model.layers()[l];
      params.push_back({"weight",
                        accel::buffer_of(std::span(L.weight)),
                        accel::buffer_of(std::span(L.weight_grad)),
                        0,
                        {},
                        l});
      params.push_back({"bias",
                        accel::buffer_of(std::span(L.bias)),
                        accel::buffer_of(std::span(L.bias_grad)),
                        0,
                        {},
                        l});
      total += L.weight.size() + L.bias.size();
    }
    accel::AdamW optimizer(accel::AdamWOptions{});
    acc.prepare(params, optimizer);

    std::mt19937 rng(acc.process_index());
    std::normal_distribution<float> g;
    std::vector<float> x(batch * 784);
    std::vector<int> labels(batch);
    raw_mlp::UnitScopes units(acc, model.layers().size());
    std::vector<double> times;
    std::uint64_t bytes = 0;
    for (int step = 0; step < steps; ++step) {
      for (float& v : x) v = g(rng);
      for (int& l : labels) l = int(rng() % 10);
      acc.wait_for_everyone();
      const std::uint64_t before = acc.comm().bus_bytes();
      const auto t0 = std::chrono::steady_clock::now();
      model.forward_backward(
          x, labels, acc.loss_scale(),
          [&](std::size_t l) {
            acc.grad_ready(2 * l);
            acc.grad_ready(2 * l + 1);
          },
          units.scopes());
      if (acc.sync_gradients()) {
        acc.clip_grad_norm(1.0);
        acc.optimizer_step();
        model.zero_grad();
      }
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      bytes = acc.comm().bus_bytes() - before;
    }
    // The first step allocates the optimizer state: the median leaves it out.
    std::sort(times.begin(), times.end());
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    acc.print(
        "%s, %zu parameters, %d processes, batch %zu per rank: median step %.3f s over %d steps\n",
        std::string(acc.strategy().name()).c_str(), total, acc.num_processes(), batch,
        times[times.size() / 2], steps);
    acc.wait_for_everyone();
    std::printf(
        "rank %d: %s peak RSS %.1f MiB, gradient bytes %.1f MiB, optimizer state %.1f MiB, "
        "bus bytes per step %.1f MiB\n",
        acc.process_index(), std::string(acc.strategy().name()).c_str(),
        double(usage.ru_maxrss) / 1024.0, double(acc.strategy().gradient_bytes()) / double(1 << 20),
        double(optimizer.state_bytes()) / double(1 << 20), double(bytes) / double(1 << 20));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_step_bench: %s\n", e.what());
    return 1;
  }
}
