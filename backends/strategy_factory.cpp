#include "backends/strategy_factory.hpp"

#include "backends/dataparallel/data_parallel_strategy.hpp"
#include "backends/ddp/ddp_strategy.hpp"
#include "backends/zero/zero_strategy.hpp"
#include "foundation/error.hpp"

namespace accel {

std::unique_ptr<Strategy> make_strategy(Communicator& comm, std::vector<ParamRef> params,
                                        std::vector<Buffer> buffers,
                                        const StrategyOptions& options) {
  switch (options.kind) {
    case StrategyKind::ddp:
      return std::make_unique<DdpStrategy>(comm, std::move(params), std::move(buffers),
                                           options.ddp);
    case StrategyKind::zero:
      return std::make_unique<ZeroStrategy>(comm, std::move(params), std::move(buffers),
                                            options.zero);
    case StrategyKind::data_parallel:
      return std::make_unique<DataParallelStrategy>(comm, std::move(params), std::move(buffers),
                                                    options.data_parallel);
  }
  throw InvalidArgument("unknown strategy kind " + std::to_string(int(options.kind)) +
                        " (ddp, zero or data_parallel)");
}

std::string strategy_description(const StrategyOptions& options) {
  std::string out(strategy_kind_name(options.kind));
  if (options.kind == StrategyKind::zero) out += " stage " + std::to_string(options.zero.stage);
  if (options.kind == StrategyKind::data_parallel)
    out += " (" + std::to_string(options.data_parallel.replicas) + " replicas)";
  return out;
}

std::vector<std::pair<std::string, std::string>> strategy_settings(const StrategyOptions& options) {
  if (options.kind == StrategyKind::zero)
    return {{"ZeRO bucket_cap_bytes", std::to_string(options.zero.bucket_cap_bytes)},
            {"ZeRO offload_optimizer",
             options.zero.offload_optimizer == OffloadDevice::cpu ? "'cpu'" : "'none'"}};
  return {{"DDP bucket sizes", std::to_string(options.ddp.first_bucket_bytes) + " first, then " +
                                   std::to_string(options.ddp.bucket_cap_bytes) + " bytes"}};
}

}  // namespace accel
