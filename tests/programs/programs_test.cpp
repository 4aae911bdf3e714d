// Issue 15's programs (tests/programs): each shape a plain LibTorch program and its twin
// converted by the README's recipe. For each: the lines the conversion added or changed,
// counted against the plain source; the converted program at world 1 bit for bit the plain
// one (fp64: parameters and every step's loss); DDP at 2 and 4 processes and ZeRO-1/2 at 2,
// the global batch held (per-process batch = global / world), within the bound
// tests/support/tolerance.hpp derives of the plain program on the global batch (fp64, where
// first order holds); under mixed_precision bf16 (fp32 models) different from fp32 (autocast
// really on) and still learning.

#include "tests/programs/program.hpp"
// LibTorch's logging header defines a CHECK of its own (fatal, uncounted); doctest's is meant.
#undef CHECK
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/tolerance.hpp"

#include "backends/comm/registry.hpp"

using namespace accel;
using namespace accel::test;
using namespace programs;

namespace {

constexpr int kGlobalBatch = 16, kSteps = 24;

std::vector<std::string> lines_of(const std::string& path) {
  std::istringstream in(read_file(path));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Lines of `converted` outside a longest common subsequence with `plain`: what the conversion
// added or changed (diff's '>' lines).
std::size_t changed_lines(const std::string& plain, const std::string& converted) {
  const auto a = lines_of(plain), b = lines_of(converted);
  REQUIRE(!a.empty());
  std::vector<std::vector<std::size_t>> lcs(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = a.size(); i-- > 0;)
    for (std::size_t j = b.size(); j-- > 0;)
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  return b.size() - lcs[0][0];
}

struct Run {
  std::vector<double> parameters;
  std::vector<double> losses;        // rank 0's, per step
  std::vector<std::string> outputs;  // each rank's
};

std::vector<double> losses_in(const std::string& output) {
  std::vector<double> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    int step = 0;
    double loss = 0;
    if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) == 2) out.push_back(loss);
  }
  return out;
}

// `program` at `world` processes (the test hosting the store as `accel launch` does).
Run run(const std::string& program, int world, std::vector<std::string> args,
        std::vector<std::pair<std::string, std::string>> env = {}) {
  static int count = 0;
  TempDir dir("accel_programs");
  const std::string dump = dir / ("dump" + std::to_string(count++));
  args.insert(args.end(), {"--dump", dump});
  RanksOptions options;
  options.env = std::move(env);
  const auto result = run_ranks(world, program, args, options);
  INFO(program << " at " << world << ": " << describe(result));
  REQUIRE(result.exit_code() == 0);
  Run r{read_doubles(dump), losses_in(result.workers.front().output), {}};
  for (const auto& w : result.workers) r.outputs.push_back(w.output);
  REQUIRE(!r.parameters.empty());
  REQUIRE(!r.losses.empty());
  return r;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

double mean(const std::vector<double>& v, std::size_t from, std::size_t n) {
  return std::accumulate(v.begin() + from, v.begin() + from + n, 0.0) / double(n);
}

struct Shape {
  std::string name;           // tests/programs/<name>.cpp and <name>_plain.cpp
  std::size_t changed_limit;  // see the case
  std::vector<std::string> args;
  // The bound on |parameters - plain's| at `world` processes (fp64).
  std::function<double(int world)> bound;
  // Also checked under ZeRO-3 (sharded parameters): not for a TorchScript model, nor for a
  // loop that calls the model's own forward (refused, naming the parameter).
  bool zero3 = true;
};

void check_changed_lines(const Shape& shape) {
  const std::string dir = std::string(ACCEL_SOURCE_DIR) + "/tests/programs/";
  const std::size_t n = changed_lines(dir + shape.name + "_plain.cpp", dir + shape.name + ".cpp");
  MESSAGE(shape.name << ": " << n << " lines added or changed");
  CHECK(n <= shape.changed_limit);
}

std::vector<std::string> with(std::vector<std::string> args, std::vector<std::string> more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Stage 3 with every parameter of these small models sharded (the default threshold would
// keep them all gathered).
std::vector<std::pair<std::string, std::string>> zero3_env() {
  auto env = zero_env(3);
  env.emplace_back("ACCEL_ZERO3_PARAM_PERSISTENCE_THRESHOLD", "0");
  return env;
}

// World 1 bitwise, then every strategy against the plain program on the global batch.
void check_equivalence(const Shape& shape) {
  const std::string plain = "program_" + shape.name + "_plain", converted = "program_" + shape.name;
  const auto args = with(shape.args, {"--dtype", "double", "--steps", std::to_string(kSteps)});
  const Run reference = run(plain, 1, with(args, {"--batch", std::to_string(kGlobalBatch)}));
  const Run one = run(converted, 1, with(args, {"--batch", std::to_string(kGlobalBatch)}));
  CHECK(one.parameters == reference.parameters);
  CHECK(one.losses == reference.losses);
  struct Strategy {
    std::string name;
    int world;
    std::vector<std::pair<std::string, std::string>> env;
  };
  std::vector<Strategy> strategies = {Strategy{"DDP", 2, {}}, Strategy{"DDP", 4, {}},
                                      Strategy{"ZeRO-1", 2, zero_env(1)},
                                      Strategy{"ZeRO-2", 2, zero_env(2)}};
  if (shape.zero3) strategies.push_back({"ZeRO-3", 2, zero3_env()});
  for (const Strategy& s : strategies) {
    CAPTURE(s.name);
    CAPTURE(s.world);
    const Run r = run(converted, s.world,
                      with(args, {"--batch", std::to_string(kGlobalBatch / s.world)}), s.env);
    const double d = max_difference(r.parameters, reference.parameters),
                 limit = shape.bound(s.world);
    MESSAGE(shape.name << " " << s.name << " at " << s.world << ": max |diff| " << d << " (limit "
                       << limit << ")");
    CHECK(d <= limit);
  }
}

// bf16 against fp32 at world 1: autocast changes the numbers, and the loss still falls.
void check_bf16(const Shape& shape) {
  const auto args = with(shape.args, {"--dtype", "float", "--steps", std::to_string(kSteps),
                                      "--batch", std::to_string(kGlobalBatch)});
  const Run fp32 = run("program_" + shape.name + "_plain", 1, args);
  const Run bf16 = run("program_" + shape.name, 1, args, {{"ACCEL_MIXED_PRECISION", "bf16"}});
  CHECK(bf16.parameters != fp32.parameters);
  REQUIRE(bf16.losses.size() >= 6);
  const double first = mean(bf16.losses, 0, 3), last = mean(bf16.losses, bf16.losses.size() - 3, 3);
  MESSAGE(shape.name << " bf16: mean loss of the first 3 steps " << first << ", last 3 " << last);
  CHECK(last < first);
}

// The three checks every program without a special case gets.
void check_program(const Shape& shape) {
  check_changed_lines(shape);
  check_equivalence(shape);
  check_bf16(shape);
}

bool gloo_missing() {
  return skip_unless(communicator_available("gloo"), "gloo communicator not built");
}

// SGD's bound (tolerance.hpp) for a gradient whose longest sum is the global batch's
// `terms_per_row` terms per row (or a forward inner product of `fan_in` terms, whichever is
// longer), then `world` rank partials and two roundings of the 1 / rows scale.
std::size_t longest_sum(std::size_t terms_per_row, std::size_t fan_in, int world) {
  return std::max(kGlobalBatch * terms_per_row, fan_in) + std::size_t(world) + 2;
}

}  // namespace

TEST_CASE("custom Dataset (files read in get(), Normalize, random noise, Stack, 2 workers)") {
  if (gloo_missing()) return;
  TempDir data("accel_programs_data");
  write_image_files(data.path.string(), 96, 7);
  // SGD lr 0.1, momentum 0.9. The longest sum: the conv weight's gradient, 16 positions of each
  // row. Terms: softmax errors below 2, normalised pixels in [-2, 2], conv outputs below 20
  // (9 weights below 1 each), weights below 1: a gradient element's |terms| sum well under 100.
  const Shape shape{"custom_dataset", 8, {"--data", data.path.string()}, [](int world) {
                      return reordering_bound({.lr = 0.1,
                                               .momentum = 0.9,
                                               .steps = kSteps,
                                               .longest_sum = longest_sum(16, 65, world),
                                               .magnitude = 100});
                    }};
  check_changed_lines(shape);
  {
    // The noise is drawn by 2 workers racing for LibTorch's generator, so which sample gets
    // which draw differs from run to run (the plain program's too), and N processes draw for
    // other samples than one: the comparisons run with the transform drawing but scaled by 0.
    INFO("noise 0");
    Shape deterministic = shape;
    deterministic.args = with(shape.args, {"--noise", "0"});
    check_equivalence(deterministic);
    check_bf16(deterministic);
  }
  // With the noise on and the samples read in order (workers 0), one process draws what the
  // plain program draws: bit for bit.
  const auto args = with(shape.args, {"--workers", "0", "--dtype", "double", "--batch", "16"});
  const Run plain = run("program_custom_dataset_plain", 1, args);
  const Run converted = run("program_custom_dataset", 1, args);
  CHECK(converted.parameters == plain.parameters);
  CHECK(converted.losses == plain.losses);
}

TEST_CASE("LSTM language model: BPTT windows of a token stream, clipping, StepLR") {
  if (gloo_missing()) return;
  // 10 lines: the stream's split is two (cut to whole global columns, then this process's
  // share), the clip one, the dump through get_state_dict one, besides the recipe's.
  const Shape shape{"lstm_lm", 10, {}, [](int world) {
                      // SGD lr 1 (StepLR only lowers it), clipped to 0.5. The longest sum: the
                      // embedding's and LSTM weights' gradients over a window's 6 steps of the
                      // global batch's 16 columns (forward inner products: 16 + 1 terms). Terms:
                      // softmax errors below 2 over 96 rows, states and gates below 1, weights
                      // below 1: S_max well under 100; |S|_2 <= sqrt(P) S_max; share at most 1.
                      const std::size_t p = 16 * 16 + 4 * 16 * 32 + 2 * 4 * 16 + 16 * 16 + 16;
                      const std::size_t n = longest_sum(6, 17, world);
                      const double magnitude =
                          clipped_magnitude({.max_magnitude = 100,
                                             .norm_magnitude = 100 * std::sqrt(double(p)),
                                             .clip = 0.5,
                                             .elements = p,
                                             .longest_sum = n});
                      return reordering_bound(
                          {.lr = 1, .steps = kSteps, .longest_sum = n, .magnitude = magnitude});
                    }};
  check_program(shape);
}

TEST_CASE("transfer learning: a frozen TorchScript backbone and a trained nn head (Adam)") {
  if (gloo_missing()) return;
  const Shape shape{"transfer",
                    7,
                    {},
                    [](int world) {
                      // Adam lr 0.01 (fp64: tolerance.hpp's Adam bound). Only the head
                      // trains: its gradient terms are softmax errors (below 2) times tanh
                      // features (below 1): S below 2; forward inner products of 8 + 1 and 16 + 1.
                      return adam_reordering_bound({.lr = 0.01,
                                                    .steps = kSteps,
                                                    .longest_sum = longest_sum(1, 17, world),
                                                    .magnitude = 2});
                    },
                    /*zero3=*/false};
  check_program(shape);
}

TEST_CASE("a plain module object trained through train(..., torch::optim::Optimizer&)") {
  if (gloo_missing()) return;
  const Shape shape{"plain_object",
                    8,
                    {},
                    [](int world) {
                      // SGD lr 0.2, momentum 0.5. A tanh MLP 10-32-4: terms are softmax errors
                      // (below 2) times tanh outputs (below 1) or, for fc1, times randn inputs
                      // (below 6) and fc2 weights (below 1, 4 of them): well under 100.
                      return reordering_bound({.lr = 0.2,
                                               .momentum = 0.5,
                                               .steps = kSteps,
                                               .longest_sum = longest_sum(1, 33, world),
                                               .magnitude = 100});
                    },
                    /*zero3=*/false};
  check_program(shape);
}

TEST_CASE("a GAN in DCGAN's loop: two models, two Adams, the modules' zero_grad()") {
  if (gloo_missing()) return;
  // 14 lines: the models and optimizers are the user's objects renamed (4 lines), then prepared
  // in one call (C++ cannot rebind a name as Python's `G, D, opt_g, opt_d =
  // accelerator.prepare(G, D, opt_g, opt_d)` does); the noise is the global batch's, drawn
  // alike on every process, and this process's share; the dump reads get_state_dict (2).
  const Shape shape{"gan", 14, {}, [](int world) {
                      // Adam lr 0.01, betas (0.5, 0.999) for both models (fp64). The longest
                      // sum: the discriminator's gradient, two backwards (real, fake) of the
                      // global batch's rows, each averaged over `world` partials (forward inner
                      // products of 16 + 1 terms). Terms: logit errors below 1 times leaky-ReLU
                      // features of randn inputs below 6 through 10 weights below 0.6: below 40
                      // per backward. The generator's output gradient: errors below 1 through
                      // 16 discriminator paths (weights below 0.6): below 6; times ReLU features
                      // (4 randn inputs below 6, weights below 0.8: below 20) for fc2, or
                      // through 10 fc2 weights below 0.5 times noise below 6 for fc1: below
                      // 180. S below 200 either way.
                      return adam_reordering_bound({.lr = 0.01,
                                                    .beta1 = 0.5,
                                                    .steps = kSteps,
                                                    .longest_sum = longest_sum(2, 17, 2 * world),
                                                    .magnitude = 200});
                    }};
  check_changed_lines(shape);
  for (const std::string set_to_none : {"0", "1"}) {  // the modules' zero_grad(set_to_none)
    CAPTURE(set_to_none);
    Shape reset = shape;
    reset.args = {"--set_to_none", set_to_none};
    check_equivalence(reset);
  }
  // A GAN's losses need not fall; under bf16 the numbers differ from fp32 and stay finite.
  const auto args = std::vector<std::string>{"--dtype", "float",
                                             "--steps", std::to_string(kSteps),
                                             "--batch", std::to_string(kGlobalBatch)};
  const Run fp32 = run("program_gan_plain", 1, args);
  const Run bf16 = run("program_gan", 1, args, {{"ACCEL_MIXED_PRECISION", "bf16"}});
  CHECK(bf16.parameters != fp32.parameters);
  REQUIRE(bf16.losses.size() == std::size_t(kSteps));
  for (double loss : bf16.losses) CHECK(std::isfinite(loss));
}

TEST_CASE("early stopping on each process's own loss: set_trigger / check_trigger") {
  if (gloo_missing()) return;
  constexpr int kMaxSteps = 48;
  // 10 lines: the condition is set where the plain program decided and checked on its own line;
  // the dump reads get_state_dict.
  const Shape shape{"early_stop", 10, {}, [](int world) {
                      // SGD lr 0.5, plain_object's tanh MLP and argument: well under 100.
                      return reordering_bound({.lr = 0.5,
                                               .steps = kMaxSteps,
                                               .longest_sum = longest_sum(1, 33, world),
                                               .magnitude = 100});
                    }};
  check_changed_lines(shape);
  const std::vector<std::string> args = {"--dtype", "double", "--steps", std::to_string(kMaxSteps)};
  const auto global = with(args, {"--batch", std::to_string(kGlobalBatch)});
  const Run plain = run("program_early_stop_plain", 1, global);
  const Run one = run("program_early_stop", 1, global);
  CHECK(one.parameters == plain.parameters);
  CHECK(one.losses == plain.losses);
  CHECK(plain.losses.size() < std::size_t(kMaxSteps));  // it stopped early
  struct Strategy {
    std::string name;
    int world;
    std::vector<std::pair<std::string, std::string>> env;
  };
  for (const Strategy& s :
       {Strategy{"DDP", 2, {}}, Strategy{"DDP", 4, {}}, Strategy{"ZeRO-1", 2, zero_env(1)},
        Strategy{"ZeRO-2", 2, zero_env(2)}, Strategy{"ZeRO-3", 2, zero3_env()}}) {
    CAPTURE(s.name);
    CAPTURE(s.world);
    const Run r = run("program_early_stop", s.world,
                      with(args, {"--batch", std::to_string(kGlobalBatch / s.world)}), s.env);
    // Every process stopped after the same step: the first at which some process's own loss
    // was below the target (0.3, the program's default).
    std::size_t first_below = kMaxSteps;
    for (const std::string& output : r.outputs) {
      const auto losses = losses_in(output);
      CHECK(losses.size() == r.losses.size());
      for (std::size_t i = 0; i < losses.size(); ++i)
        if (losses[i] < 0.3) first_below = std::min(first_below, i);
      CHECK(output.find("stopped after " + std::to_string(r.losses.size()) + " steps") !=
            std::string::npos);
    }
    CHECK(first_below + 1 == r.losses.size());
    CHECK(r.losses.size() < std::size_t(kMaxSteps));
    // The training itself: the plain program for as many steps, on the global batch (the
    // processes' own losses decided when to stop, so one process would have stopped elsewhere).
    const Run reference = run("program_early_stop_plain", 1,
                              {"--dtype", "double", "--steps", std::to_string(r.losses.size()),
                               "--batch", std::to_string(kGlobalBatch), "--target", "-1"});
    const double d = max_difference(r.parameters, reference.parameters),
                 limit = shape.bound(s.world);
    MESSAGE("early_stop " << s.name << " at " << s.world << ": stopped after " << r.losses.size()
                          << " steps; max |diff| " << d << " (limit " << limit << ")");
    CHECK(d <= limit);
  }
  Shape never = shape;
  never.args = {"--target", "-1"};
  check_bf16(never);
}
