#pragma once
// Pipeline schedules: for P stages (ranks), V model chunks per rank and M micro-batches, the
// list of actions one stage runs for one global batch. Pure functions of (P, V, M, stage): the
// runtime executes the list, the tests run every stage's list together against a model of
// blocking point-to-point messages (schedule_simulation.hpp).
//
// Virtual stage v = chunk * P + stage holds the v-th of the P x V model pieces (Megatron's
// interleaved layout: rank r holds pieces r, r + P, ...). A micro-batch goes forward through
// the pieces 0 .. P*V-1 and backward through them in reverse.
//
// Communication actions that follow each other in a list (no compute between them) are
// issued together and waited for together, as Megatron's send_forward_recv_backward and
// PyTorch's batch_isend_irecv: that is what lets neighbouring stages exchange an activation
// for a gradient without either blocking on the other. GPIPE, 1F1B and ZERO_BUBBLE need no
// more (free of deadlock even when a send blocks until its receive is posted);
// INTERLEAVED_1F1B needs sends that do not wait for their receive (asynchronous, as the
// runtime's are): under blocking sends two neighbours can both be sending.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace accel::pipeline {

// pipeline_schedule (config key): GPIPE (every forward, then every backward), 1F1B
// (PipeDream-flush: after a warm-up, one forward and one backward in turn; the default),
// INTERLEAVED_1F1B (1F1B over V chunks per rank; M a multiple of P), ZERO_BUBBLE (ZB-H1: the
// backward split into its input and weight gradients, the weight gradients filling the wait).
enum class Schedule { GPIPE, ONE_F_ONE_B, INTERLEAVED_1F1B, ZERO_BUBBLE };
std::string to_string(Schedule);  // "GPIPE", "1F1B", "INTERLEAVED_1F1B", "ZERO_BUBBLE"
// Throws InvalidArgument naming the text and the choices.
Schedule parse_schedule(std::string_view text);

struct PipelineShape {
  int stages = 1;        // P: pipeline_parallel_size
  int chunks = 1;        // V: pipeline_chunks (INTERLEAVED_1F1B), 1 otherwise
  int microbatches = 1;  // M: num_microbatches
  int virtual_stages() const { return stages * chunks; }
};

enum class ActionKind {
  forward,          // F: the chunk's forward on the micro-batch (its input received or given)
  backward,         // B: the whole backward (input and weight gradients)
  backward_input,   // ZERO_BUBBLE's B: the input gradient only (sent upstream at once)
  backward_weight,  // ZERO_BUBBLE's W: the weight gradient of a micro-batch whose B ran
  recv_activation,  // the forward's input, from the previous piece's stage
  send_activation,  // the forward's output, to the next piece's stage
  recv_gradient,    // the gradient of the forward's output, from the next piece's stage
  send_gradient,    // the gradient of the forward's input, to the previous piece's stage
};
inline constexpr std::size_t kActionKinds = 8;  // for arrays indexed by ActionKind
std::string_view to_string(ActionKind);         // "F", "B", "BI", "W", "recv_act", ...
bool is_communication(ActionKind);

struct Action {
  ActionKind kind;
  int microbatch = 0;
  int chunk = 0;          // this rank's chunk (0 .. V-1)
  int peer = -1;          // the other stage of a communication; -1 for compute
  std::uint32_t tag = 0;  // a communication's tag: the same on its send and its recv
  bool operator==(const Action&) const = default;
};
std::string describe(const Action&);  // "F mb 3 chunk 0", "send_act mb 3 -> 1 (tag 7)"

// Refuses a shape the schedule cannot run, naming what is wrong: P, V or M below 1, V != 1
// outside INTERLEAVED_1F1B, INTERLEAVED_1F1B with P < 2 or M not a multiple of P (naming
// both).
void check_shape(Schedule, const PipelineShape&);

// The actions of `stage` (0 .. P-1) for one global batch: every micro-batch's forward and
// backward on each of its chunks once, with the messages that connect them.
std::vector<Action> schedule_for_stage(Schedule, const PipelineShape&, int stage);

// Every stage's list, stage by stage.
std::vector<std::vector<Action>> schedule_all(Schedule, const PipelineShape&);

}  // namespace accel::pipeline
