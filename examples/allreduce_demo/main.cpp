// The smallest distributed program: every rank contributes rank + 1, all-reduces, and checks
// the sum. Run it with `build/bin/accel launch --num_processes 2 build/bin/allreduce_demo`.

#include <cstdio>
#include <numeric>
#include <vector>

#include "accelerate/process/process_group.hpp"

int main() {
  try {
    auto group = accel::init_process_group();
    accel::Communicator& comm = group->comm();
    std::vector<float> values(1 << 20, float(comm.rank() + 1));
    comm.all_reduce(accel::buffer_of(std::span(values)), accel::ReduceOp::sum)->wait();

    const int n = comm.world_size();
    const float expected = float(n * (n + 1) / 2);
    std::size_t wrong = 0;
    for (float v : values) wrong += (v != expected);
    std::printf("rank %d of %d (%s): all_reduce of %zu floats: %g (expected %g), %zu wrong\n",
                comm.rank(), n, std::string(comm.backend_name()).c_str(), values.size(),
                double(values[0]), double(expected), wrong);
    return wrong == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_demo: %s\n", e.what());
    return 1;
  }
}
