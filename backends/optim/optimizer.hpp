#pragma once
// Built-in optimizers for the raw API (accel::Sgd, accel::AdamW): element-wise updates on
// flat runs of parameters (ParamSegment), so the same object steps every full parameter
// under DDP and only this rank's owned slices under ZeRO, with the same arithmetic on each
// element: a world of one under ZeRO is bitwise the unsharded optimizer.
//
// State (momentum, Adam's moments) is allocated per segment at the first step, where the
// segment's parameters live (CPU memory, or GPU memory for DeviceKind::cuda segments, which
// the CUDA kernels update: elementwise.hpp), and counted: state_bytes() is what the ZeRO
// memory accounting checks. f32 parameters only (a mixed-precision loop keeps f32 master
// weights and steps those; LibTorch users keep their own optimizers, see accelerate/torch/).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/backend.hpp"
#include "backends/optim/elementwise.hpp"

namespace accel {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;

  // One update of every segment (the same segments, in the same order, at every step). GPU
  // segments are updated by kernels queued on ctx.stream (the Accelerator passes its
  // communicator's compute stream: compute_context(comm)); save_state reads the state back on
  // the last step's stream.
  void step(const std::vector<ParamSegment>& segments, const DeviceContext& ctx = {});

  // Param groups and their learning rate (what an LR schedule changes).
  virtual std::size_t num_groups() const = 0;
  virtual double lr(std::size_t group) const = 0;
  virtual void set_lr(std::size_t group, double lr) = 0;
  // A param group's hyperparameters by name ("lr", "momentum", ...; booleans as 0 or 1), for
  // the Accelerator's check that every rank has the same.
  virtual std::vector<std::pair<std::string, double>> options(std::size_t group) const = 0;

  std::uint64_t steps() const { return steps_; }
  // Bytes of optimizer state allocated so far.
  std::size_t state_bytes() const { return state_bytes_; }

  // The step count and every segment's state, as bytes (a checkpoint blob); load_state checks
  // the size against this optimizer's segments before changing anything.
  std::string save_state() const;
  void load_state(const std::string& bytes);

 protected:
  // State arrays per element for a segment of `group` (SGD with momentum 1, AdamW 2).
  virtual std::size_t state_slots(std::size_t group) const = 0;
  // One segment's update; `state` holds state_slots(group) arrays of values.count floats on
  // the segment's device, `step` counts from 1.
  virtual void update(const ParamSegment& segment, std::vector<float*>& state, std::uint64_t step,
                      const DeviceContext& ctx) = 0;
  void check_group(std::size_t group) const;

 private:
  std::uint64_t steps_ = 0;
  std::size_t state_bytes_ = 0;
  // [segment][slot] -> values.count floats, on the segment's device
  std::vector<std::vector<StateArray>> state_;
  std::vector<std::size_t> segment_counts_;  // to refuse other segments on a later step
  DeviceContext context_;                    // the last step's stream (save_state reads on it)
};

// Optimizer::save_state's bytes, parsed: the step count and, per segment, its element count
// and its `slots` state arrays of `count` floats, one after the other from `data` (a view into
// the parsed bytes; read with memcpy). The one reader of the format: Optimizer::load_state,
// checkpoints' resharding (accelerate/checkpointing/optimizer_state.cpp) and the LibTorch adapter's
// state. Throws InvalidArgument starting with `what` when the bytes are truncated or have any left.
struct SavedOptimizerState {
  struct Segment {
    std::uint64_t count = 0, slots = 0;
    const char* data = nullptr;
    // Slot s's floats, copied out.
    std::vector<float> slot(std::uint64_t s) const;
  };
  std::uint64_t step = 0;
  std::vector<Segment> segments;
};
SavedOptimizerState parse_optimizer_state(std::string_view bytes, const std::string& what);

}  // namespace accel
