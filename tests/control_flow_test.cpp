// Control flow across ranks (issue 15, points 10-12), over real processes where it matters
// (control_flow_worker does the rank's part): set_seed seeds LibTorch on every rank as
// torch::manual_seed does in a plain process; set_trigger / check_trigger end every rank's loop
// at the same step over gloo and shm; a rank that breaks alone ends the job with an error
// naming it; acc.print's printf and streaming forms, and on_(local_)main_process, over 4 ranks
// as 2 machines.

#include <cstdio>
#include <regex>
#include <set>
#include <string>

#include <torch/torch.h>
// LibTorch's logging header defines a CHECK of its own (fatal, uncounted); doctest's is meant.
#undef CHECK
#include <doctest/doctest.h>

#include "accelerate/print.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

// What a plain process draws after torch::manual_seed(seed), as the worker prints it.
std::string plain_draws(std::uint64_t seed) {
  torch::manual_seed(seed);
  const torch::Tensor draws = torch::randn({6}, torch::kDouble);
  std::string out = "draws:";
  char value[64];
  for (std::int64_t i = 0; i < draws.numel(); ++i) {
    std::snprintf(value, sizeof value, " %a", draws[i].item<double>());
    out += value;
  }
  return out;
}

// The line of `output` that starts with `prefix` ("" when none).
std::string line_of(const std::string& output, const std::string& prefix) {
  std::size_t at = output.rfind("\n" + prefix);
  at = output.compare(0, prefix.size(), prefix) == 0 ? 0 : at == std::string::npos ? at : at + 1;
  if (at == std::string::npos) return "";
  return output.substr(at, output.find('\n', at) - at);
}

// What print_to writes for these arguments.
template <typename... Args>
std::string printed(const Args&... args) {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  print_detail::print_to(f, args...);
  std::rewind(f);
  std::string out;
  char buffer[256];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) out.append(buffer, n);
  std::fclose(f);
  return out;
}

AcceleratorOptions local() {
  AcceleratorOptions options;
  options.communicator = "local";
  return options;
}

}  // namespace

TEST_CASE("set_seed seeds LibTorch as torch::manual_seed does, in the world of one") {
  TorchAccelerator acc(local());
  torch::manual_seed(12345);  // somewhere else entirely
  acc.set_seed(7);
  const torch::Tensor a = torch::randn({6}, torch::kDouble);
  torch::manual_seed(7);
  CHECK(torch::equal(a, torch::randn({6}, torch::kDouble)));
  acc.set_seed(7, /*device_specific=*/true);  // seed + process_index 0
  const torch::Tensor b = torch::randn({6}, torch::kDouble);
  CHECK(torch::equal(a, b));
  CHECK(acc.seed() == 7);
}

TEST_CASE("set_seed over 2 ranks: rank 0's seed, LibTorch's draws as a plain process's") {
  const auto draws_of = [](const launch::GroupResult& r, int rank) {
    return line_of(r.workers[std::size_t(rank)].output, "draws:");
  };
  SUBCASE("the same seed everywhere, and rank 0's when rank 1 asks for another") {
    for (const std::vector<std::string> args : {std::vector<std::string>{"seed", "--seed", "7"},
                                                {"seed", "--seed", "7", "--seed_on_rank1", "99"}}) {
      const auto r = run_ranks(2, "control_flow_worker", args);
      INFO(describe(r));
      REQUIRE(r.exit_code() == 0);
      CHECK(draws_of(r, 0) == plain_draws(7));
      CHECK(draws_of(r, 1) == plain_draws(7));
      CHECK(line_of(r.workers[1].output, "seed:") == "seed: 7");
    }
  }
  SUBCASE("device_specific: seed + process_index on each rank") {
    const auto r =
        run_ranks(2, "control_flow_worker", {"seed", "--seed", "7", "--device_specific"});
    INFO(describe(r));
    REQUIRE(r.exit_code() == 0);
    CHECK(draws_of(r, 0) == plain_draws(7));
    CHECK(draws_of(r, 1) == plain_draws(8));
    CHECK(draws_of(r, 0) != draws_of(r, 1));
    CHECK(line_of(r.workers[1].output, "seed:") == "seed: 7");  // the shared seed
  }
}

TEST_CASE("check_trigger: a stop only rank 1 sees ends every rank's loop at the same step") {
  for (const std::string backend : {"gloo", "shm"}) {
    CAPTURE(backend);
    RanksOptions options;
    options.env = {{"ACCEL_COMM_BACKEND", backend}};
    const auto r = run_ranks(2, "control_flow_worker", {"early_stop"}, options);
    INFO(describe(r));
    REQUIRE(r.exit_code() == 0);
    const std::string& rank0 = r.workers[0].output;
    const std::string& rank1 = r.workers[1].output;
    // Rank 1 saw the condition at some step S (a real early stop: S > 0, well before the end),
    // rank 0 never did; both left at S.
    const std::string seen = line_of(rank1, "rank 1: the stop condition held at step ");
    REQUIRE(!seen.empty());
    const std::string step = seen.substr(seen.rfind(' ') + 1);
    CAPTURE(step);
    CHECK(std::stoi(step) > 0);
    CHECK(std::stoi(step) < 300);
    CHECK(line_of(rank0, "rank 0: the stop condition held").empty());
    CHECK(line_of(rank0, "rank 0: left the loop") == "rank 0: left the loop at step " + step);
    CHECK(line_of(rank1, "rank 1: left the loop") == "rank 1: left the loop at step " + step);
    // The trigger was cleared on every rank.
    CHECK(line_of(rank0, "rank 0: check_trigger") == "rank 0: check_trigger after the loop: false");
    CHECK(line_of(rank1, "rank 1: check_trigger") == "rank 1: check_trigger after the loop: false");
  }
}

// What a plain loop does: rank 1 breaks on its own condition while rank 0 trains on into its
// next gradient all-reduce. The job must end on every rank with an error, within the
// communicator's timeout (2 s here), never hang.
launch::GroupResult break_alone(const std::string& backend, const std::string& after_loop) {
  RanksOptions options;
  options.env = {{"ACCEL_COMM_BACKEND", backend}};
  options.timeout = std::chrono::seconds(60);  // anti-hang only: the job ends long before
  return run_ranks(
      2, "control_flow_worker",
      {"early_stop", "--break_alone", "--after_loop", after_loop, "--timeout_ms", "2000"}, options);
}

TEST_CASE("a rank that breaks alone ends the job with an error naming it") {
  for (const std::string backend : {"gloo", "shm"}) {
    CAPTURE(backend);
    {  // it works on without collectives (an evaluation, a save): the timeout names it
      const auto r = break_alone(backend, "work");
      INFO(describe(r));
      CHECK(r.exit_code() != 0);
      REQUIRE(r.workers.size() == 2);
      CHECK(r.workers[0].exit_code == 1);
      CHECK(!line_of(r.workers[1].output, "rank 1: left the loop at step").empty());
      const std::string error = line_of(r.workers[0].output, "error:");
      CHECK(error.find("rank 0: all_reduce") != std::string::npos);
      CHECK(error.find("timed out after 2000 ms; ranks not heard from: [1]") != std::string::npos);
      CHECK(r.workers[1].signal != 0);  // still working: stopped by the group, as accel launch does
    }
    {  // it exits: the others fail at once
      const auto r = break_alone(backend, "exit");
      INFO(describe(r));
      CHECK(r.exit_code() != 0);
      REQUIRE(r.workers.size() == 2);
      CHECK(r.workers[1].exit_code == 0);
      CHECK(r.workers[0].exit_code == 1);
      const std::string error = line_of(r.workers[0].output, "error:");
      CHECK(error.find("rank 0: all_reduce") != std::string::npos);
      // shm names the rank that left; gloo only sees a peer's socket close or reset (its
      // address, not its rank), and the job still ends at once.
      if (backend == "shm") CHECK(error.find("rank 1 (pid") != std::string::npos);
    }
  }
}

TEST_CASE("set_trigger / check_trigger in the world of one") {
  Accelerator acc(local());
  CHECK_FALSE(acc.check_trigger());
  acc.set_trigger();
  acc.set_trigger();  // twice is once
  CHECK(acc.check_trigger());
  CHECK_FALSE(acc.check_trigger());  // cleared by the call that returned true
}

TEST_CASE("print: the printf form for a format that reads the arguments, else streaming") {
  // printf, as the examples call it.
  CHECK(printed("step %d loss %.3f\n", 3, 0.25) == "step 3 loss 0.250\n");
  CHECK(printed("%zu images, %llu steps, strategy %s\n", std::size_t(60000),
                static_cast<unsigned long long>(12),
                "ddp") == "60000 images, 12 steps, strategy ddp\n");
  CHECK(printed("%*d|%-5.2f|%c\n", 4, 7, 1.5f, 'x') == "   7|1.50 |x\n");
  CHECK(printed("100%%\n") == "100%\n");
  // Streaming: each argument with <<, then a newline unless the text ends with one.
  CHECK(printed("loss ", 0.25, " at ", 3) == "loss 0.25 at 3\n");
  CHECK(printed(std::string("step "), 4) == "step 4\n");
  CHECK(printed("done") == "done\n");
  CHECK(printed("done\n") == "done\n");
  // A '%' whose conversions do not read exactly these arguments never reaches printf.
  CHECK(printed("100% of ", 4, " ranks") == "100% of 4 ranks\n");          // "% o" + 2 arguments
  CHECK(printed("step %d loss ", 3, " ", 0.5) == "step %d loss 3 0.5\n");  // 1 conversion, 3
  CHECK(printed("%d items\n", std::int64_t(5)) == "%d items\n5\n");        // %d reads an int
  CHECK(printed("%s\n", std::string("text")) == "%s\ntext\n");             // a class: streamed
  CHECK(printed("%n\n", 1) == "%n\n1\n");
}

TEST_CASE("print and on_(local_)main_process over 4 ranks on 2 machines") {
  RanksOptions options;
  options.env = {{"ACCEL_COMM_BACKEND", "gloo"}};
  options.nodes = 2;  // ranks 0, 1 on machine 0; 2, 3 on machine 1
  const auto r = run_ranks(4, "control_flow_worker", {"print"}, options);
  INFO(describe(r));
  REQUIRE(r.exit_code() == 0);
  CHECK(r.workers[0].output ==
        "printf form: step 3 loss 0.250\n"
        "streaming form: loss 0.25 at step 3\n"
        "a std::string, then 42 -1.5\n"
        "ends its own line\n"
        "on_main_process ran on rank 0\n"
        "on_local_main_process ran on rank 0\n"
        "mean loss 2.5\n"  // (1 + 2 + 3 + 4) / 4: reduced on every rank, printed on one
        "mean loss tensor 2.5\n");
  CHECK(r.workers[1].output.empty());
  CHECK(r.workers[2].output == "on_local_main_process ran on rank 2\n");
  CHECK(r.workers[3].output.empty());
}

TEST_CASE("a second accelerator in one process is refused at construction, naming the fix") {
  for (const char* backend : {"gloo", "shm"}) {
    CAPTURE(backend);
    RanksOptions options;
    options.env = {{"ACCEL_COMM_BACKEND", backend}};
    const auto r = run_ranks(2, "control_flow_worker", {"second_accelerator"}, options);
    INFO(describe(r));
    REQUIRE(r.exit_code() == 0);
    for (const auto& w : r.workers) {
      CHECK(w.output.find("refused: rank ") != std::string::npos);
      CHECK(w.output.find("one Accelerator per process") != std::string::npos);
      CHECK_VERDICT(Verdicts(w.output), "the first accelerator still works");
    }
  }
}
