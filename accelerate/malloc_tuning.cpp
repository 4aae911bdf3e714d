#include "accelerate/malloc_tuning.hpp"

#include <cstdlib>
#include <limits>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/env_value.hpp"

namespace accel {

bool tune_malloc_for_training() {
#if defined(__GLIBC__)
  if (env_uint("ACCEL_MALLOC_TUNING", 1, 0, 1) == 0) return false;
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::string_view(tunables).find("glibc.malloc.") != std::string_view::npos)
    return false;  // the user's choice
  // Setting either stops glibc's dynamic adjustment, which caps the mmap threshold at 32 MiB:
  // a 67 MB Adam temporary of mlp25m would still be mapped fresh every step.
  constexpr int kMmapThreshold = 1 << 30;
  constexpr int kTrimThreshold = std::numeric_limits<int>::max();
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace accel
