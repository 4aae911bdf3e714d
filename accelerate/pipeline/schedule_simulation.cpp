#include "accelerate/pipeline/schedule_simulation.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace accel::pipeline {
namespace {

bool is_send(ActionKind k) {
  return k == ActionKind::send_activation || k == ActionKind::send_gradient;
}

// The receive that takes a send of this kind, and the other way round.
ActionKind other_end(ActionKind k) {
  switch (k) {
    case ActionKind::send_activation:
      return ActionKind::recv_activation;
    case ActionKind::recv_activation:
      return ActionKind::send_activation;
    case ActionKind::send_gradient:
      return ActionKind::recv_gradient;
    case ActionKind::recv_gradient:
      return ActionKind::send_gradient;
    default:
      return k;
  }
}

double duration(ActionKind k, const ActionTimes& t) {
  switch (k) {
    case ActionKind::forward:
      return t.forward;
    case ActionKind::backward:
      return t.backward;
    case ActionKind::backward_input:
      return t.backward_input;
    case ActionKind::backward_weight:
      return t.backward_weight;
    default:
      return 0;
  }
}

// What one stage has run of each (micro-batch, chunk): the order a pipeline needs.
class PieceLedger {
 public:
  PieceLedger(int stage, const PipelineShape& shape) : stage_(stage), shape_(shape) {}

  void record(const Action& a, std::vector<std::string>& problems, int& held) {
    Piece& p = pieces_[{a.microbatch, a.chunk}];
    const auto problem = [&](const std::string& what) {
      problems.push_back("stage " + std::to_string(stage_) + ": " + describe(a) + " " + what);
    };
    if (a.microbatch < 0 || a.microbatch >= shape_.microbatches || a.chunk < 0 ||
        a.chunk >= shape_.chunks)
      return problem("is outside the shape");
    switch (a.kind) {
      case ActionKind::forward:
        if (p.forward) return problem("runs twice");
        p.forward = true;
        ++held;
        return;
      case ActionKind::backward:
      case ActionKind::backward_input:
        if (!p.forward) return problem("before its F");
        if (p.backward) return problem("runs twice");
        p.backward = true;
        p.split = a.kind == ActionKind::backward_input;
        if (!p.split) --held;
        return;
      case ActionKind::backward_weight:
        if (!p.backward || !p.split) return problem("before its BI");
        if (p.weight) return problem("runs twice");
        p.weight = true;
        --held;
        return;
      default:
        return;
    }
  }

  void check_complete(std::vector<std::string>& problems) const {
    for (int m = 0; m < shape_.microbatches; ++m)
      for (int c = 0; c < shape_.chunks; ++c) {
        const auto it = pieces_.find({m, c});
        const bool done = it != pieces_.end() && it->second.forward && it->second.backward &&
                          (!it->second.split || it->second.weight);
        if (!done)
          problems.push_back("stage " + std::to_string(stage_) + ": mb " + std::to_string(m) +
                             " chunk " + std::to_string(c) +
                             " does not run its forward and backward");
      }
  }

 private:
  struct Piece {
    bool forward = false, backward = false, split = false, weight = false;
  };
  int stage_;
  PipelineShape shape_;
  std::map<std::pair<int, int>, Piece> pieces_;
};

struct StageCursor {
  std::size_t pos = 0;
  double time = 0;
  std::vector<bool> done;      // per action: a message met its other end
  std::vector<double> met_at;  // when it did
};

// The end (one past) of the group of communication actions starting at `begin`.
std::size_t group_end(const std::vector<Action>& list, std::size_t begin) {
  std::size_t end = begin;
  while (end < list.size() && is_communication(list[end].kind)) ++end;
  return end;
}

}  // namespace

double SimulationResult::idle_fraction() const {
  if (stages.empty() || makespan <= 0) return 0;
  double idle = 0;
  for (const StageOutcome& s : stages) idle += makespan - s.busy;
  return idle / (double(stages.size()) * makespan);
}

SimulationResult simulate(const std::vector<std::vector<Action>>& lists, const PipelineShape& shape,
                          const ActionTimes& times, MessageModel model) {
  const std::size_t p = lists.size();
  SimulationResult result;
  result.stages.resize(p);
  std::vector<StageCursor> cursor(p);
  std::vector<PieceLedger> ledgers;
  std::vector<int> held(p, 0);
  for (std::size_t s = 0; s < p; ++s) {
    cursor[s].done.assign(lists[s].size(), false);
    cursor[s].met_at.assign(lists[s].size(), 0);
    ledgers.emplace_back(int(s), shape);
  }
  // eager: the sends issued and not yet received, by (from, to, kind, tag): when.
  std::map<std::tuple<std::size_t, std::size_t, ActionKind, std::uint32_t>, double> in_flight;
  const auto at_group = [&](std::size_t s) {
    return cursor[s].pos < lists[s].size() && is_communication(lists[s][cursor[s].pos].kind);
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < p; ++s) {
      StageCursor& c = cursor[s];
      const std::vector<Action>& list = lists[s];
      while (c.pos < list.size() && !is_communication(list[c.pos].kind)) {
        const Action& a = list[c.pos];
        ledgers[s].record(a, result.problems, held[s]);
        result.stages[s].peak_held = std::max(result.stages[s].peak_held, held[s]);
        c.time += duration(a.kind, times);
        result.stages[s].busy += duration(a.kind, times);
        ++c.pos;
        progress = true;
      }
      if (!at_group(s)) continue;
      // Meet each open message of this group with its other end in the peer's group.
      const std::size_t end = group_end(list, c.pos);
      for (std::size_t i = c.pos; i < end; ++i) {
        const Action& a = list[i];
        if (c.done[i]) continue;
        if (a.peer < 0 || std::size_t(a.peer) >= p || std::size_t(a.peer) == s) {
          result.problems.push_back("stage " + std::to_string(s) + ": " + describe(a) +
                                    " names no other stage");
          c.done[i] = true;
          continue;
        }
        const auto q = std::size_t(a.peer);
        if (model == MessageModel::eager) {
          if (is_send(a.kind)) {
            in_flight[{s, q, a.kind, a.tag}] = c.time;
            c.done[i] = true;
            c.met_at[i] = c.time;
          } else if (const auto sent = in_flight.find({q, s, other_end(a.kind), a.tag});
                     sent != in_flight.end()) {
            c.done[i] = true;
            c.met_at[i] = std::max(c.time, sent->second);
            in_flight.erase(sent);
          }
          continue;
        }
        if (!at_group(q)) continue;
        StageCursor& peer = cursor[q];
        const std::size_t peer_end = group_end(lists[q], peer.pos);
        for (std::size_t j = peer.pos; j < peer_end; ++j) {
          const Action& b = lists[q][j];
          if (peer.done[j] || b.kind != other_end(a.kind) || b.peer != int(s) || b.tag != a.tag)
            continue;
          const double met = std::max(c.time, peer.time);
          c.done[i] = peer.done[j] = true;
          c.met_at[i] = peer.met_at[j] = met;
          break;
        }
      }
      bool all = true;
      double finished = c.time;
      for (std::size_t i = c.pos; i < end; ++i) {
        all = all && c.done[i];
        finished = std::max(finished, c.met_at[i]);
      }
      if (all) {
        c.time = finished;
        c.pos = end;
        progress = true;
      }
    }
  }
  for (std::size_t s = 0; s < p; ++s) {
    const StageCursor& c = cursor[s];
    result.stages[s].finish = c.time;
    result.makespan = std::max(result.makespan, c.time);
    if (c.pos < lists[s].size()) {
      std::string waits;
      for (std::size_t i = c.pos; i < group_end(lists[s], c.pos); ++i)
        if (!c.done[i]) waits += (waits.empty() ? "" : ", ") + describe(lists[s][i]);
      result.deadlock += (result.deadlock.empty() ? "" : "; ") + std::string("stage ") +
                         std::to_string(s) + " waits at action " + std::to_string(c.pos) + " for " +
                         waits;
    } else {
      ledgers[s].check_complete(result.problems);
    }
  }
  return result;
}

}  // namespace accel::pipeline
