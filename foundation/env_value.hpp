#pragma once
// Tuning knobs read from the environment (ACCEL_SHM_SPIN_US, ACCEL_MPI_INLINE_BYTES, ...): one
// parser, so every knob refuses bad text the same way instead of reading it as 0.

#include <cstdint>
#include <limits>

namespace accel {

// `name`'s value as a whole number in [min, max]; `fallback` when unset or empty. Anything
// else (a sign, a unit, text, out of range) throws ConfigError naming the variable, its text
// and the range.
std::uint64_t env_uint(const char* name, std::uint64_t fallback, std::uint64_t min = 0,
                       std::uint64_t max = std::numeric_limits<std::uint64_t>::max());

}  // namespace accel
