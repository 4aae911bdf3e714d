// The collective matrix over NCCL on CUDA buffers, one rank per visible GPU (1, 2 or 4 ranks
// as the GPUs allow). Skipped, saying why, where NCCL is not built or no GPU is visible.

#include <doctest/doctest.h>

#include "backends/comm/registry.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/staging.hpp"

using namespace accel;
using namespace accel::test;

TEST_CASE("nccl collectives match the reference on CUDA buffers") {
  if (skip_unless(communicator_available("nccl"), "nccl communicator not built")) return;
  const int gpus = cuda_device_count();
  if (skip_unless(gpus > 0, "no CUDA device visible: the NCCL tests need a GPU")) return;
  for (int world : {1, 2, 4}) {
    if (world > gpus) break;
    CAPTURE(world);
    const auto result = run_ranks(world, "comm_collectives_worker", {"--backend", "nccl"});
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    int reports = 0;
    for (const auto& w : result.workers)
      reports += w.output.find(" checks, 0 failed") != std::string::npos;
    CHECK(reports == world);
  }
}
