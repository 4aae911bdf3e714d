// Pipeline schedules as pure functions: every stage's list played together against blocking
// point-to-point messages (schedule_simulation.hpp) runs to the end without a deadlock, runs
// each micro-batch's forward before its backward once on every chunk, holds no more
// activations than the schedule promises, and idles the share its formula says.
//
// Times are small integers (F 1, B 2; BI = W = 1), so every simulated time is an exact sum of
// integers in a double: the idle fractions are compared with the formula's value to a few
// units in the last place of the division alone.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "accelerate/pipeline/schedule.hpp"
#include "accelerate/pipeline/schedule_simulation.hpp"
#include "foundation/error.hpp"

using namespace accel;
using namespace accel::pipeline;

namespace {

// Two divisions of exact integers: each rounds once.
constexpr double kFractionTolerance = 4e-16;

SimulationResult run(Schedule schedule, PipelineShape shape,
                     MessageModel model = MessageModel::rendezvous) {
  const SimulationResult r = simulate(schedule_all(schedule, shape), shape, {}, model);
  INFO(to_string(schedule) << " P " << shape.stages << " V " << shape.chunks << " M "
                           << shape.microbatches << ": " << r.deadlock);
  for (const std::string& p : r.problems) INFO(p);
  CHECK(r.deadlock.empty());
  CHECK(r.problems.empty());
  return r;
}

}  // namespace

TEST_CASE("GPIPE and 1F1B: no deadlock, every piece once in order, idle (P-1)/(M+P-1)") {
  for (Schedule schedule : {Schedule::GPIPE, Schedule::ONE_F_ONE_B})
    for (MessageModel model : {MessageModel::rendezvous, MessageModel::eager})
      for (int p : {1, 2, 3, 4})
        for (int m : {1, 2, 3, 4, 5, 8, 16}) {
          CAPTURE(to_string(schedule));
          CAPTURE(model == MessageModel::eager);
          CAPTURE(p);
          CAPTURE(m);
          const SimulationResult r = run(schedule, {.stages = p, .microbatches = m}, model);
          REQUIRE(r.ok());
          CHECK(r.makespan == double((m + p - 1) * 3));
          CHECK(std::abs(r.idle_fraction() - double(p - 1) / double(m + p - 1)) <=
                kFractionTolerance);
          for (int s = 0; s < p; ++s) {
            CAPTURE(s);
            CHECK(r.stages[std::size_t(s)].busy == double(3 * m));
            // GPipe holds every micro-batch; 1F1B at most P - stage.
            const int promise = schedule == Schedule::GPIPE ? m : std::min(p - s, m);
            CHECK(r.stages[std::size_t(s)].peak_held == promise);
          }
        }
}

TEST_CASE("INTERLEAVED_1F1B: no deadlock, every chunk's pieces, idle (P-1)/(V M + P - 1)") {
  // Asynchronous sends only (schedule.hpp): under blocking ones two neighbours can both send.
  const MessageModel model = MessageModel::eager;
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int groups : {1, 2, 4}) {
        const int m = groups * p;
        CAPTURE(p);
        CAPTURE(v);
        CAPTURE(m);
        // Every chunk's F and B take the times of a whole stage's (F 1, B 2): the stage does
        // V times the work of a 1F1B stage, and its bubble is a V-th as long relative to it.
        const SimulationResult r =
            run(Schedule::INTERLEAVED_1F1B, {.stages = p, .chunks = v, .microbatches = m}, model);
        REQUIRE(r.ok());
        const double idle = r.idle_fraction();
        const double one_f_one_b = double(p - 1) / double(m + p - 1);
        CHECK(idle < one_f_one_b);
        CHECK(std::abs(idle - double(p - 1) / double(v * m + p - 1)) <= kFractionTolerance);
      }
}

TEST_CASE("ZERO_BUBBLE (ZB-H1): no deadlock, W after its BI, 1F1B's memory, less idle than 1F1B") {
  for (int p : {2, 3, 4})
    for (int m : {1, 2, 3, 4, 8, 16}) {
      CAPTURE(p);
      CAPTURE(m);
      // Free of deadlock under blocking sends; timed with asynchronous ones, as it runs (under
      // blocking sends a stage's W would wait for its neighbour's receive).
      REQUIRE(run(Schedule::ZERO_BUBBLE, {.stages = p, .microbatches = m}).ok());
      const SimulationResult r =
          run(Schedule::ZERO_BUBBLE, {.stages = p, .microbatches = m}, MessageModel::eager);
      REQUIRE(r.ok());
      for (int s = 0; s < p; ++s) CHECK(r.stages[std::size_t(s)].peak_held <= std::min(p - s, m));
      // The same work as 1F1B's (B = BI + W), less of the time waiting once M >= P.
      const SimulationResult base =
          run(Schedule::ONE_F_ONE_B, {.stages = p, .microbatches = m}, MessageModel::eager);
      if (m >= p)
        CHECK(r.idle_fraction() < base.idle_fraction());
      else
        CHECK(r.idle_fraction() <= base.idle_fraction());
    }
}

TEST_CASE("the model finds a deadlock and names every stage and what it waits for") {
  // Both stages receive before they send.
  const PipelineShape shape{.stages = 2, .microbatches = 1};
  const std::vector<std::vector<Action>> lists = {
      {{.kind = ActionKind::recv_gradient, .peer = 1, .tag = 1},
       {.kind = ActionKind::send_activation, .peer = 1, .tag = 2}},
      {{.kind = ActionKind::recv_activation, .peer = 0, .tag = 2},
       {.kind = ActionKind::forward},
       {.kind = ActionKind::send_gradient, .peer = 0, .tag = 1}},
  };
  // As one group, stage 0's two messages go out together and nothing waits.
  CHECK(simulate(lists, shape).deadlock.empty());
  std::vector<std::vector<Action>> split = lists;
  split[0].insert(split[0].begin() + 1, Action{.kind = ActionKind::forward});
  const SimulationResult r = simulate(split, shape);
  CHECK(r.deadlock ==
        "stage 0 waits at action 0 for recv_grad mb 0 <- 1 (tag 1); stage 1 waits at action 0 "
        "for recv_act mb 0 <- 0 (tag 2)");
}

TEST_CASE("the model finds a backward before its forward, and a piece never run") {
  const PipelineShape shape{.stages = 1, .microbatches = 2};
  const SimulationResult r = simulate(
      {{{.kind = ActionKind::backward, .microbatch = 0}, {.kind = ActionKind::forward}}}, shape);
  CHECK(r.deadlock.empty());
  REQUIRE(r.problems.size() == 3);
  CHECK(r.problems[0] == "stage 0: B mb 0 chunk 0 before its F");
  CHECK(r.problems[1] == "stage 0: mb 0 chunk 0 does not run its forward and backward");
  CHECK(r.problems[2] == "stage 0: mb 1 chunk 0 does not run its forward and backward");
}

TEST_CASE("shapes a schedule cannot run are refused naming what is wrong") {
  CHECK_THROWS_WITH_AS(schedule_for_stage(Schedule::INTERLEAVED_1F1B,
                                          {.stages = 4, .chunks = 2, .microbatches = 6}, 0),
                       "pipeline_schedule INTERLEAVED_1F1B needs num_microbatches (6) to be a "
                       "multiple of pipeline_parallel_size (4)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(
      schedule_for_stage(Schedule::ONE_F_ONE_B, {.stages = 2, .chunks = 2, .microbatches = 4}, 0),
      "pipeline_chunks 2 needs pipeline_schedule INTERLEAVED_1F1B, not 1F1B", InvalidArgument);
  CHECK_THROWS_WITH_AS(schedule_for_stage(Schedule::GPIPE, {.stages = 2, .microbatches = 0}, 0),
                       "num_microbatches 0 must be at least 1", InvalidArgument);
  CHECK_THROWS_WITH_AS(schedule_for_stage(Schedule::GPIPE, {.stages = 2, .microbatches = 2}, 2),
                       "pipeline stage 2 is not one of 0 .. 1", InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_schedule("1f1b"),
                       "pipeline_schedule '1f1b' is not a schedule (GPIPE, 1F1B, "
                       "INTERLEAVED_1F1B, ZERO_BUBBLE)",
                       InvalidArgument);
  CHECK(parse_schedule("ZERO_BUBBLE") == Schedule::ZERO_BUBBLE);
}
