#pragma once
// Every stage's action list played together against a model of point-to-point messages: a
// stage runs its actions in order; a compute action takes its time; a group of communication
// actions (consecutive ones, issued together: schedule.hpp) completes when each of its messages
// has completed. Two models of a message:
//   rendezvous: blocking; a send completes when its receive is posted in the peer's current
//               group, both at the later of the two posting times. What a list must survive:
//               one free of deadlock here is free of it under any buffering.
//   eager:      a send completes when posted (the runtime's sends are asynchronous, waited for
//               before their buffer is reused); its receive at the later of the send's and its
//               own posting. What a schedule's timing is measured under. What it finds: a deadlock
//               (naming every stage and what it waits for), an
// order a pipeline cannot run (a backward before its forward, an action twice or missing), each
// stage's busy time, finish time and peak of held activations, and the idle fraction.
//
// The runtime checks a schedule with it before running it; the tests check every schedule.

#include <string>
#include <vector>

#include "accelerate/pipeline/schedule.hpp"

namespace accel::pipeline {

// The time each compute action takes (any unit). Messages take none: the model finds the
// schedule's own waits, not the network's.
struct ActionTimes {
  double forward = 1;
  double backward = 2;         // a whole backward
  double backward_input = 1;   // ZERO_BUBBLE's B
  double backward_weight = 1;  // ZERO_BUBBLE's W
};

enum class MessageModel { rendezvous, eager };

struct StageOutcome {
  double busy = 0;    // time spent computing
  double finish = 0;  // when its last action completed
  // The most micro-batch pieces whose forward ran and whose backward (W under ZERO_BUBBLE)
  // has not: the activations the stage holds at its peak.
  int peak_held = 0;
};

struct SimulationResult {
  // Empty when every stage ran its list to the end.
  std::string deadlock;
  // Orders a pipeline cannot run, one line each ("stage 1: B mb 2 chunk 0 before its F").
  std::vector<std::string> problems;
  std::vector<StageOutcome> stages;
  double makespan = 0;  // the last stage's finish
  bool ok() const { return deadlock.empty() && problems.empty(); }
  // The share of stage-time spent waiting: sum over stages of (makespan - busy), over
  // stages x makespan.
  double idle_fraction() const;
};

SimulationResult simulate(const std::vector<std::vector<Action>>& stages,
                          const PipelineShape& shape, const ActionTimes& times = {},
                          MessageModel model = MessageModel::rendezvous);

}  // namespace accel::pipeline
