// Uses the installed library the way a user's program would: join the (single-process)
// group and all-reduce through the installed headers and libraries.
#include <cstdio>
#include <vector>

#include "accelerate/process/process_group.hpp"
#include "backends/comm/registry.hpp"

int main() {
  auto group = accel::init_process_group();
  std::vector<double> v = {1.5, 2.5};
  group->comm().all_reduce(accel::buffer_of(std::span(v)), accel::ReduceOp::max)->wait();
  std::printf("consumer: world %d, communicators:", group->world_size());
  for (const auto& name : accel::available_communicators()) std::printf(" %s", name.c_str());
  std::printf("; result %g %g\n", v[0], v[1]);
  return (v[0] == 1.5 && v[1] == 2.5) ? 0 : 1;
}
