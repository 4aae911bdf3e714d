#include "backends/strategy_factory.hpp"

#include "backends/comm/error.hpp"

namespace accel {

std::unique_ptr<Strategy> make_strategy(Communicator& comm, std::vector<ParamRef> params,
                                        std::vector<Buffer> buffers,
                                        const StrategyOptions& options) {
  if (options.kind == "ddp")
    return std::make_unique<DdpStrategy>(comm, std::move(params), std::move(buffers), options.ddp);
  if (options.kind == "zero")
    return std::make_unique<ZeroStrategy>(comm, std::move(params), std::move(buffers),
                                          options.zero);
  if (options.kind == "data_parallel")
    return std::make_unique<DataParallelStrategy>(comm, std::move(params), std::move(buffers),
                                                  options.data_parallel);
  throw InvalidArgument("unknown strategy '" + options.kind + "' (ddp, zero or data_parallel)");
}

}  // namespace accel
