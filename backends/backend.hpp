#pragma once
// The strategy interface: how model state is laid out and synchronised across ranks (DDP,
// ZeRO, DataParallel, or nothing for a single process). The front end (Accelerator) drives a
// Strategy through these calls and nothing else, so a training loop does not change when the
// config picks another strategy. Strategies see parameters as typed buffer views, never as
// framework tensors: LibTorch and raw C++ loops are served alike.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "backends/comm/communicator.hpp"

namespace accel {

// One trainable parameter: its values and its gradient (same dtype, count and device).
struct ParamRef {
  std::string name;
  Buffer data;
  Buffer grad;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;

  // Once, before training: every rank starts from the same parameters.
  virtual void prepare() = 0;

  // During backward: the gradient of parameter `index` is final for this iteration. May
  // start communication right away (overlap with the rest of backward).
  virtual void grad_ready(std::size_t index) = 0;

  // After backward: when it returns, every gradient is synchronised (for DDP: the average
  // over ranks). Parameters that reported no gradient this iteration count as zero.
  virtual void sync_gradients() = 0;

  // Gradient accumulation: while off, grad_ready and sync_gradients do nothing and gradients
  // simply accumulate locally (PyTorch's no_sync).
  virtual void set_sync_enabled(bool enabled) = 0;
  virtual bool sync_enabled() const = 0;
};

}  // namespace accel
