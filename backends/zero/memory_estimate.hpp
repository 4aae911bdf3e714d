#pragma once
// Per-rank memory of model states under DDP and ZeRO stages 1-3, by the ZeRO paper's
// accounting (Rajbhandari et al. 2020, section 3): with Psi parameters, mixed precision keeps
// 2 Psi bytes of half-precision parameters, 2 Psi of gradients and K Psi of optimizer state
// (fp32 master weights plus the optimizer's fp32 slots: K = 12 for Adam); ZeRO divides the
// optimizer state (stage 1), then the gradients (2), then the parameters (3) by the world
// size. In fp32 parameters and gradients take 4 bytes each and there is no master copy.
// Sharded amounts are rounded up as the flat layout pads them: ceil(Psi / N) elements.
// One departure, as ZeroStrategy allocates: ZeRO-1's gradients are the full ones plus the
// reduced slice, kept apart so a second backward before the step still adds to the full ones.

#include <cstdint>
#include <string>
#include <vector>

namespace accel {

struct MemoryEstimateOptions {
  std::uint64_t num_params = 0;
  int world_size = 1;
  std::string precision = "bf16";   // "fp32", "bf16" or "fp16" (mixed precision)
  std::string optimizer = "adamw";  // "adam", "adamw" (2 fp32 slots), "sgd_momentum" (1), "sgd" (0)
};

struct MemoryEstimate {
  std::string strategy;  // "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"
  std::uint64_t parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  std::uint64_t total() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
};

// K: optimizer-state bytes per parameter (12 for mixed-precision Adam). Throws
// InvalidArgument naming an unknown precision or optimizer.
int optimizer_bytes_per_param(const MemoryEstimateOptions& options);
// DDP, ZeRO-1, ZeRO-2, ZeRO-3, per rank.
std::vector<MemoryEstimate> estimate_memory(const MemoryEstimateOptions& options);

}  // namespace accel
