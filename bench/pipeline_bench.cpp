// pipeline_bench: a LibTorch MLP's training step under TorchPipeline, against one process's
// step on the same global batch (bench/run_pipeline_bench.sh runs the table). Each rank runs
// one thread, as one process of the reference does.
//
//   pipeline_bench --reference --microbatches M                   one process, the whole model
//   accel launch --num_processes P pipeline_bench --microbatches M [--schedule S] [--chunks V]
//                [--ideal_ms T]
//   shape: [--width 512] [--layers 8] [--rows 16] (per micro-batch) [--steps 12]
//
// Rank 0 prints one table row:
//   | P | schedule | M | median step | / ideal | idle measured | idle model | idle formula |
// median step: over the steps after the first two; / ideal: that over --ideal_ms (one
// process's step / P, from the reference run); idle measured: 1 - compute / wall, the stages'
// mean (the bubble plus messages, the optimizer's step and the loss's all-reduce); idle model:
// the schedule played by schedule_simulation.hpp with this run's measured mean time per
// action kind (what the order alone costs); idle formula: (P-1)/(V M+P-1) for GPIPE, 1F1B and
// INTERLEAVED_1F1B with equal stages.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/pipeline/schedule_simulation.hpp"
#include "accelerate/torch/pipeline/torch_pipeline.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

torch::nn::Sequential make_model(std::int64_t width, int layers) {
  torch::manual_seed(3);
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  return model;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  try {
    const test::WorkerFlags flags(argc, argv);
    flags.only({"reference", "microbatches", "schedule", "chunks", "ideal_ms", "width", "layers",
                "rows", "steps"});
    const std::int64_t width = flags.integer("width", 512), rows = flags.integer("rows", 16);
    const int layers = int(flags.integer("layers", 8)), steps = int(flags.integer("steps", 12));
    const int m = int(flags.integer("microbatches", 8));
    constexpr int kWarmup = 2;
    const auto loss_fn = [](const at::Tensor& out, const at::Tensor& y) {
      return torch::mse_loss(out, y);
    };
    torch::nn::Sequential model = make_model(width, layers);
    torch::optim::SGD sgd(model->parameters(), 0.01);

    if (flags.has("reference")) {
      // One process: the M micro-batches accumulated, then the step.
      std::vector<double> times;
      for (int step = 0; step < steps; ++step) {
        const at::Tensor x = torch::randn({m * rows, width}), y = torch::randn({m * rows, width});
        const auto start = std::chrono::steady_clock::now();
        for (int mb = 0; mb < m; ++mb) {
          const at::Tensor l =
              loss_fn(model->forward(x.narrow(0, mb * rows, rows)), y.narrow(0, mb * rows, rows));
          (l / double(m)).backward();
        }
        sgd.step();
        sgd.zero_grad();
        if (step >= kWarmup) times.push_back(seconds_since(start));
      }
      std::printf("| 1 | reference | %d | %.2f ms | | | | |\n", m, 1e3 * median(times));
      return 0;
    }

    TorchAccelerator acc;
    pipeline::PipelineOptions options{
        .pipeline_parallel_size = acc.num_processes(),
        .num_microbatches = m,
        .pipeline_schedule = pipeline::parse_schedule(flags.text("schedule", "1F1B")),
        .pipeline_chunks = int(flags.integer("chunks", 1)),
        .partition_method = pipeline::PartitionMethod::uniform};
    TorchPipeline pipe(acc, model, sgd, options);
    const int p = pipe.num_stages(), v = options.pipeline_chunks;

    std::vector<double> walls;
    double compute = 0, wall = 0;
    std::array<double, pipeline::kActionKinds> by_kind{};
    for (int step = 0; step < steps; ++step) {
      const at::Tensor x = torch::randn({m * rows, width}), y = torch::randn({m * rows, width});
      pipe.step(x, y, loss_fn);
      if (step < kWarmup) continue;
      const auto& t = pipe.last_step_timing();
      walls.push_back(t.wall_seconds);
      compute += t.compute_seconds;
      wall += t.wall_seconds;
      for (std::size_t k = 0; k < by_kind.size(); ++k) by_kind[k] += t.seconds_by_kind[k];
    }
    // The stages' idle shares and mean action times, over the world (P ranks: one pipeline).
    std::vector<double> sums(1 + by_kind.size());
    sums[0] = 1 - compute / wall;
    std::copy(by_kind.begin(), by_kind.end(), sums.begin() + 1);
    acc.comm().all_reduce(buffer_of(std::span(sums)), ReduceOp::sum)->wait();
    double step_ms = 1e3 * median(walls);
    acc.comm().all_reduce(buffer_of(std::span(&step_ms, 1)), ReduceOp::max)->wait();
    if (acc.process_index() != 0) return 0;

    // Each kind runs M V times per stage and step.
    const double per_action = double(p) * double(steps - kWarmup) * double(m) * double(v);
    const auto mean_of = [&](pipeline::ActionKind k) {
      return sums[1 + std::size_t(k)] / per_action;
    };
    const pipeline::PipelineShape shape{.stages = p, .chunks = v, .microbatches = m};
    const pipeline::SimulationResult model_run =
        pipeline::simulate(pipeline::schedule_all(options.pipeline_schedule, shape), shape,
                           {.forward = mean_of(pipeline::ActionKind::forward),
                            .backward = mean_of(pipeline::ActionKind::backward),
                            .backward_input = mean_of(pipeline::ActionKind::backward_input),
                            .backward_weight = mean_of(pipeline::ActionKind::backward_weight)},
                           pipeline::MessageModel::eager);
    const bool formula_applies = options.pipeline_schedule != pipeline::Schedule::ZERO_BUBBLE;
    const double formula = double(p - 1) / double(v * m + p - 1);
    const double ideal_ms = flags.real("ideal_ms", 0);
    std::string schedule = pipeline::to_string(options.pipeline_schedule);
    if (v > 1) schedule += " V=" + std::to_string(v);
    char ratio[32] = "", formula_text[32] = "-";
    if (ideal_ms > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", step_ms / ideal_ms);
    if (formula_applies) std::snprintf(formula_text, sizeof formula_text, "%.3f", formula);
    std::printf("| %d | %s | %d | %.2f ms | %s | %.3f | %.3f | %s |\n", p, schedule.c_str(), m,
                step_ms, ratio, sums[0] / double(p), model_run.idle_fraction(), formula_text);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: %s\n", e.what());
    return 2;
  }
}
