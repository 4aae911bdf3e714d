// One rank of the fp16 loss-scaling checks (loss_scaling_test runs it over real processes):
// the raw API with mixed_precision fp16 on a least-squares "model" w (8 floats) whose gradient
// each rank computes by hand from its own target. At step 3 only the last rank's gradient
// overflows (an inf): every rank must skip that step, the scale must back off and grow again
// on schedule (init 1024, growth every 3 finite steps), and the parameters must equal one
// process applying plain SGD to the average gradient of every step but the skipped one.
// Under ZeRO (--zero STAGE) the overflow lands in rank 0's slice only (element 0), so the
// other ranks learn of it only through the scaler's agreement.
// Under ZeRO-3 w is one unit, gathered around the "forward" (the gradient's computation).
//   loss_scaling_worker [--zero 1|2|3]
// Prints one "ok ..." line per check; exits 1 on any failure.

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "backends/optim/sgd.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr int kSteps = 10, kOverflowStep = 3, kParams = 8;
constexpr float kLr = 0.25f;

float target(int step, int rank, int i) { return float((step * 7 + rank * 3 + i) % 11) - 5.0f; }

test::VerdictLog verdicts;

}  // namespace

int main(int argc, char** argv) {
  try {
    AcceleratorOptions options;
    const test::WorkerFlags flags(argc, argv);
    if (flags.has("zero")) {
      options.distributed_type = "ZERO";
      options.zero_stage = int(flags.integer("zero"));
    }
    options.mixed_precision = "fp16";
    options.loss_scaler.init_scale = 1024;
    options.loss_scaler.growth_interval = 3;
    Accelerator acc(options);
    const int world = acc.num_processes(), rank = acc.process_index();

    std::vector<float> w(kParams, 1.0f), grad(kParams, 0.0f);
    Sgd sgd(SgdOptions{.lr = kLr});
    acc.prepare({{"w", buffer_of(std::span(w)), buffer_of(std::span(grad))}}, sgd);

    const std::string expected_strategy =
        options.zero_stage ? "zero" + std::to_string(*options.zero_stage) : "ddp";
    verdicts.check(acc.strategy().name() == expected_strategy, "strategy",
                   std::string(acc.strategy().name()));
    std::vector<float> reference(kParams, 1.0f);
    std::vector<double> scales;
    std::vector<int> skipped;
    bool zeroed_after_skip = true;
    for (int step = 0; step < kSteps; ++step) {
      scales.push_back(acc.loss_scale());
      // "backward": d/dw of 0.5 * |w - t|^2, times the loss scale.
      {
        const auto gathered = acc.gather_parameters(0, UnitPass::backward);
        for (int i = 0; i < kParams; ++i)
          grad[i] = (w[i] - target(step, rank, i)) * acc.loss_scale();
      }
      if (step == kOverflowStep && rank == world - 1)
        grad[0] = std::numeric_limits<float>::infinity();
      acc.grad_ready(0);
      const bool synced = acc.sync_gradients();
      if (synced) {
        acc.optimizer_step();
        std::fill(grad.begin(), grad.end(), 0.0f);
      } else {
        skipped.push_back(step);
        for (float g : grad) zeroed_after_skip = zeroed_after_skip && g == 0.0f;
        if (!acc.optimizer_step_was_skipped())
          verdicts.check(false, "sync_gradients false but not skipped");
      }
      if (step != kOverflowStep)
        for (int i = 0; i < kParams; ++i) {
          double avg = 0;
          for (int r = 0; r < world; ++r) avg += reference[i] - target(step, r, i);
          reference[i] -= kLr * float(avg / world);
        }
    }

    verdicts.check(skipped == std::vector<int>{kOverflowStep},
                   "every rank skipped exactly the step that overflowed",
                   "on rank " + std::to_string(world - 1));
    verdicts.check(zeroed_after_skip, "the skipped step's gradients were zeroed");
    const std::vector<double> expected = {1024, 1024, 1024, 2048, 1024,
                                          1024, 1024, 2048, 2048, 2048};
    verdicts.check(scales == expected,
                   "the scale backs off after the overflow and grows every 3 steps");
    verdicts.check(acc.loss_scaler()->scale() == 4096, "the scale ends at 4096");
    verdicts.check(acc.step() == std::uint64_t(kSteps - 1), "the skipped step is not counted");
    { const auto gathered = acc.gather_parameters(0); }  // w current (ZeRO-3)
    double diff = 0;
    for (int i = 0; i < kParams; ++i) diff = std::max(diff, double(std::fabs(w[i] - reference[i])));
    // The ranks' scaled gradients (w - t) 2^k (exact) summed in float over the world, divided
    // by it and unscaled (exact), against the reference's double mean rounded once: sums of
    // world terms and 2 roundings, |w - t| <= 10 (|w|, |t| <= 5). Each run also rounds its
    // update w - lr g (lr = 1/4: lr g exact) by u |w| per step. The same bits on every CPU.
    const double limit = test::reordering_bound({.lr = kLr,
                                                 .steps = kSteps,
                                                 .longest_sum = std::size_t(world) + 2,
                                                 .magnitude = 10,
                                                 .unit_roundoff = test::kUnitRoundoffF32}) +
                         2 * test::kUnitRoundoffF32 * 5 * kSteps;
    char line[160];
    std::snprintf(line, sizeof line, "max |diff| %.3g, limit %.3g", diff, limit);
    verdicts.check(diff <= limit, "training equals one process skipping the same step", line);
    return verdicts.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loss_scaling_worker: %s\n", e.what());
    return 1;
  }
}
