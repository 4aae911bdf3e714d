// Pipeline parallelism over real processes (pipeline_worker does the rank's part): a LibTorch
// MLP split into stages trains to the parameters one process gets on the same global batch
// (fp64, within tests/support/tolerance.hpp's first-order bound), under every schedule, at 2
// and 4 stages, with one micro-batch and fewer micro-batches than stages, uneven pieces, and
// pipelines of 2 stages x 2 data-parallel replicas; a batch of another shape each step; and
// the failures: a layer that raises, a stage killed mid-schedule, a target of other rows.

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>

#include <string>
#include <utility>
#include <vector>

#include "tests/support/ranks.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

// A failure injected into one stage: every rank stops (none waits for the job's limit; the
// communicators' own timeout is far beyond it, so only noticing the failure passes) and each
// survivor's error names the stage it lost and the job's first failure.
// Stage 1 fails (`how`: raise, kill, rows) at step `step` of a pipeline of `stages` stages.
launch::GroupResult run_failing(int stages, int microbatches, int step, const std::string& how) {
  const std::vector<std::string> args = {"--stages",       std::to_string(stages),
                                         "--microbatches", std::to_string(microbatches),
                                         "--fail_stage",   "1",
                                         "--fail_step",    std::to_string(step),
                                         "--fail_how",     how};
  RanksOptions options;
  options.stop_on_failure = false;  // let the survivors report
  options.env = {{"ACCEL_COMM_TIMEOUT", "600"}};
  options.timeout = std::chrono::seconds(120);
  return run_ranks(stages, "pipeline_worker", args, options);
}

void check_pipeline(int world, const std::vector<std::string>& args) {
  const auto result = run_ranks(world, "pipeline_worker", args);
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  const Verdicts verdicts(result);
  CHECK_VERDICT(verdicts, "the pieces cover the model", world);
  CHECK_VERDICT(verdicts, "the first loss is one process's", world);
  CHECK_VERDICT(verdicts, "pipeline training equals one process", world);
}

}  // namespace

TEST_CASE("2 stages: every schedule equals one process") {
  for (const char* schedule : {"GPIPE", "1F1B", "ZERO_BUBBLE"}) {
    CAPTURE(schedule);
    check_pipeline(2, {"--stages", "2", "--microbatches", "4", "--schedule", schedule});
  }
  // Two chunks per stage: pieces 0 and 2 on stage 0, 1 and 3 on stage 1.
  check_pipeline(2, {"--stages", "2", "--microbatches", "4", "--schedule", "INTERLEAVED_1F1B",
                     "--chunks", "2"});
}

TEST_CASE("2 stages: one micro-batch, uneven pieces by name, uniform pieces") {
  check_pipeline(2, {"--stages", "2", "--microbatches", "1"});
  // 9 children: Linear Tanh ... Linear; the second stage from child 6 on (6 + 3 children).
  check_pipeline(2, {"--stages", "2", "--microbatches", "3", "--split", "6"});
  check_pipeline(2, {"--stages", "2", "--microbatches", "2", "--split", "uniform"});
}

TEST_CASE("4 stages: 1F1B with M > P and M < P, and ZERO_BUBBLE") {
  check_pipeline(4, {"--stages", "4", "--microbatches", "8"});
  check_pipeline(4, {"--stages", "4", "--microbatches", "2"});
  check_pipeline(4, {"--stages", "4", "--microbatches", "4", "--schedule", "ZERO_BUBBLE"});
}

TEST_CASE("2 stages x 2 replicas: each stage's replicas average, equal to one process") {
  check_pipeline(4, {"--stages", "2", "--microbatches", "4"});
  check_pipeline(4, {"--stages", "2", "--microbatches", "2", "--schedule", "ZERO_BUBBLE"});
}

TEST_CASE("a world that is not a multiple of the stages is refused, naming both") {
  const auto result = run_ranks(3, "pipeline_worker", {"--stages", "2", "--microbatches", "2"});
  CHECK(result.exit_code() == 2);
  CHECK(describe(result).find("pipeline: 3 processes are not a multiple of "
                              "pipeline_parallel_size 2") != std::string::npos);
}

TEST_CASE("each step's batch may have other rows: the activation shape travels again") {
  check_pipeline(2, {"--stages", "2", "--microbatches", "2", "--vary_rows", "--steps", "3"});
  check_pipeline(4, {"--stages", "4", "--microbatches", "4", "--vary_rows", "--steps", "3",
                     "--schedule", "ZERO_BUBBLE"});
}

TEST_CASE("a layer that raises on one stage stops every rank, each naming it") {
  for (int stages : {2, 4}) {
    CAPTURE(stages);
    const auto result = run_failing(stages, 4, 1, "raise");
    INFO(describe(result));
    REQUIRE_FALSE(result.timed_out);
    for (int r = 0; r < stages; ++r) {
      CAPTURE(r);
      const auto& w = result.workers.at(r);
      CHECK(w.exit_code == 2);
      // The rank that raised throws its own exception; every other quotes it.
      CHECK(w.output.find("a layer raised on purpose") != std::string::npos);
      if (r != 1)
        CHECK(w.output.find(" failed; the job's first failure: pipeline stage 1 (rank 1), step 1: "
                            "a layer raised on purpose") != std::string::npos);
    }
  }
}

TEST_CASE("a stage killed mid-schedule stops every other rank, each naming who it lost") {
  for (int stages : {2, 4}) {
    CAPTURE(stages);
    const auto result = run_failing(stages, 4, 1, "kill");
    INFO(describe(result));
    REQUIRE_FALSE(result.timed_out);
    CHECK(result.workers.at(1).signal == SIGKILL);
    for (int r = 0; r < stages; ++r) {
      if (r == 1) continue;
      CAPTURE(r);
      const auto& w = result.workers.at(r);
      CHECK(w.exit_code == 2);
      // Its neighbours lost stage 1; the stages beyond them lost a neighbour that said so.
      CHECK(w.output.find("stage 1 (rank 1) failed") != std::string::npos);
    }
  }
}

TEST_CASE("a last stage whose target has other rows than the first stage's input is refused") {
  const auto result = run_failing(2, 2, 0, "rows");
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.workers.at(1).exit_code == 2);
  CHECK(result.workers.at(0).exit_code == 2);
  CHECK(describe(result).find("pipeline stage 1 (rank 1): the activation from stage 0 (rank 0) "
                              "has 2 rows per micro-batch, this stage's target 1") !=
        std::string::npos);
}

TEST_CASE("accel launch's pipeline flags build the pipeline the loop asks the config for") {
  // 2 stages x 2 replicas, ZERO_BUBBLE over 4 micro-batches, from the command line alone.
  const auto result = run_accel({"launch", "-q", "--num_processes", "4", "--main_process_port", "0",
                                 "--pipeline_parallel_size", "2", "--num_microbatches", "4",
                                 "--pipeline_schedule", "ZERO_BUBBLE", "--partition_method",
                                 "uniform", bin_path("pipeline_worker"), "--from_config"},
                                {}, std::chrono::seconds(120));
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  const Verdicts verdicts(result);
  CHECK_VERDICT(verdicts, "the pieces cover the model", 4);
  CHECK_VERDICT(verdicts, "pipeline training equals one process", 4);
  CHECK(count_in_output(result, "stage 1 of 2, replica 1 of 2") == 1);

  // A stage count that does not divide the processes: refused before any worker starts.
  const auto refused =
      run_accel({"launch", "-q", "--num_processes", "4", "--main_process_port", "0",
                 "--pipeline_parallel_size", "3", bin_path("pipeline_worker"), "--from_config"});
  CHECK(refused.exit_code() != 0);
  CHECK(describe(refused).find("num_processes 4 is not a multiple of pipeline_parallel_size 3") !=
        std::string::npos);
  CHECK(describe(refused).find("--pipeline_parallel_size") != std::string::npos);
}

TEST_CASE("gradient clipping takes one norm over every stage (and replica)") {
  // 0.05 is below every step's norm here: each step clips (the verdict checks the last did).
  for (const auto& [world, schedule] :
       std::vector<std::pair<int, std::string>>{{2, "1F1B"}, {4, "ZERO_BUBBLE"}}) {
    CAPTURE(world);
    const auto result = run_ranks(world, "pipeline_worker",
                                  {"--stages", "2", "--microbatches", "4", "--schedule", schedule,
                                   "--max_grad_norm", "0.05"});
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    const Verdicts verdicts(result);
    CHECK_VERDICT(verdicts, "pipeline training equals one process", world);
    CHECK_VERDICT(verdicts, "the gradient norm is one process's", world);
  }
}

TEST_CASE("LayerSpecs: each stage builds only its layers and trains as one process") {
  for (const char* split : {"uniform", "parameters"}) {
    CAPTURE(split);
    const auto result =
        run_ranks(4, "pipeline_worker",
                  {"--stages", "4", "--microbatches", "4", "--layer_specs", "--split", split});
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    const Verdicts verdicts(result);
    CHECK_VERDICT(verdicts, "a stage builds only its own layers", 4);
    CHECK_VERDICT(verdicts, "the pieces cover the model", 4);
    CHECK_VERDICT(verdicts, "pipeline training equals one process", 4);
  }
}

TEST_CASE("partition_method profile balances measured time: a slow layer gets a stage alone") {
  // By parameters the slow layer (no parameters) would share stage 0 with half the Linears.
  {
    const auto result =
        run_ranks(2, "pipeline_worker",
                  {"--stages", "2", "--microbatches", "2", "--slow_first", "--split", "profile"});
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    const Verdicts verdicts(result);
    CHECK_VERDICT(verdicts, "the profile split puts the slow layer alone", 2);
    CHECK_VERDICT(verdicts, "pipeline training equals one process", 2);
  }
  // LayerSpecs are timed too: each built once to be timed, then only on its stage.
  const auto result =
      run_ranks(2, "pipeline_worker",
                {"--stages", "2", "--microbatches", "2", "--layer_specs", "--split", "profile"});
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  const Verdicts verdicts(result);
  CHECK_VERDICT(verdicts, "a stage builds only its own layers", 2);
  CHECK_VERDICT(verdicts, "pipeline training equals one process", 2);
}
