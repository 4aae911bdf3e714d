#pragma once
// Dynamic loss scaling for fp16 mixed precision (PyTorch's torch.cuda.amp.GradScaler, with its
// defaults): the loss is multiplied by scale() before backward so small fp16 gradients do not
// flush to zero; at each optimizer step the gradients are divided by it again and checked. A
// step whose gradients hold an inf or NaN on any rank is skipped on every rank and the scale
// backs off; after growth_interval finite steps in a row it grows.
//
// The Accelerator drives it (mixed_precision fp16): loss_scale() includes scale(), and at each
// accumulation boundary the gradients are unscaled and checked before sync_gradients() returns.
// Which bytes to unscale is the front end's business (raw buffers on the CPU or a GPU through
// accel::unscale_gradients in backends/optim/elementwise.hpp, LibTorch tensors through tensor
// operations); the decision (agreed by all ranks) and the scale's schedule live here.

#include <cstdint>
#include <span>
#include <string>

#include "backends/comm/communicator.hpp"

namespace accel {

struct LossScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int growth_interval = 2000;  // finite steps in a row before the scale grows
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerOptions options = {});

  double scale() const { return scale_; }
  // Finite steps since the last growth or overflow.
  int growth_tracker() const { return growth_tracker_; }

  // Every rank calls it once per optimizer step with whether its own gradients were finite;
  // returns whether they were finite on every rank (the same answer everywhere), and moves the
  // scale on: backoff after an overflow, growth after growth_interval finite steps.
  bool update(Communicator& comm, bool locally_finite);

  // For checkpoints: "scale growth_tracker" as text, and back (throws CheckpointError).
  std::string save() const;
  void load(const std::string& bytes);

 private:
  LossScalerOptions options_;
  double scale_;
  int growth_tracker_ = 0;
};

}  // namespace accel
