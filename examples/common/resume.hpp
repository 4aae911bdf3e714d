#pragma once
// The examples' resume: when `dir` holds a checkpoint, load_state from it and say where the
// run continues (the main process prints "resumed from DIR: epoch E, batch B, step S"). The
// loop then starts at acc.resume_epoch() / acc.batch_in_epoch().

#include <string>

#include "accelerate/accelerator.hpp"
#include "accelerate/checkpointing/checkpoint.hpp"

namespace examples {

// Returns whether it resumed (nothing happens for an empty `dir` or one without a checkpoint).
inline bool resume_if_saved(accel::Accelerator& acc, const std::string& dir) {
  if (dir.empty() || !accel::checkpoint_exists(dir)) return false;
  acc.load_state(dir);
  acc.print("resumed from %s: epoch %llu, batch %llu, step %llu\n", dir.c_str(),
            static_cast<unsigned long long>(acc.resume_epoch() + 1),
            static_cast<unsigned long long>(acc.resume_batch()),
            static_cast<unsigned long long>(acc.step()));
  return true;
}

}  // namespace examples
