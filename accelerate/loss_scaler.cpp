#include "accelerate/loss_scaler.hpp"

#include <cmath>
#include <sstream>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "backends/comm/host_collectives.hpp"
#include "foundation/error.hpp"

namespace accel {

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options)
    : options_(options), scale_(options.init_scale) {
  ACCEL_CHECK_ARG(options_.init_scale > 0 && std::isfinite(options_.init_scale),
                  "loss scaler: init_scale must be a positive number");
  ACCEL_CHECK_ARG(options_.growth_factor > 1, "loss scaler: growth_factor must be above 1");
  ACCEL_CHECK_ARG(options_.backoff_factor > 0 && options_.backoff_factor < 1,
                  "loss scaler: backoff_factor must be in (0, 1)");
  ACCEL_CHECK_ARG(options_.growth_interval > 0, "loss scaler: growth_interval must be positive");
}

bool DynamicLossScaler::update(Communicator& comm, bool locally_finite) {
  // One rank's overflow skips the step everywhere: with DDP the average already carries the inf
  // to every rank, but a sharded strategy's ranks each see only their slice.
  std::int32_t overflow = locally_finite ? 0 : 1;
  all_reduce_values(comm, buffer_of(std::span(&overflow, 1)), ReduceOp::max);
  if (overflow != 0) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return false;
  }
  if (++growth_tracker_ == options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // GradScaler too stops growing at fp32's limit
    growth_tracker_ = 0;
  }
  return true;
}

std::string DynamicLossScaler::save() const {
  std::ostringstream out;
  out.precision(17);
  out << scale_ << ' ' << growth_tracker_;
  return out.str();
}

void DynamicLossScaler::load(const std::string& bytes) {
  std::istringstream in(bytes);
  double scale = 0;
  int tracker = -1;
  if (!(in >> scale >> tracker) || !(scale > 0) || !std::isfinite(scale) || tracker < 0)
    throw CheckpointError("loss scaler state '" + bytes.substr(0, 60) +
                          "' is not 'scale growth_tracker'");
  scale_ = scale;
  growth_tracker_ = tracker;
}

}  // namespace accel
