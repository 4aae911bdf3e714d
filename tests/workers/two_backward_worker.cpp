// One rank of the two-backward check (zero_test): a loop that calls backward twice before one
// optimizer step without configured accumulation (a GAN's discriminator: a real batch, then a
// fake one) must step on the sum of both gradients under every strategy, as plain training
// does. The raw API's loop (prepare(model, params_of, optimizer), forward_backward, so it
// runs under DDP, ZeRO-1/2 and DataParallel alike) against the same steps by one process on
// the global batches, in this program.
// Gives the verdict "two backwards per step equal plain training"; exits 1 on a failure.

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/common/image_batches.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr int kIn = 16, kSteps = 20;
constexpr std::size_t kPerRank = 4;

// A batch of `rows` samples drawn from (seed): the same global batch whatever the world size.
examples::FloatImages batch(std::uint64_t seed, std::size_t rows, float shift) {
  std::mt19937 rng{std::uint32_t(seed)};
  std::normal_distribution<float> g(shift, 1.0f);
  examples::FloatImages b;
  b.count = rows;
  b.features = kIn;
  for (std::size_t i = 0; i < rows * kIn; ++i) b.x.push_back(g(rng));
  for (std::size_t i = 0; i < rows; ++i) b.labels.push_back(int(rng() % 10));
  return b;
}

// Rows [first, first + n) of b.
examples::FloatImages rows_of(const examples::FloatImages& b, std::size_t first, std::size_t n) {
  examples::FloatImages out;
  out.count = n;
  out.features = b.features;
  out.x.assign(b.x.begin() + std::ptrdiff_t(first * kIn),
               b.x.begin() + std::ptrdiff_t((first + n) * kIn));
  out.labels.assign(b.labels.begin() + std::ptrdiff_t(first),
                    b.labels.begin() + std::ptrdiff_t(first + n));
  return out;
}

std::vector<ParamSegment> segments_of(raw_mlp::Mlp& m) {
  std::vector<ParamSegment> out;
  for (const ParamRef& p : raw_mlp::param_refs(m)) out.push_back({p.group, p.data, p.grad, 0});
  return out;
}

}  // namespace

int main() {
  try {
    Accelerator acc;
    const int world = acc.num_processes(), rank = acc.process_index();
    const std::vector<int> sizes = {kIn, 32, 10};
    raw_mlp::Mlp model(sizes, 3 + std::uint64_t(rank)), plain(sizes, 3);  // prepare: rank 0's
    const SgdOptions sgd{.lr = 0.1, .momentum = 0.9};
    Sgd optimizer(sgd), plain_optimizer(sgd);
    acc.prepare(
        model, [](raw_mlp::Mlp& m) { return raw_mlp::param_refs(m); }, optimizer);

    const std::size_t global = kPerRank * std::size_t(world);
    const auto noop = [](std::size_t) {};
    for (int step = 0; step < kSteps; ++step) {
      const auto real = batch(2 * std::uint64_t(step) + 1, global, 0.0f);
      const auto fake = batch(2 * std::uint64_t(step) + 2, global, 0.5f);
      // The accelerated loop: this rank's rows of each batch, a backward (and sync) each.
      model.zero_grad();
      for (const auto* b : {&real, &fake}) {
        const auto mine = rows_of(*b, std::size_t(rank) * kPerRank, kPerRank);
        examples::forward_backward_rows(acc, model, mine.x, mine.labels, kIn);
        acc.sync_gradients();
      }
      acc.optimizer_step();
      // Plain: one process, both global batches, gradients summed, one step.
      plain.zero_grad();
      plain.forward_backward(real.x, real.labels, 1.0f, noop);
      plain.forward_backward(fake.x, fake.labels, 1.0f, noop);
      plain_optimizer.step(segments_of(plain));
    }
    double diff = 0, sum = 0, plain_sum = 0;
    const auto mine = raw_mlp::param_refs(model), theirs = raw_mlp::param_refs(plain);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const auto* a = static_cast<const float*>(mine[i].data.data);
      const auto* b = static_cast<const float*>(theirs[i].data.data);
      for (std::size_t k = 0; k < mine[i].data.count; ++k) {
        diff = std::max(diff, std::abs(double(a[k]) - double(b[k])));
        if (i == 0) sum += a[k], plain_sum += b[k];
      }
    }
    // The same terms summed in another order (per rank, two backwards, then averaged over the
    // ranks): the first-order bound of tests/support/tolerance.hpp, fp32 (the raw loops are the
    // same bits on every CPU). Each gradient element sums 2 backwards x `global` rows; its
    // terms (unit-normal inputs, |x| < 6, times the mean loss's softmax gradient, at most 2 in
    // L1 over a backward's rows, through weights below 1) sum to under 10 in magnitude.
    // Losing one backward's gradient moves parameters by ~lr x |g| = 1e-1 per step.
    const double limit = test::reordering_bound({.lr = sgd.lr,
                                                 .momentum = sgd.momentum,
                                                 .steps = kSteps,
                                                 .longest_sum = 2 * global,
                                                 .magnitude = 10,
                                                 .unit_roundoff = test::kUnitRoundoffF32});
    char line[200];
    std::snprintf(line, sizeof line,
                  "max |diff| %.3g (limit %.3g), first weight sum %.4f (plain %.4f, %s, world %d)",
                  diff, limit, sum, plain_sum, std::string(acc.strategy().name()).c_str(), world);
    test::VerdictLog verdicts;
    verdicts.check(diff <= limit, "two backwards per step equal plain training", line);
    return verdicts.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "two_backward_worker: %s\n", e.what());
    return 2;
  }
}
