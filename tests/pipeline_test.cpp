// Pipeline parallelism over real processes (pipeline_worker does the rank's part): a LibTorch
// MLP split into stages trains to the parameters one process gets on the same global batch
// (fp64, within tests/support/tolerance.hpp's first-order bound), under every schedule, at 2
// and 4 stages, with one micro-batch and fewer micro-batches than stages, uneven pieces, and
// pipelines of 2 stages x 2 data-parallel replicas.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/support/ranks.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

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
