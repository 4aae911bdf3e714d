// One rank of the DDP equivalence check: trains the raw MLP for some steps with DdpStrategy
// on its slice of each global batch, and trains a single-process reference on the whole
// global batches itself. Verdicts: "ddp equals one process" (the parameters agree within the
// first-order bound of tests/support/tolerance.hpp, magnitudes measured on the reference; the
// detail says whether the buckets were in shared memory) and "an unused parameter's gradient
// is averaged". Exit 0 when both passed, 1 when one failed, 2 on an error.
//   ddp_worker --backend gloo|mpi|shm|local [--accumulation K] [--steps N] [--hidden H]
//              [--bucket_cap_bytes B]
//
// Buckets are made tiny so the model spans several of them and their order matters; rank
// != 0 starts from different weights, so prepare()'s broadcast is checked too; one parameter
// never gets a gradient, so the unused-parameter path runs every step.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "accelerate/process/process_group.hpp"
#include "backends/ddp/ddp_strategy.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "tests/support/mlp_magnitude.hpp"
#include "tests/support/shm_segments.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr int kGlobalBatch = 24;                   // divides by 1, 2, 3 and 4 ranks
const std::vector<int> kSizes = {32, 64, 48, 10};  // the hidden 64 changes with --hidden

struct Batch {
  std::vector<float> x;
  std::vector<int> labels;
};

// Global micro-batch `index`: the same on every rank.
Batch global_batch(int index) {
  std::mt19937 rng(1000 + index);
  std::normal_distribution<float> g(0.0f, 1.0f);
  Batch b;
  b.x.resize(std::size_t(kGlobalBatch) * kSizes.front());
  for (float& v : b.x) v = g(rng);
  for (int n = 0; n < kGlobalBatch; ++n) b.labels.push_back(int(rng() % kSizes.back()));
  return b;
}

Batch slice(const Batch& b, int rank, int world) {
  const int per = kGlobalBatch / world, in = kSizes.front();
  Batch s;
  s.x.assign(b.x.begin() + std::ptrdiff_t(rank) * per * in,
             b.x.begin() + std::ptrdiff_t(rank + 1) * per * in);
  s.labels.assign(b.labels.begin() + rank * per, b.labels.begin() + (rank + 1) * per);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ProcessGroupOptions pg;
    DdpOptions options;
    options.first_bucket_bytes = 1024;
    options.bucket_cap_bytes = 8 * 1024;
    const test::WorkerFlags flags(argc, argv);
    flags.only({"backend", "accumulation", "steps", "hidden", "bucket_cap_bytes"});
    if (flags.has("backend")) pg.backend = flags.text("backend");
    const int accumulation = int(flags.integer("accumulation", 1));
    const int steps = int(flags.integer("steps", 20));
    const int hidden = int(flags.integer("hidden", kSizes[1]));
    options.bucket_cap_bytes =
        std::size_t(flags.integer("bucket_cap_bytes", std::int64_t(options.bucket_cap_bytes)));
    auto group = init_process_group(pg);
    Communicator& comm = group->comm();
    const int rank = comm.rank(), world = comm.world_size();

    std::vector<int> sizes = kSizes;
    sizes[1] = hidden;
    raw_mlp::Mlp model(sizes, 7), reference(sizes, 7);
    if (rank != 0)  // a different start that prepare() must overwrite with rank 0's
      for (float& w : model.layers()[0].weight) w += 0.5f;

    // Never used by the forward: its gradient holds what an earlier micro-batch left (rank + 1
    // here) and must come out as the average over ranks, not be lost or waited for.
    std::vector<float> unused(5, 1.0f), unused_grad(5, 0.0f);
    std::vector<ParamRef> params;
    for (std::size_t l = 0; l < model.layers().size(); ++l) {
      raw_mlp::Layer& L = model.layers()[l];
      params.push_back({"layers." + std::to_string(l) + ".weight", buffer_of(std::span(L.weight)),
                        buffer_of(std::span(L.weight_grad))});
      params.push_back({"layers." + std::to_string(l) + ".bias", buffer_of(std::span(L.bias)),
                        buffer_of(std::span(L.bias_grad))});
    }
    params.push_back({"unused", buffer_of(std::span(unused)), buffer_of(std::span(unused_grad))});
    DdpStrategy ddp(comm, params, {}, options);
    ddp.prepare();

    int micro = 0;
    bool unused_ok = true;
    test::GradientMagnitude measured;
    const float unused_expected = float(world + 1) / 2.0f;  // mean of 1 .. world
    for (int step = 0; step < steps; ++step) {
      model.zero_grad();
      reference.zero_grad();
      std::fill(unused_grad.begin(), unused_grad.end(), float(rank + 1));
      std::vector<double> step_magnitudes;
      for (int k = 0; k < accumulation; ++k, ++micro) {
        const Batch global = global_batch(micro);
        const Batch mine = slice(global, rank, world);
        ddp.set_sync_enabled(k == accumulation - 1);  // no_sync until the boundary
        const float scale = 1.0f / float(accumulation);
        model.forward_backward(mine.x, mine.labels, scale, [&](std::size_t l) {
          ddp.grad_ready(2 * l);
          ddp.grad_ready(2 * l + 1);
        });
        test::add_magnitudes(step_magnitudes,
                             test::gradient_magnitudes(reference, global.x, global.labels, scale));
        reference.forward_backward(global.x, global.labels, scale, [](std::size_t) {});
      }
      test::fold_step(measured, step_magnitudes);
      ddp.sync_gradients();
      for (float g : unused_grad) unused_ok &= g == unused_expected;
      model.sgd_step(0.1f);
      reference.sgd_step(0.1f);
    }

    double max_diff = 0;
    for (std::size_t l = 0; l < model.layers().size(); ++l) {
      const auto& a = model.layers()[l];
      const auto& b = reference.layers()[l];
      for (std::size_t i = 0; i < a.weight.size(); ++i)
        max_diff = std::max(max_diff, double(std::abs(a.weight[i] - b.weight[i])));
      for (std::size_t i = 0; i < a.bias.size(); ++i)
        max_diff = std::max(max_diff, double(std::abs(a.bias[i] - b.bias[i])));
    }
    // A gradient sums the K micro-batches' global rows (per rank: its slice, then the world
    // partials), each term scaled by 1 / rows once more or less (2 roundings). The raw loops
    // are the same bits on every x86-64 CPU: the measured magnitudes hold everywhere.
    const double limit = test::reordering_bound(
        {.lr = 0.1,
         .steps = steps,
         .longest_sum = std::size_t(accumulation) * kGlobalBatch + std::size_t(world) + 2,
         .magnitude = measured.max,
         .unit_roundoff = test::kUnitRoundoffF32});
    char detail[256];
    std::snprintf(
        detail, sizeof detail,
        "%s, %d steps, accumulation %d, %zu buckets%s, max |ddp - single| = %.3g "
        "(limit %.3g)",
        std::string(comm.backend_name()).c_str(), steps, accumulation, ddp.bucket_layout().size(),
        test::in_shm_segment(ddp.grad_slot(0, 0).data) ? " in shared memory" : "", max_diff, limit);
    test::VerdictLog verdicts(rank);
    verdicts.check(max_diff <= limit, "ddp equals one process", detail);
    verdicts.check(unused_ok, "an unused parameter's gradient is averaged");
    return verdicts.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_worker: %s\n", e.what());
    return 2;
  }
}
