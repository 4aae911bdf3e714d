#include "backends/zero/memory_estimate.hpp"

#include "foundation/error.hpp"

namespace accel {
namespace {

int state_slots(const std::string& optimizer) {
  if (optimizer == "adam" || optimizer == "adamw") return 2;
  if (optimizer == "sgd_momentum") return 1;
  if (optimizer == "sgd") return 0;
  throw InvalidArgument("estimate-memory: unknown optimizer '" + optimizer +
                        "' (adam, adamw, sgd_momentum, sgd)");
}

bool mixed(const std::string& precision) {
  if (precision == "fp32") return false;
  if (precision == "bf16" || precision == "fp16") return true;
  throw InvalidArgument("estimate-memory: unknown precision '" + precision +
                        "' (fp32, bf16, fp16)");
}

}  // namespace

int optimizer_bytes_per_param(const MemoryEstimateOptions& o) {
  // fp32 slots, plus the fp32 master copy of the parameters under mixed precision.
  return 4 * state_slots(o.optimizer) + (mixed(o.precision) ? 4 : 0);
}

std::vector<MemoryEstimate> estimate_memory(const MemoryEstimateOptions& o) {
  ACCEL_CHECK_ARG(o.world_size >= 1, "estimate-memory: the world size must be at least 1");
  const std::uint64_t psi = o.num_params, n = std::uint64_t(o.world_size);
  const std::uint64_t shard = (psi + n - 1) / n;  // the flat layout pads to a multiple of N
  const std::uint64_t half = mixed(o.precision) ? 2 : 4;
  const std::uint64_t k = std::uint64_t(optimizer_bytes_per_param(o));
  return {
      {"DDP", half * psi, half * psi, k * psi},
      // ZeRO-1 keeps the full gradients (a later backward of the step adds to them) and
      // reduce-scatters into a separate slice of its own.
      {"ZeRO-1", half * psi, half * (psi + shard), k * shard},
      {"ZeRO-2", half * psi, half * shard, k * shard},
      {"ZeRO-3", half * shard, half * shard, k * shard},
  };
}

}  // namespace accel
