#include "accelerate/torch/autocast.hpp"

#include <ATen/autocast_mode.h>

namespace accel {

// What torch.autocast("cpu") does on entering and leaving.
AutocastGuard::AutocastGuard(bool enabled, c10::ScalarType dtype) : enabled_(enabled) {
  if (!enabled_) return;
  previous_enabled_ = at::autocast::is_cpu_enabled();
  previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  // The cast weights are cached while any autocast region is open; the last one frees them.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_cpu_enabled(previous_enabled_);
  at::autocast::set_autocast_cpu_dtype(previous_dtype_);
}

}  // namespace accel
