#include "accelerate/malloc_tuning.hpp"

#include <cstdlib>
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
  // glibc refuses a threshold above half its heap size (32 MiB on 64-bit); setting one also
  // stops its dynamic adjustment, so both are set.
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kTrimThreshold = 1 << 30;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace accel
