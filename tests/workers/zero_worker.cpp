// One rank of the ZeRO checks (zero_test runs it over real processes). Two copies of the raw
// MLP train side by side on this rank's slice of the same global batches, one under DDP, one
// under ZeRO (stage 1, 2 or 3), each with its own built-in optimizer, through the same calls the
// Accelerator makes (grad_ready, sync_gradients every micro-batch, clip_grad_norm, step on
// segments(), after_optimizer_step). Two param groups (weights, biases: interleaved in
// parameter order, so the flat buffers are not parameter order) with different
// hyperparameters, gradient accumulation, clipping; tiny buckets so a bucket straddles rank
// slices; rank != 0 starts from other weights, so prepare()'s broadcast is checked too.
//   zero_worker --stage 1|2|3 --optimizer sgd|adamw|adam [--backend B] [--steps N]
//               [--accumulation K] [--clip X] [--persist N] [--keep_after_forward]
//               [--fake_hosts H]
// Stage 3: each layer is a unit, gathered around its forward and its backward (kept from one
// to the other with --keep_after_forward); parameters under N elements stay gathered. After a
// unit is released the worker overwrites its parameters' buffers with NaN, so a read outside
// the scopes, or a forward that did not gather the updated values, shows in the result; the
// bytes moved are checked against the formula (per micro-batch two all-gathers, or one, of the
// gathered parameters; per step one reduce-scatter of all and an all-gather of the
// persistent ones).
// Prints "max |zero - ddp| = D" and the bytes each strategy moved; exits 0 when D is within
// the limit (world 1: D == 0, bitwise; SGD: the first-order bound of
// tests/support/tolerance.hpp for sums of the ranks' partials in another order; Adam and
// AdamW: empirical, fp32 has no bound), the optimizer state is this rank's slice's, and the
// bytes agree within 1%.
//   zero_worker --order_differs [--backend B]
// Stage 3, each rank's first gather another unit (rank parity): every rank must fail at once
// naming both units. Prints "refused: MESSAGE".
//   zero_worker --misuse (one process)
// Stage 3 used wrongly: a unit that does not exist, tied parameters, a third unit gathered, a unit
// released that is not gathered, one gathered twice, a step with no unit gathered. Prints "misuse
// N: MESSAGE" for each refusal.
//   zero_worker --memory --stage 1|2 [--backend B]
// An 11.5M-parameter model in two groups, one AdamW step under each: prints and checks the
// optimizer-state bytes (unsharded / N within 1% plus padding), stage 2's gradient bytes
// (at most full / N plus two buckets) and the bytes moved per step (DDP's within 1%).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "accelerate/process/process_group.hpp"
#include "backends/comm/host_collectives.hpp"
#include "backends/optim/adamw.hpp"
#include "backends/optim/clip.hpp"
#include "backends/optim/sgd.hpp"
#include "backends/strategy_factory.hpp"
#include "backends/zero/zero_strategy.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "tests/support/fake_hosts.hpp"
#include "tests/support/mlp_magnitude.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr int kGlobalBatch = 24;                   // divides by 1, 2, 3 and 4 ranks
const std::vector<int> kSizes = {13, 37, 29, 10};  // 1920 parameters in 6 tensors of odd sizes

struct Batch {
  std::vector<float> x;
  std::vector<int> labels;
};

Batch my_slice(int index, int rank, int world) {
  std::mt19937 rng(1000 + index);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(std::size_t(kGlobalBatch) * kSizes.front());
  for (float& v : x) v = g(rng);
  std::vector<int> labels;
  for (int n = 0; n < kGlobalBatch; ++n) labels.push_back(int(rng() % kSizes.back()));
  const int per = kGlobalBatch / world, in = kSizes.front();
  Batch s;
  s.x.assign(x.begin() + std::ptrdiff_t(rank) * per * in,
             x.begin() + std::ptrdiff_t(rank + 1) * per * in);
  s.labels.assign(labels.begin() + rank * per, labels.begin() + (rank + 1) * per);
  return s;
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& kind) {
  if (kind == "sgd")
    return std::make_unique<Sgd>(std::vector<SgdOptions>{
        {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true},
        {.lr = 0.02, .momentum = 0.5, .dampening = 0.1}});
  const bool decoupled = kind == "adamw";
  return std::make_unique<AdamW>(std::vector<AdamWOptions>{
      {.lr = 2e-3, .weight_decay = 1e-2, .decoupled_weight_decay = decoupled},
      {.lr = 1e-3,
       .beta1 = 0.8,
       .beta2 = 0.99,
       .eps = 1e-6,
       .weight_decay = 0,
       .decoupled_weight_decay = decoupled}});
}

struct Flags {
  std::string backend, optimizer = "adamw";
  int stage = 2, steps = 50, accumulation = 4;
  double clip = 0.5;
  bool memory = false;
  std::size_t persist = 0;          // stage 3: param_persistence_threshold
  bool keep_after_forward = false;  // stage 3: reshard_after_forward false
  bool order_differs = false, misuse = false;
};

ZeroOptions zero_options_of(const Flags& f) {
  ZeroOptions z;
  z.stage = f.stage;
  z.param_persistence_threshold = f.persist;
  z.reshard_after_forward = !f.keep_after_forward;
  return z;
}

// Stage 3: a layer's parameters outside its scopes hold NaN (see the header).
void poison(raw_mlp::Layer& layer, std::size_t persist) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (layer.weight.size() >= persist) std::fill(layer.weight.begin(), layer.weight.end(), nan);
  if (layer.bias.size() >= persist) std::fill(layer.bias.begin(), layer.bias.end(), nan);
}

// Stage 3: the scopes of forward_backward, gathering and releasing each layer's unit.
raw_mlp::LayerScopes unit_scopes(Strategy& s, raw_mlp::Mlp& model, const Flags& f) {
  raw_mlp::LayerScopes scopes;
  scopes.enter_forward = [&s](std::size_t l) { s.gather_unit(l, UnitPass::forward); };
  scopes.leave_forward = [&s, &model, f](std::size_t l) {
    s.release_unit(l, UnitPass::forward);
    if (!f.keep_after_forward) poison(model.layers()[l], f.persist);
  };
  scopes.enter_backward = [&s](std::size_t l) { s.gather_unit(l, UnitPass::backward); };
  scopes.leave_backward = [&s, &model, f](std::size_t l) {
    s.release_unit(l, UnitPass::backward);
    poison(model.layers()[l], f.persist);
  };
  return scopes;
}

// Stage 3: the model's current parameters, each unit gathered in turn.
raw_mlp::Mlp gathered_copy(Strategy& s, raw_mlp::Mlp& model) {
  for (std::size_t l = 0; l < model.layers().size(); ++l) {
    s.gather_unit(l, UnitPass::forward);
    s.release_unit(l, UnitPass::forward);  // the buffers keep what was gathered
  }
  return model;
}

// Stage 3's bus bytes for `steps` steps of `micro` micro-batches (see the header): as the
// Communicator counts them, (n-1)/n of each all-gather's output and reduce-scatter's input.
double zero3_bus_bytes(const Strategy& s, const Flags& f, int world, int steps, int micro) {
  double gathered = 0, persistent = 0, all = 0;
  for (const ParamRef& p : s.params()) {
    const double bytes = 4.0 * double(p.data.count);
    all += bytes;
    (p.data.count < f.persist ? persistent : gathered) += bytes;
  }
  const double per_micro = (f.keep_after_forward ? 1.0 : 2.0) * gathered;
  return double(world - 1) / world * (steps * (all + persistent) + micro * per_micro);
}

double max_diff(const raw_mlp::Mlp& a, const raw_mlp::Mlp& b) {
  double d = 0;
  for (std::size_t l = 0; l < a.layers().size(); ++l) {
    for (std::size_t i = 0; i < a.layers()[l].weight.size(); ++i)
      d = std::max(d, double(std::abs(a.layers()[l].weight[i] - b.layers()[l].weight[i])));
    for (std::size_t i = 0; i < a.layers()[l].bias.size(); ++i)
      d = std::max(d, double(std::abs(a.layers()[l].bias[i] - b.layers()[l].bias[i])));
  }
  return d;
}

bool within(double a, double b, double rel) { return std::abs(a - b) <= rel * std::max(a, b); }

int parity(Communicator& comm, const Flags& f) {
  const int rank = comm.rank(), world = comm.world_size();
  raw_mlp::Mlp ddp_model(kSizes, 7), zero_model(kSizes, 7);
  if (rank != 0)
    for (float& w : zero_model.layers()[1].weight) w += 0.25f;  // prepare() must overwrite it
  StrategyOptions ddp_options, zero_options;
  ddp_options.ddp.first_bucket_bytes = 512;
  ddp_options.ddp.bucket_cap_bytes = 2048;
  zero_options.kind = StrategyKind::zero;
  zero_options.zero = zero_options_of(f);
  zero_options.zero.bucket_cap_bytes = 1024;  // several buckets, some straddling two slices
  auto ddp = make_strategy(comm, raw_mlp::param_refs(ddp_model, "layers.", 1), {}, ddp_options);
  auto zero = make_strategy(comm, raw_mlp::param_refs(zero_model, "layers.", 1), {}, zero_options);
  ddp->prepare();
  zero->prepare();
  auto ddp_opt = make_optimizer(f.optimizer), zero_opt = make_optimizer(f.optimizer);
  const bool stage3 = f.stage == 3;
  const raw_mlp::LayerScopes scopes =
      stage3 ? unit_scopes(*zero, zero_model, f) : raw_mlp::LayerScopes{};
  if (stage3)
    for (auto& layer : zero_model.layers()) poison(layer, f.persist);  // only gathers count

  std::uint64_t ddp_bytes = 0, zero_bytes = 0;
  double norm_diff = 0;
  int micro = 0;
  test::GradientMagnitude measured;  // of the averaged gradient: this rank's rows' S summed
  for (int step = 0; step < f.steps; ++step) {
    std::vector<double> step_magnitudes;
    for (int k = 0; k < f.accumulation; ++k, ++micro) {
      const Batch b = my_slice(micro, rank, world);
      const bool boundary = k == f.accumulation - 1;
      const float scale = 1.0f / float(f.accumulation);
      test::add_magnitudes(step_magnitudes, test::gradient_magnitudes(ddp_model, b.x, b.labels,
                                                                      scale / float(world)));
      for (auto* s : {ddp.get(), zero.get()}) {
        raw_mlp::Mlp& model = s == ddp.get() ? ddp_model : zero_model;
        const std::uint64_t before = comm.bus_bytes();
        s->set_sync_enabled(boundary);
        model.forward_backward(
            b.x, b.labels, scale,
            [&](std::size_t l) {
              s->grad_ready(2 * l);
              s->grad_ready(2 * l + 1);
            },
            s == zero.get() ? scopes : raw_mlp::LayerScopes{});
        s->sync_gradients();
        (s == ddp.get() ? ddp_bytes : zero_bytes) += comm.bus_bytes() - before;
      }
    }
    // Over the ranks: the averaged gradient's S (magnitudes are not part of the bytes compared).
    all_reduce_values(comm, buffer_of(std::span(step_magnitudes)), ReduceOp::sum);
    test::fold_step(measured, step_magnitudes);
    test::fold_clip_share(measured, ddp_model, f.clip);  // DDP's gradients: the average
    const std::uint64_t before = comm.bus_bytes();
    const double zero_norm = clip_grad_norm(*zero, comm, f.clip);
    zero_opt->step(zero->segments());
    zero->after_optimizer_step();
    zero_bytes += comm.bus_bytes() - before;
    norm_diff = std::max(norm_diff, std::abs(zero_norm - clip_grad_norm(*ddp, comm, f.clip)));
    ddp_opt->step(ddp->segments());
    ddp->after_optimizer_step();
    ddp_model.zero_grad();
    zero_model.zero_grad();
  }
  const double diff = max_diff(ddp_model, stage3 ? gathered_copy(*zero, zero_model) : zero_model);
  const bool bitwise = world == 1;
  // The same local gradients, their world partials (per micro-batch under ZeRO-2) summed in
  // another order, the norms' sums of squares (double) in another order too.
  std::size_t elements = 0;
  for (const ParamRef& p : ddp->params()) elements += p.data.count;
  const std::size_t longest_sum = std::size_t(f.accumulation) * std::size_t(world) + 2;
  const double limit =
      f.optimizer != "sgd"
          ? 1e-6  // empirical: 4.5e-8 measured at world 4
          : test::reordering_bound(
                {.lr = 0.05,
                 .momentum = 0.9,
                 .steps = f.steps,
                 .longest_sum = longest_sum,
                 .magnitude = test::clipped_magnitude({.max_magnitude = measured.max,
                                                       .norm_magnitude = measured.norm,
                                                       .share = measured.share,
                                                       .clip = f.clip,
                                                       .elements = elements,
                                                       .longest_sum = longest_sum,
                                                       .unit_roundoff = test::kUnitRoundoffF32}),
                 .unit_roundoff = test::kUnitRoundoffF32});
  const bool exact = bitwise ? diff == 0 : diff <= limit;
  char required[48];
  std::snprintf(required, sizeof required, bitwise ? "bitwise required" : "limit %.3g", limit);

  // The optimizer state is this rank's slice's: slots x 4 bytes x the slice lengths.
  std::size_t slice_elements = 0;
  for (const ParamSegment& s : zero->segments()) slice_elements += s.values.count;
  std::size_t total = 0;
  for (const ParamRef& p : ddp->params()) total += p.data.count;
  const std::size_t slots = ddp_opt->state_bytes() / (4 * total);
  const bool state_ok = zero_opt->state_bytes() == slots * 4 * slice_elements &&
                        slice_elements * std::size_t(world) <= total + 2 * std::size_t(world);
  // Stages 1 and 2 move what DDP moves; stage 3 the formula (see the header).
  const double expected_bytes =
      stage3 ? zero3_bus_bytes(*zero, f, world, f.steps, micro) : double(ddp_bytes);
  const bool bytes_ok =
      within(expected_bytes, double(zero_bytes), 0.01) || (expected_bytes == 0 && zero_bytes == 0);
  // Stage 3's prefetch after the first step (recorded, no prefetch): in each micro-batch every
  // forward gather but the first, and every backward one but the first when
  // reshard_after_forward (otherwise they stayed gathered); the next micro-batch's first
  // gather is unit 0 again, still gathered when predicted, so not prefetched. Then the
  // forward gathers of gathered_copy() but the first.
  const auto layers = std::uint64_t(kSizes.size() - 1);
  const std::uint64_t per_micro = (layers - 1) * (f.keep_after_forward ? 1 : 2);
  const std::uint64_t expected_hits =
      std::uint64_t(f.steps - 1) * std::uint64_t(f.accumulation) * per_micro + (layers - 1);
  const std::uint64_t hits = stage3 ? static_cast<ZeroStrategy&>(*zero).prefetch_hits() : 0;
  const bool prefetch_ok = !stage3 || hits == expected_hits;
  if (stage3)
    std::printf("rank %d: zero3 prefetch hits %llu (expected %llu)\n", rank,
                static_cast<unsigned long long>(hits),
                static_cast<unsigned long long>(expected_hits));
  std::printf(
      "rank %d of %d (%s): zero%d %s, %d steps, accumulation %d, clip %g: max |zero - ddp| = %.3g "
      "(%s), clip norm diff %.3g; state bytes zero %zu ddp %zu; bus bytes zero %llu ddp %llu "
      "expected %.0f\n",
      rank, world, std::string(comm.backend_name()).c_str(), f.stage, f.optimizer.c_str(), f.steps,
      f.accumulation, f.clip, diff, required, norm_diff, zero_opt->state_bytes(),
      ddp_opt->state_bytes(), static_cast<unsigned long long>(zero_bytes),
      static_cast<unsigned long long>(ddp_bytes), expected_bytes);
  test::VerdictLog verdicts;
  verdicts.check(exact, "parameters equal DDP's");
  verdicts.check(state_ok, "optimizer state is this rank's slice's");
  verdicts.check(bytes_ok, "bytes moved as expected (within 1%)");
  if (stage3) verdicts.check(prefetch_ok, "prefetch hits as expected");
  return verdicts.exit_code();
}

// About 11.5M parameters in two groups, sizes that do not divide by 2, 3 or 4.
int memory(Communicator& comm, const Flags& f) {
  const int rank = comm.rank(), world = comm.world_size();
  const std::vector<std::size_t> sizes = {4000001, 3500003, 2999999, 7, 1000001};
  std::size_t total = 0;
  for (std::size_t n : sizes) total += n;
  std::vector<std::vector<float>> ddp_values, ddp_grads, zero_values, zero_grads;
  std::vector<ParamRef> ddp_params, zero_params;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    for (auto* v : {&ddp_values, &ddp_grads, &zero_values, &zero_grads})
      v->emplace_back(sizes[i], 0.01f * float(i + 1));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::string name = "p" + std::to_string(i);
    ddp_params.push_back(
        {name, buffer_of(std::span(ddp_values[i])), buffer_of(std::span(ddp_grads[i])), i % 2});
    zero_params.push_back({name,
                           buffer_of(std::span(zero_values[i])),
                           buffer_of(std::span(zero_grads[i])),
                           i % 2,
                           {},
                           i});  // unit i
  }
  StrategyOptions ddp_options, zero_options;
  zero_options.kind = StrategyKind::zero;
  zero_options.zero = zero_options_of(f);
  auto ddp = make_strategy(comm, ddp_params, {}, ddp_options);
  auto zero = make_strategy(comm, zero_params, {}, zero_options);
  ddp->prepare();
  zero->prepare();
  AdamW ddp_opt(std::vector<AdamWOptions>(2)), zero_opt(std::vector<AdamWOptions>(2));
  std::uint64_t bytes[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    Strategy& st = s == 0 ? *ddp : *zero;
    Optimizer& opt = s == 0 ? static_cast<Optimizer&>(ddp_opt) : zero_opt;
    const std::uint64_t before = comm.bus_bytes();
    st.set_sync_enabled(true);
    // Each parameter is a unit: gathered for its forward, then for its backward (stage 3; the
    // others ignore units).
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      st.gather_unit(i, UnitPass::forward);
      st.release_unit(i, UnitPass::forward);
    }
    for (std::size_t i = sizes.size(); i-- > 0;) {
      st.gather_unit(i, UnitPass::backward);
      st.grad_ready(i);
      st.release_unit(i, UnitPass::backward);
    }
    st.sync_gradients();
    opt.step(st.segments());
    st.after_optimizer_step();
    bytes[s] = comm.bus_bytes() - before;
  }
  const double unsharded = double(ddp_opt.state_bytes());
  const double per_rank = double(zero_opt.state_bytes());
  // Padding: at most world - 1 elements per flat buffer (2 groups), 2 state slots of 4 bytes.
  const double padding = 2.0 * 4 * 2 * double(world - 1);
  const bool state_ok =
      unsharded == 2.0 * 4 * double(total) &&
      std::abs(per_rank - unsharded / world) <= 0.01 * unsharded / world + padding;
  const double full_grad = 4.0 * double(total);
  const double bucket = double(ZeroOptions{}.bucket_cap_bytes);
  const double grad_bytes = double(zero->gradient_bytes());
  const bool grad_ok = f.stage == 1 || grad_bytes <= full_grad / world + 2 * bucket + 64;
  // Stage 3: the parameters this rank keeps (its slices: / N plus padding), what is gathered at
  // most (two units and the persistent ones) and the bytes moved (the formula, see the header).
  const bool stage3 = f.stage == 3;
  double kept_params = 0;
  for (const ParamSegment& s : zero->segments()) kept_params += 4.0 * double(s.values.count);
  const double gathered = double(static_cast<ZeroStrategy&>(*zero).gathered_parameter_bytes());
  const double largest_unit = 4.0 * double(sizes[0]);
  const double gathered_limit = f.keep_after_forward ? 4.0 * double(total) + 64 * sizes.size()
                                                     : 2 * largest_unit + 64 + 4.0 * 7 + 64;
  const bool params_ok = !stage3 || (std::abs(kept_params - 4.0 * double(total) / world) <=
                                         0.01 * 4.0 * double(total) / world + 4.0 * 2 * world &&
                                     gathered <= gathered_limit);
  const double expected_bytes = stage3 ? zero3_bus_bytes(*zero, f, world, 1, 1) : double(bytes[0]);
  const bool bytes_ok =
      within(expected_bytes, double(bytes[1]), 0.01) || (expected_bytes == 0 && bytes[1] == 0);
  if (stage3)
    std::printf(
        "rank %d of %d (%s): zero3 parameters kept %.0f bytes (all / %d = %.0f), gathered storage "
        "%.0f bytes (limit %.0f), bus bytes per step %llu = %.2f x the parameters' bytes "
        "(expected %.0f)\n",
        rank, world, std::string(comm.backend_name()).c_str(), kept_params, world,
        4.0 * double(total) / world, gathered, gathered_limit,
        static_cast<unsigned long long>(bytes[1]), double(bytes[1]) / (4.0 * double(total)),
        expected_bytes);
  std::printf(
      "rank %d of %d (%s): zero%d memory, %zu parameters: optimizer state bytes %.0f per rank, "
      "unsharded %.0f (/%d = %.0f); gradient bytes %.0f (ddp %zu, full/N + 2 buckets = %.0f); "
      "bus bytes per step zero %llu ddp %llu\n",
      rank, world, std::string(comm.backend_name()).c_str(), f.stage, total, per_rank, unsharded,
      world, unsharded / world, grad_bytes, ddp->gradient_bytes(), full_grad / world + 2 * bucket,
      static_cast<unsigned long long>(bytes[1]), static_cast<unsigned long long>(bytes[0]));
  std::printf("zero state bytes per rank: %.0f\n", per_rank);
  test::VerdictLog verdicts;
  verdicts.check(state_ok, "optimizer state bytes are unsharded / N");
  verdicts.check(grad_ok, "gradient bytes at most full / N + 2 buckets (stage 2 and 3)");
  verdicts.check(params_ok, "parameter bytes at most slices / gathered limit (stage 3)");
  verdicts.check(bytes_ok, "bytes moved as expected (within 1%)");
  return verdicts.exit_code();
}

int order_differs(Communicator& comm) {
  raw_mlp::Mlp model(kSizes, 7);
  StrategyOptions options;
  options.kind = StrategyKind::zero;
  options.zero.stage = 3;
  options.zero.param_persistence_threshold = 0;
  auto zero = make_strategy(comm, raw_mlp::param_refs(model, "layers.", 1), {}, options);
  zero->prepare();
  try {
    zero->gather_unit(std::size_t(comm.rank() % 2), UnitPass::forward);
  } catch (const std::exception& e) {
    std::printf("refused: %s\n", e.what());
    return 3;
  }
  test::VerdictLog verdicts;
  verdicts.check(false, "a unit only some ranks gather is refused",
                 "rank " + std::to_string(comm.rank()) + " gathered it");
  return 1;
}

int misuse(Communicator& comm) {
  test::VerdictLog verdicts;
  const auto expect_refusal = [&](int n, const std::function<void()>& f) {
    try {
      f();
      verdicts.check(false, "misuse " + std::to_string(n) + " refused", "it was accepted");
    } catch (const std::exception& e) {
      std::printf("misuse %d: %s\n", n, e.what());
      verdicts.check(true, "misuse " + std::to_string(n) + " refused", e.what());
    }
  };
  StrategyOptions options;
  options.kind = StrategyKind::zero;
  options.zero.stage = 3;
  options.zero.param_persistence_threshold = 0;
  raw_mlp::Mlp model(kSizes, 7);
  std::vector<ParamRef> params = raw_mlp::param_refs(model, "layers.", 0);  // one param group
  expect_refusal(5, [&] {
    std::vector<ParamRef> tied = params;
    tied[4].data.data = tied[0].data.data;  // layers.2.weight's values within layers.0.weight's
    make_strategy(comm, tied, {}, options);
  });
  expect_refusal(6, [&] {  // a loop unaware of units: a backward and a sync, nothing gathered
    auto unaware = make_strategy(comm, params, {}, options);
    unaware->prepare();
    for (std::size_t i = params.size(); i-- > 0;) unaware->grad_ready(i);
    unaware->sync_gradients();
  });
  auto zero = make_strategy(comm, params, {}, options);
  zero->prepare();
  expect_refusal(1, [&] { zero->gather_unit(9, UnitPass::forward); });
  zero->gather_unit(0, UnitPass::forward);
  zero->gather_unit(1, UnitPass::forward);
  expect_refusal(2, [&] { zero->gather_unit(2, UnitPass::forward); });
  expect_refusal(3, [&] { zero->release_unit(2, UnitPass::forward); });
  expect_refusal(4, [&] { zero->gather_unit(1, UnitPass::forward); });
  return verdicts.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  ProcessGroupOptions pg;
  try {
    const test::WorkerFlags flags(argc, argv);
    flags.only({"memory", "keep_after_forward", "order_differs", "misuse", "backend", "stage",
                "optimizer", "steps", "accumulation", "clip", "persist", "fake_hosts"});
    f.memory = flags.has("memory");
    f.keep_after_forward = flags.has("keep_after_forward");
    f.order_differs = flags.has("order_differs");
    f.misuse = flags.has("misuse");
    if (flags.has("backend")) pg.backend = flags.text("backend");
    f.stage = int(flags.integer("stage", f.stage));
    f.optimizer = flags.text("optimizer", f.optimizer);
    f.steps = int(flags.integer("steps", f.steps));
    f.accumulation = int(flags.integer("accumulation", f.accumulation));
    f.clip = flags.real("clip", f.clip);
    f.persist = std::size_t(flags.integer("persist", std::int64_t(f.persist)));
    // The hierarchical communicator over H "hosts".
    if (flags.has("fake_hosts")) test::claim_fake_host(int(flags.integer("fake_hosts")));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_worker: %s\n", e.what());
    return 2;
  }
  try {
    auto group = init_process_group(pg);
    if (f.order_differs) return order_differs(group->comm());
    if (f.misuse) return misuse(group->comm());
    return f.memory ? memory(group->comm(), f) : parity(group->comm(), f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_worker: %s\n", e.what());
    return 2;
  }
}
