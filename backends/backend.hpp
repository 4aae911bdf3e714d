#pragma once
// The strategy interface: how model state is laid out and synchronised across ranks (DDP,
// ZeRO, DataParallel, or nothing for a single process). The front end (Accelerator) drives a
// Strategy through these calls and nothing else, so a training loop does not change when the
// config picks another strategy. Strategies see parameters as typed buffer views, never as
// framework tensors: LibTorch and raw C++ loops are served alike.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/comm/communicator.hpp"

namespace accel {

// One trainable parameter: its values and its gradient (same dtype, count and device), and
// the optimizer param group it belongs to (ZeRO lays out one flat buffer per group and dtype).
struct ParamRef {
  std::string name;
  Buffer data;
  Buffer grad;
  std::size_t group = 0;
  // The tensor's shape, recorded in checkpoints so `accel merge-weights` can rebuild it (the
  // LibTorch adapter fills it in). Empty means one dimension of data.count elements.
  std::vector<std::int64_t> shape;
};

// A run of parameter values and their synchronised gradient that this rank's optimizer
// updates: DDP hands out every full parameter, ZeRO this rank's slice of each flat
// (group, dtype) buffer. Element-wise optimizers give the same result either way.
struct ParamSegment {
  std::size_t group = 0;
  Buffer values;
  Buffer grad;
  // Where values start among the group's parameters laid end to end in parameter order (the
  // same coordinates under every strategy and world size: checkpoints reshard by them; a
  // ZeRO slice may reach past the end into padding).
  std::size_t offset = 0;
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

  // Broadcasts the non-trainable buffers (e.g. BatchNorm statistics) from rank 0.
  virtual void sync_buffers() = 0;

  // The parameters as prepared (names, full views).
  virtual const std::vector<ParamRef>& params() const = 0;

  // ---- the optimizer step (the hook that lets one loop run under DDP and ZeRO alike)
  // What this rank's optimizer updates after a sync, in a fixed order (param group, then
  // parameter order) and with views that stay valid: see ParamSegment.
  virtual std::vector<ParamSegment> segments() const = 0;
  // Whether segments() hold only this rank's part of the gradients, so a global quantity (the
  // gradient norm) needs a sum over ranks.
  virtual bool gradients_sharded() const = 0;
  // After the optimizer updated segments(): ZeRO all-gathers the updated parameters into
  // every rank's full copy; DDP has nothing to do.
  virtual void after_optimizer_step() = 0;
  // The parameters' values were changed from outside (a checkpoint was loaded into them):
  // ZeRO copies them into its flat buffers; DDP holds no copy.
  virtual void reload_parameters() {}

  // Gradient memory this strategy allocated, in bytes (DDP: its buckets; ZeRO-1: the flat
  // gradient buffers; ZeRO-2: the owned slices and two buckets).
  virtual std::size_t gradient_bytes() const = 0;
};


}  // namespace accel
