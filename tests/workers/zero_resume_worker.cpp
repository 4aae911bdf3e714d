// One rank of the ZeRO resharding check (zero_test): the raw MLP with AdamW (two param
// groups, clipping) trained through the Accelerator under the config's strategy, on global
// batches of 24 split over the ranks, so any world size sees the same data per step.
//   zero_resume_worker --phase whole --out FILE [--steps N]          train N steps
//   zero_resume_worker --phase save --dir DIR [--save_at K]          train K steps, save_state
//   zero_resume_worker --phase resume --dir DIR --out FILE [--steps N]
//                                                                    load_state, train to N
//   zero_resume_worker --phase elastic --dir DIR --out FILE [--steps N] [--save_every K]
//                      [--sleep_ms MS] [--progress PDIR]
//                                  resume from DIR when it has a checkpoint, train to N saving
//                                  every K steps, sleeping MS after each; touches
//                                  PDIR/attempt<ACCEL_RESTART_COUNT>_world<W> (launch_elastic_test)
// --dir project: save_state() / load_state() without a directory (the project's named
// checkpoints: automatic_checkpoint_naming, project_dir from the config).
// FILE gets rank 0's final parameters (doubles), for comparing runs. --predict FILE: rank 0
// writes a fixed input (kPredictRows x 13 floats) and the model's logits for it (x 10 floats),
// so a test can check a LibTorch model loaded from `accel merge-weights` against them.
// Parameters are named and shaped as a LibTorch module with a ModuleList "layers" of Linear
// layers would name them ("layers.0.weight" [37, 13]). Each layer is a unit, gathered around
// its forward and its backward with acc.gather_parameters (ZeRO-3; nothing elsewhere).

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "accelerate/accelerator.hpp"
#include "backends/optim/adamw.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "examples/raw_mlp/unit_scopes.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr int kGlobalBatch = 24;
const std::vector<int> kSizes = {13, 37, 29, 10};
constexpr int kPredictRows = 5;

// The MLP's logits (raw_mlp's forward: ReLU between layers, none after the last).
std::vector<float> logits(const raw_mlp::Mlp& model, std::vector<float> a, int rows) {
  for (std::size_t l = 0; l < model.layers().size(); ++l) {
    const auto& L = model.layers()[l];
    std::vector<float> next(std::size_t(rows) * L.out);
    for (int n = 0; n < rows; ++n)
      for (int o = 0; o < L.out; ++o) {
        float s = L.bias[o];
        for (int i = 0; i < L.in; ++i)
          s += L.weight[std::size_t(o) * L.in + i] * a[std::size_t(n) * L.in + i];
        next[std::size_t(n) * L.out + o] = l + 1 < model.layers().size() ? std::max(s, 0.0f) : s;
      }
    a = std::move(next);
  }
  return a;
}

void batch_for(std::uint64_t step, int rank, int world, std::vector<float>& x,
               std::vector<int>& y) {
  std::mt19937 rng(500 + unsigned(step));
  std::normal_distribution<float> g;
  std::vector<float> all(std::size_t(kGlobalBatch) * kSizes.front());
  for (float& v : all) v = g(rng);
  std::vector<int> labels;
  for (int n = 0; n < kGlobalBatch; ++n) labels.push_back(int(rng() % kSizes.back()));
  const int per = kGlobalBatch / world, in = kSizes.front();
  x.assign(all.begin() + std::ptrdiff_t(rank) * per * in,
           all.begin() + std::ptrdiff_t(rank + 1) * per * in);
  y.assign(labels.begin() + rank * per, labels.begin() + (rank + 1) * per);
}

}  // namespace

int main(int argc, char** argv) {
  std::string phase, dir, out, predict, progress;
  std::uint64_t steps = 20, save_at = 10, save_every = 0, sleep_ms = 0;
  const accel::test::WorkerFlags flags(argc, argv);
  phase = flags.text("phase");
  dir = flags.text("dir");
  out = flags.text("out");
  predict = flags.text("predict");
  progress = flags.text("progress");
  steps = std::uint64_t(flags.integer("steps", std::int64_t(steps)));
  save_at = std::uint64_t(flags.integer("save_at", std::int64_t(save_at)));
  save_every = std::uint64_t(flags.integer("save_every", 0));
  sleep_ms = std::uint64_t(flags.integer("sleep_ms", 0));
  try {
    Accelerator acc;
    raw_mlp::Mlp model(kSizes, 5);
    std::vector<ParamRef> params = raw_mlp::param_refs(model, "layers.", 1);
    AdamW optimizer(std::vector<AdamWOptions>{{.lr = 3e-3, .weight_decay = 1e-2},
                                              {.lr = 1e-3, .beta1 = 0.8, .weight_decay = 0}});
    acc.prepare(params, optimizer);
    if (phase == "resume" && dir == "project")
      acc.load_state();
    else if (phase == "resume" || (phase == "elastic" && checkpoint_exists(dir)))
      acc.load_state(dir);
    if (!progress.empty()) {
      const char* attempt = std::getenv("ACCEL_RESTART_COUNT");
      std::ofstream(progress + "/attempt" + (attempt ? attempt : "0") + "_world" +
                    std::to_string(acc.num_processes()));
    }
    const std::uint64_t until = phase == "save" ? save_at : steps;
    std::vector<float> x;
    std::vector<int> y;
    raw_mlp::UnitScopes units(acc, model.layers().size());
    while (acc.step() < until) {
      batch_for(acc.step(), acc.process_index(), acc.num_processes(), x, y);
      model.forward_backward(
          x, y, acc.loss_scale(),
          [&](std::size_t l) {
            acc.grad_ready(2 * l);
            acc.grad_ready(2 * l + 1);
          },
          units.scopes());
      if (acc.sync_gradients()) {
        acc.clip_grad_norm(0.5);
        acc.optimizer_step();
        model.zero_grad();
        if (sleep_ms > 0) ::usleep(useconds_t(sleep_ms * 1000));
        if (save_every > 0 && acc.step() % save_every == 0) acc.save_state(dir);
      }
    }
    if (phase == "save" && dir == "project")
      acc.save_state();
    else if (phase == "save")
      acc.save_state(dir);
    units.gather_all();  // the model's buffers hold the current values (ZeRO-3)
    if (!out.empty() && acc.is_main_process()) {
      std::FILE* f = std::fopen(out.c_str(), "wb");
      for (const auto& L : model.layers()) {
        for (float v : L.weight) {
          const double d = v;
          std::fwrite(&d, sizeof d, 1, f);
        }
        for (float v : L.bias) {
          const double d = v;
          std::fwrite(&d, sizeof d, 1, f);
        }
      }
      std::fclose(f);
    }
    if (!predict.empty() && acc.is_main_process()) {
      std::mt19937 rng(777);
      std::normal_distribution<float> g;
      std::vector<float> x(std::size_t(kPredictRows) * kSizes.front());
      for (float& v : x) v = g(rng);
      const std::vector<float> y = logits(model, x, kPredictRows);
      std::FILE* f = std::fopen(predict.c_str(), "wb");
      std::fwrite(x.data(), sizeof(float), x.size(), f);
      std::fwrite(y.data(), sizeof(float), y.size(), f);
      std::fclose(f);
    }
    std::printf("rank %d of %d (%s): %s done at step %llu\n", acc.process_index(),
                acc.num_processes(), std::string(acc.strategy().name()).c_str(), phase.c_str(),
                static_cast<unsigned long long>(acc.step()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_resume_worker: %s\n", e.what());
    return 2;
  }
}
