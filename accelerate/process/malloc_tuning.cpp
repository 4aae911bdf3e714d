#include "accelerate/process/malloc_tuning.hpp"

#include <cstdlib>
#include <limits>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "foundation/env_value.hpp"

namespace accel {

bool tune_malloc_for_training() {
#if defined(__GLIBC__)
  if (env_uint("ACCEL_MALLOC_TUNING", 1, 0, 1) == 0) return false;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::string_view(tunables).find("glibc.malloc.") != std::string_view::npos)
    return false;  // the user's choice
  // What `accel launch` gives CPU workers (launch/worker_env.hpp, kWorkerMallocTunables, which
  // says why), as far as mallopt reaches: both thresholds out of reach (mallopt takes an int)
  // and one arena. Setting a threshold also stops glibc's dynamic one, which stops at 32 MiB.
  // Huge pages (glibc.malloc.hugetlb) only GLIBC_TUNABLES can ask for, at start.
  constexpr int kOutOfReach = std::numeric_limits<int>::max();
  return mallopt(M_MMAP_THRESHOLD, kOutOfReach) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kOutOfReach) == 1 && mallopt(M_ARENA_MAX, 1) == 1;
#else
  return false;
#endif
}

}  // namespace accel
