#pragma once
// The one place a strategy is chosen: the config's distributed_type picks DDP or ZeRO (with
// its stage); everything that needs a strategy (the Accelerator, the LibTorch adapter through
// it, tests, benchmarks) makes it here.

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/ddp/ddp_strategy.hpp"
#include "backends/zero/zero_strategy.hpp"

namespace accel {

struct StrategyOptions {
  // "ddp" (also the world of one and every non-sharded distributed type) or "zero".
  std::string kind = "ddp";
  DdpOptions ddp;
  ZeroOptions zero;  // zero.stage from the config's zero_stage
};

std::unique_ptr<Strategy> make_strategy(Communicator& comm, std::vector<ParamRef> params,
                                        std::vector<Buffer> buffers,
                                        const StrategyOptions& options);

}  // namespace accel
