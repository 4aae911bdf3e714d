#include "foundation/host_cores.hpp"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <initializer_list>

namespace accel {

int online_cores() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? int(n) : 1;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  return n > 0 ? n : online_cores();
}

int ranks_on_this_host() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* text = std::getenv(name);
    if (!text || !*text) continue;
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    return *end == '\0' && n > 0 && n < 1'000'000 ? int(n) : 0;
  }
  return 0;
}

bool worker_can_overlap(int ranks_here, int online, int usable) {
  return usable >= 2 && (ranks_here <= 0 || online > ranks_here);
}

bool worker_can_overlap() {
  return worker_can_overlap(ranks_on_this_host(), online_cores(), usable_cores());
}

}  // namespace accel
