// One rank of the Accelerator (raw API) checks, run by accelerator_test over real processes:
//  - training: the raw MLP through prepare_parameters / grad_ready / sync_gradients /
//    clip_grad_norm, on this rank's shard of every global batch, ends with the parameters a
//    single process gets on the whole batches (within the first-order bound of
//    tests/support/tolerance.hpp, magnitudes measured on the reference);
//  - evaluation: gather_for_metrics over an epoch yields exactly the dataset's size, every
//    sample once;
//  - set_seed: rank 0's seed reaches everyone; split_between_processes covers [0, n) once.
// Prints one "ok ..." line per check; exits 1 on any failure.
//   accelerator_worker [--accumulation K] [--clip MAX_NORM]

#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>

#include "accelerate/accelerator.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "tests/support/global_batches.hpp"
#include "tests/support/mlp_magnitude.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

const std::vector<int> kSizes = {16, 32, 10};
constexpr std::size_t kDatasetSize = 103;  // not a multiple of any batch: padding happens

struct Dataset {
  std::vector<float> x;
  std::vector<int> labels;
};

Dataset make_dataset() {
  std::mt19937 rng(77);
  std::normal_distribution<float> g;
  Dataset d;
  d.x.resize(kDatasetSize * kSizes.front());
  for (float& v : d.x) v = g(rng);
  for (std::size_t i = 0; i < kDatasetSize; ++i) d.labels.push_back(int(rng() % kSizes.back()));
  return d;
}

Dataset select(const Dataset& d, const std::vector<std::size_t>& idx) {
  Dataset out;
  const std::size_t in = std::size_t(kSizes.front());
  for (std::size_t i : idx) {
    out.x.insert(out.x.end(), d.x.begin() + std::ptrdiff_t(i * in),
                 d.x.begin() + std::ptrdiff_t((i + 1) * in));
    out.labels.push_back(d.labels[i]);
  }
  return out;
}

// PyTorch's clip_grad_norm_ on one process.
double clip(raw_mlp::Mlp& m, double max_norm) {
  double sq = 0;
  for (auto& L : m.layers()) {
    for (float g : L.weight_grad) sq += double(g) * g;
    for (float g : L.bias_grad) sq += double(g) * g;
  }
  const double norm = std::sqrt(sq), coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (auto& L : m.layers()) {
      for (float& g : L.weight_grad) g = float(g * coef);
      for (float& g : L.bias_grad) g = float(g * coef);
    }
  return norm;
}

test::VerdictLog verdicts;

}  // namespace

int main(int argc, char** argv) {
  const test::WorkerFlags flags(argc, argv);
  AcceleratorOptions options;
  if (flags.has("accumulation"))
    options.gradient_accumulation_steps = int(flags.integer("accumulation"));
  const double max_norm = flags.real("clip", 0);
  options.ddp.first_bucket_bytes = 512;  // several buckets even for this small model
  options.ddp.bucket_cap_bytes = 2048;
  try {
    Accelerator acc(options);
    const int world = acc.num_processes(), rank = acc.process_index();
    const int accumulation = acc.gradient_accumulation_steps();
    const Dataset data = make_dataset();

    raw_mlp::Mlp model(kSizes, 3), reference(kSizes, 3);
    // The built-in optimizer: the same loop then runs under DDP and ZeRO (ACCEL_DISTRIBUTED_TYPE).
    Sgd optimizer(SgdOptions{.lr = 0.2});
    acc.prepare(raw_mlp::param_refs(model), optimizer);

    // Training: 2 epochs, 4 samples per rank per batch, shuffled per epoch.
    const std::size_t per_rank = 4;
    const SamplerOptions sampling{per_rank, true, 11, false};
    ShardedSampler sampler = acc.make_sampler(kDatasetSize, sampling);
    double norm_diff = 0;
    test::GradientMagnitude measured;
    std::vector<double> step_magnitudes;
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      sampler.set_epoch(epoch);
      const auto mine = sampler.indices();
      const auto all = test::global_batches(kDatasetSize, world, sampling, epoch);
      for (std::size_t b = 0; b < sampler.num_batches(); ++b) {
        const auto [begin, end] = sampler.batch_bounds(b);  // one process: a short last batch
        const Dataset batch = select(
            data, {mine.begin() + std::ptrdiff_t(begin), mine.begin() + std::ptrdiff_t(end)});
        acc.begin_batch(b, sampler.num_batches());
        model.forward_backward(batch.x, batch.labels, acc.loss_scale(), [&](std::size_t l) {
          acc.grad_ready(2 * l);
          acc.grad_ready(2 * l + 1);
        });
        const Dataset global = select(data, all[b]);
        test::add_magnitudes(step_magnitudes,
                             test::gradient_magnitudes(reference, global.x, global.labels,
                                                       1.0f / float(accumulation)));
        reference.forward_backward(global.x, global.labels, 1.0f / float(accumulation),
                                   [](std::size_t) {});
        // Every K batches, and at the end of the epoch (Accelerate's sync_with_dataloader).
        const bool boundary =
            (b + 1) % std::size_t(accumulation) == 0 || b + 1 == sampler.num_batches();
        if (acc.sync_gradients() != boundary) verdicts.check(false, "sync_gradients boundary");
        if (boundary) {
          test::fold_step(measured, std::exchange(step_magnitudes, {}));
          if (max_norm > 0) test::fold_clip_share(measured, reference, max_norm);
          if (max_norm > 0)
            norm_diff = std::max(
                norm_diff, std::abs(acc.clip_grad_norm(max_norm) - clip(reference, max_norm)));
          acc.optimizer_step();
          reference.sgd_step(0.2f);
          model.zero_grad();
          reference.zero_grad();
        }
      }
    }
    double diff = 0;
    for (std::size_t l = 0; l < model.layers().size(); ++l) {
      for (std::size_t i = 0; i < model.layers()[l].weight.size(); ++i)
        diff = std::max(
            diff, double(std::abs(model.layers()[l].weight[i] - reference.layers()[l].weight[i])));
      for (std::size_t i = 0; i < model.layers()[l].bias.size(); ++i)
        diff = std::max(
            diff, double(std::abs(model.layers()[l].bias[i] - reference.layers()[l].bias[i])));
    }
    // A gradient sums K micro-batches of the global batch's rows (per rank: its shard, then
    // the world partials), each term scaled once more or less (2 roundings). The raw loops are
    // the same bits on every x86-64 CPU: the measured magnitudes hold everywhere.
    std::size_t elements = 0;
    for (const auto& l : reference.layers()) elements += l.weight.size() + l.bias.size();
    const std::size_t longest_sum =
        std::size_t(accumulation) * per_rank * std::size_t(world) + std::size_t(world) + 2;
    const double magnitude =
        max_norm > 0 ? test::clipped_magnitude({.max_magnitude = measured.max,
                                                .norm_magnitude = measured.norm,
                                                .share = measured.share,
                                                .clip = max_norm,
                                                .elements = elements,
                                                .longest_sum = longest_sum,
                                                .unit_roundoff = test::kUnitRoundoffF32})
                     : measured.max;
    const double limit = test::reordering_bound({.lr = 0.2,
                                                 .steps = int(acc.step()),
                                                 .longest_sum = longest_sum,
                                                 .magnitude = magnitude,
                                                 .unit_roundoff = test::kUnitRoundoffF32});
    const double norm_limit =
        test::norm_reordering_bound({.norm_magnitude = measured.norm,
                                     .elements = elements,
                                     .longest_sum = longest_sum,
                                     .unit_roundoff = test::kUnitRoundoffF32});
    char line[240];
    std::snprintf(line, sizeof line,
                  "max |diff| %.3g (limit %.3g), clip norm diff %.3g (limit %.3g) (%llu optimizer "
                  "steps)",
                  diff, limit, norm_diff, norm_limit, static_cast<unsigned long long>(acc.step()));
    verdicts.check(diff <= limit && norm_diff <= norm_limit, "training equals one process", line);
    verdicts.check(true, "strategy", std::string(acc.strategy().name()));

    // Evaluation: each sample's index, gathered for metrics, batch by batch.
    ShardedSampler eval = acc.make_sampler(kDatasetSize, {5, false, 0, false});
    const auto eval_idx = eval.indices();
    std::vector<std::int64_t> seen;
    for (std::size_t b = 0; b < eval.num_batches(); ++b) {
      const auto [begin, end] = eval.batch_bounds(b);
      std::vector<std::int64_t> local(eval_idx.begin() + std::ptrdiff_t(begin),
                                      eval_idx.begin() + std::ptrdiff_t(end));
      const auto g = acc.gather_for_metrics(local, eval, b);
      seen.insert(seen.end(), g.begin(), g.end());
    }
    const std::set<std::int64_t> distinct(seen.begin(), seen.end());
    verdicts.check(seen.size() == kDatasetSize && distinct.size() == kDatasetSize,
                   "gather_for_metrics yields every sample once",
                   std::to_string(seen.size()) + " samples, " + std::to_string(distinct.size()) +
                       " distinct, of " + std::to_string(kDatasetSize));

    acc.set_seed(rank == 0 ? 1234 : 99);
    std::vector<std::int64_t> seeds =
        acc.gather(std::vector<std::int64_t>{std::int64_t(acc.seed())});
    verdicts.check(
        std::all_of(seeds.begin(), seeds.end(), [](std::int64_t s) { return s == 1234; }),
        "set_seed agrees on rank 0's seed");

    const auto [begin, end] = acc.split_between_processes(10);
    std::vector<std::int64_t> range = {std::int64_t(begin), std::int64_t(end)};
    const auto ranges = acc.gather(range);
    bool contiguous = ranges.front() == 0 && ranges.back() == 10;
    for (std::size_t r = 1; r < ranges.size() / 2; ++r)
      contiguous &= ranges[2 * r] == ranges[2 * r - 1];
    verdicts.check(contiguous, "split_between_processes covers [0, 10) once");

    const auto padded = acc.pad_across_processes(std::vector<float>(std::size_t(rank + 1), 1.0f));
    verdicts.check(padded.size() == std::size_t(world), "pad_across_processes pads to the longest");
    acc.wait_for_everyone();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accelerator_worker: %s\n", e.what());
    return 2;
  }
  return verdicts.exit_code();
}
