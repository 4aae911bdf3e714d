// One rank of accelerator_test's global_batch_size check: a sampler over 90 samples asked for
// batches of 7 (which global_batch_size overrides); prints this rank's first three batches,
// one line each: "batch B rank R: i i i ...".
//   global_batch_worker
// Exit 0 on success, 2 with the error on stderr.

#include <cstdio>
#include <string>

#include "accelerate/accelerator.hpp"

using namespace accel;

int main() {
  try {
    Accelerator acc;
    const ShardedSampler sampler = acc.make_sampler(90, {.batch_size = 7, .seed = 3});
    const std::vector<std::size_t> indices = sampler.indices();
    for (std::size_t b = 0; b < 3; ++b) {
      const auto [begin, end] = sampler.batch_bounds(b);
      std::string line =
          "batch " + std::to_string(b) + " rank " + std::to_string(acc.process_index()) + ":";
      for (std::size_t i = begin; i < end; ++i) line += " " + std::to_string(indices[i]);
      std::printf("%s\n", line.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "global_batch_worker: %s\n", e.what());
    return 2;
  }
}
