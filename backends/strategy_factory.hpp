#pragma once
// The one place a strategy is chosen: the config's distributed_type picks DDP, ZeRO (with
// its stage) or DataParallel (with its replicas); everything that needs a strategy (the Accelerator, the LibTorch adapter through
// it, tests, benchmarks) makes it here.

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/dataparallel/data_parallel_strategy.hpp"
#include "backends/ddp/ddp_strategy.hpp"
#include "backends/zero/zero_strategy.hpp"

namespace accel {

struct StrategyOptions {
  // "ddp" (also the world of one and every other multi-process type), "zero" or
  // "data_parallel" (one process, data_parallel.replicas replicas on threads).
  std::string kind = "ddp";
  DdpOptions ddp;
  ZeroOptions zero;  // zero.stage from the config's zero_stage
  // replicas from the config's data_parallel_replicas; the front end adds the copies.
  DataParallelOptions data_parallel;
};

std::unique_ptr<Strategy> make_strategy(Communicator& comm, std::vector<ParamRef> params,
                                        std::vector<Buffer> buffers,
                                        const StrategyOptions& options);

}  // namespace accel
