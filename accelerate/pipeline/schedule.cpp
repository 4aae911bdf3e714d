#include "accelerate/pipeline/schedule.hpp"

#include <algorithm>
#include <deque>

#include "foundation/error.hpp"

namespace accel::pipeline {
namespace {

// A shape or stage the schedules cannot run: the message names the key and the value, as a
// config error does (no source location: it is the user's input).
void refuse_unless(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}

Action compute(ActionKind kind, int microbatch, int chunk) {
  return Action{.kind = kind, .microbatch = microbatch, .chunk = chunk};
}

// ---- the compute order of each schedule (forwards and backwards only)

std::vector<Action> gpipe_order(const PipelineShape& shape) {
  std::vector<Action> out;
  for (int m = 0; m < shape.microbatches; ++m) out.push_back(compute(ActionKind::forward, m, 0));
  for (int m = 0; m < shape.microbatches; ++m) out.push_back(compute(ActionKind::backward, m, 0));
  return out;
}

// PipeDream-flush: P - stage - 1 forwards to fill the pipe, then a forward and a backward in
// turn, then the backwards left. At most P - stage micro-batches' activations are held.
std::vector<Action> one_f_one_b_order(const PipelineShape& shape, int stage) {
  const int m_total = shape.microbatches;
  const int warmup = std::min(shape.stages - stage - 1, m_total);
  std::vector<Action> out;
  for (int m = 0; m < warmup; ++m) out.push_back(compute(ActionKind::forward, m, 0));
  for (int i = 0; i + warmup < m_total; ++i) {
    out.push_back(compute(ActionKind::forward, warmup + i, 0));
    out.push_back(compute(ActionKind::backward, i, 0));
  }
  for (int m = std::max(m_total - warmup, 0); m < m_total; ++m)
    out.push_back(compute(ActionKind::backward, m, 0));
  return out;
}

// Megatron-LM's interleaved 1F1B: the k-th forward of a rank runs micro-batch
// (k / (P V)) P + k % P on chunk (k % (P V)) / P; its k-th backward the same micro-batch on the
// chunks in reverse. Warm-up: 2 (P - stage - 1) + (V - 1) P forwards (all of them when M == P).
std::vector<Action> interleaved_order(const PipelineShape& shape, int stage) {
  const int p = shape.stages, v = shape.chunks, total = shape.microbatches * v;
  const auto microbatch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  const auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  const int warmup =
      shape.microbatches == p ? total : std::min(2 * (p - stage - 1) + (v - 1) * p, total);
  std::vector<Action> out;
  const auto forward = [&](int k) {
    out.push_back(compute(ActionKind::forward, microbatch_of(k), chunk_of(k, true)));
  };
  const auto backward = [&](int k) {
    out.push_back(compute(ActionKind::backward, microbatch_of(k), chunk_of(k, false)));
  };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int i = 0; i + warmup < total; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int k = total - warmup; k < total; ++k) backward(k);
  return out;
}

// ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): every stage, in unit time
// slots, runs what is ready by this priority: an input gradient (B: it unblocks the stage
// before), a forward while fewer than P - stage micro-batches are held (1F1B's memory), a
// weight gradient (W: needs nothing from another stage, so it fills the wait). Found by
// playing all stages together with equal F, B and W times; the order then holds for any
// times.
std::vector<std::vector<Action>> zero_bubble_orders(const PipelineShape& shape) {
  const int p = shape.stages, m_total = shape.microbatches;
  constexpr int kNotYet = -1;
  // When (the slot after which) stage s finished F / B of micro-batch m.
  std::vector<std::vector<int>> f_done(p, std::vector<int>(m_total, kNotYet));
  std::vector<std::vector<int>> b_done = f_done;
  std::vector<std::vector<Action>> out(p);
  std::vector<int> next_f(p, 0), next_b(p, 0), held(p, 0);
  std::vector<std::deque<int>> pending_w(p);
  std::size_t remaining = std::size_t(p) * std::size_t(m_total) * 3;
  // Every slot some stage can run something (the first B is always reachable), so 3 M P slots
  // bound it; more means a bug here, not a long pipeline.
  const int slots = 3 * m_total * p + 1;
  for (int slot = 0; remaining > 0; ++slot) {
    if (slot >= slots)
      throw Error("ZERO_BUBBLE: the schedule did not finish within " + std::to_string(slots) +
                  " slots");
    for (int s = 0; s < p; ++s) {
      const auto ready = [&](int finished) { return finished != kNotYet && finished <= slot; };
      const int b = next_b[s];
      const bool b_ready =
          b < m_total && (s == p - 1 ? ready(f_done[s][b]) : ready(b_done[s + 1][b]));
      const int f = next_f[s];
      const bool f_ready = f < m_total && held[s] < p - s && (s == 0 || ready(f_done[s - 1][f]));
      if (b_ready) {
        out[s].push_back(compute(ActionKind::backward_input, b, 0));
        b_done[s][b] = slot + 1;
        pending_w[s].push_back(b);
        ++next_b[s];
      } else if (f_ready) {
        out[s].push_back(compute(ActionKind::forward, f, 0));
        f_done[s][f] = slot + 1;
        ++held[s];
        ++next_f[s];
      } else if (!pending_w[s].empty()) {
        out[s].push_back(compute(ActionKind::backward_weight, pending_w[s].front(), 0));
        pending_w[s].pop_front();
        --held[s];
      } else {
        continue;  // idle this slot
      }
      --remaining;
    }
  }
  return out;
}

std::uint32_t message_tag(bool gradient, int virtual_stage, int microbatch,
                          const PipelineShape& shape) {
  return std::uint32_t(((gradient ? 1 : 0) * shape.virtual_stages() + virtual_stage) *
                           shape.microbatches +
                       microbatch);
}

// The compute order with its messages: a forward receives its input before it and sends its
// output after it; a backward (or input gradient) receives the output's gradient before it and
// sends the input's gradient after it. The first piece has no input to receive, the last no
// output to send.
std::vector<Action> with_messages(const std::vector<Action>& order, const PipelineShape& shape,
                                  int stage) {
  const int p = shape.stages, last = shape.virtual_stages() - 1;
  std::vector<Action> out;
  const auto message = [&](ActionKind kind, const Action& a, int to_virtual, bool gradient,
                           int tag_virtual) {
    out.push_back(Action{.kind = kind,
                         .microbatch = a.microbatch,
                         .chunk = a.chunk,
                         .peer = to_virtual % p,
                         .tag = message_tag(gradient, tag_virtual, a.microbatch, shape)});
  };
  for (const Action& a : order) {
    const int v = a.chunk * p + stage;
    if (a.kind == ActionKind::forward) {
      if (v > 0) message(ActionKind::recv_activation, a, v - 1, false, v);
      out.push_back(a);
      if (v < last) message(ActionKind::send_activation, a, v + 1, false, v + 1);
    } else if (a.kind == ActionKind::backward || a.kind == ActionKind::backward_input) {
      if (v < last) message(ActionKind::recv_gradient, a, v + 1, true, v);
      out.push_back(a);
      if (v > 0) message(ActionKind::send_gradient, a, v - 1, true, v - 1);
    } else {
      out.push_back(a);
    }
  }
  return out;
}

}  // namespace

std::string to_string(Schedule s) {
  switch (s) {
    case Schedule::GPIPE:
      return "GPIPE";
    case Schedule::ONE_F_ONE_B:
      return "1F1B";
    case Schedule::INTERLEAVED_1F1B:
      return "INTERLEAVED_1F1B";
    case Schedule::ZERO_BUBBLE:
      return "ZERO_BUBBLE";
  }
  return "?";
}

Schedule parse_schedule(std::string_view text) {
  for (Schedule s :
       {Schedule::GPIPE, Schedule::ONE_F_ONE_B, Schedule::INTERLEAVED_1F1B, Schedule::ZERO_BUBBLE})
    if (text == to_string(s)) return s;
  throw InvalidArgument("pipeline_schedule '" + std::string(text) +
                        "' is not a schedule (GPIPE, 1F1B, INTERLEAVED_1F1B, ZERO_BUBBLE)");
}

std::string_view to_string(ActionKind k) {
  switch (k) {
    case ActionKind::forward:
      return "F";
    case ActionKind::backward:
      return "B";
    case ActionKind::backward_input:
      return "BI";
    case ActionKind::backward_weight:
      return "W";
    case ActionKind::recv_activation:
      return "recv_act";
    case ActionKind::send_activation:
      return "send_act";
    case ActionKind::recv_gradient:
      return "recv_grad";
    case ActionKind::send_gradient:
      return "send_grad";
  }
  return "?";
}

bool is_communication(ActionKind k) {
  return k == ActionKind::recv_activation || k == ActionKind::send_activation ||
         k == ActionKind::recv_gradient || k == ActionKind::send_gradient;
}

std::string describe(const Action& a) {
  std::string out = std::string(to_string(a.kind)) + " mb " + std::to_string(a.microbatch);
  if (!is_communication(a.kind)) return out + " chunk " + std::to_string(a.chunk);
  const bool sends = a.kind == ActionKind::send_activation || a.kind == ActionKind::send_gradient;
  return out + (sends ? " -> " : " <- ") + std::to_string(a.peer) + " (tag " +
         std::to_string(a.tag) + ")";
}

void check_shape(Schedule schedule, const PipelineShape& shape) {
  refuse_unless(shape.stages >= 1,
                "pipeline_parallel_size " + std::to_string(shape.stages) + " must be at least 1");
  refuse_unless(shape.chunks >= 1,
                "pipeline_chunks " + std::to_string(shape.chunks) + " must be at least 1");
  refuse_unless(shape.microbatches >= 1,
                "num_microbatches " + std::to_string(shape.microbatches) + " must be at least 1");
  if (schedule != Schedule::INTERLEAVED_1F1B) {
    refuse_unless(shape.chunks == 1, "pipeline_chunks " + std::to_string(shape.chunks) +
                                         " needs pipeline_schedule INTERLEAVED_1F1B, not " +
                                         to_string(schedule));
    return;
  }
  refuse_unless(shape.stages >= 2,
                "pipeline_schedule INTERLEAVED_1F1B needs "
                "pipeline_parallel_size 2 or more, not " +
                    std::to_string(shape.stages));
  refuse_unless(shape.microbatches % shape.stages == 0,
                "pipeline_schedule INTERLEAVED_1F1B needs num_microbatches (" +
                    std::to_string(shape.microbatches) +
                    ") to be a multiple of pipeline_parallel_size (" +
                    std::to_string(shape.stages) + ")");
}

std::vector<Action> schedule_for_stage(Schedule schedule, const PipelineShape& shape, int stage) {
  check_shape(schedule, shape);
  refuse_unless(stage >= 0 && stage < shape.stages, "pipeline stage " + std::to_string(stage) +
                                                        " is not one of 0 .. " +
                                                        std::to_string(shape.stages - 1));
  switch (schedule) {
    case Schedule::GPIPE:
      return with_messages(gpipe_order(shape), shape, stage);
    case Schedule::ONE_F_ONE_B:
      return with_messages(one_f_one_b_order(shape, stage), shape, stage);
    case Schedule::INTERLEAVED_1F1B:
      return with_messages(interleaved_order(shape, stage), shape, stage);
    case Schedule::ZERO_BUBBLE:
      return with_messages(zero_bubble_orders(shape)[std::size_t(stage)], shape, stage);
  }
  return {};
}

std::vector<std::vector<Action>> schedule_all(Schedule schedule, const PipelineShape& shape) {
  std::vector<std::vector<Action>> out;
  for (int s = 0; s < shape.stages; ++s) out.push_back(schedule_for_stage(schedule, shape, s));
  return out;
}

}  // namespace accel::pipeline
