#pragma once
// The one place a strategy is chosen: StrategyOptions::kind picks DDP, ZeRO (with its stage)
// or DataParallel (with its replicas); everything that needs a strategy (the Accelerator, the
// LibTorch adapter through it, tests, benchmarks) makes it here.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.hpp"

namespace accel {

std::unique_ptr<Strategy> make_strategy(Communicator& comm, std::vector<ParamRef> params,
                                        std::vector<Buffer> buffers,
                                        const StrategyOptions& options);

// The strategy as ranks compare it before prepare ("zero stage 2", "data_parallel (4
// replicas)"), and the settings that shape its collectives, as (what, value) pairs.
std::string strategy_description(const StrategyOptions& options);
std::vector<std::pair<std::string, std::string>> strategy_settings(const StrategyOptions& options);

}  // namespace accel
