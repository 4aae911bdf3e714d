// Prints what accel::read_process_env() finds, one line, for the launcher and mpirun tests:
// "rank=1 world=2 local_rank=1 local_world=2 node=0 source=OMPI launcher_store=0".

#include <cstdio>
#include <exception>

#include "accelerate/process/process_env.hpp"

int main() {
  try {
    const accel::ProcessEnv e = accel::read_process_env();
    std::printf(
        "rank=%d world=%d local_rank=%d local_world=%d node=%d source=%s launcher_store=%d\n",
        e.rank, e.world_size, e.local_rank, e.local_world_size, e.node_rank, e.source.c_str(),
        e.launcher_hosts_store ? 1 : 0);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "print_process_env: %s\n", e.what());
    return 1;
  }
}
