#pragma once
// The shared-memory communicator's segments in /dev/shm, for tests that check a job (even a
// killed one) leaves none: names accel-shm-<pid namespace>-<creator pid>-<nonce>. And whether
// an address of this process lies in one of them (symmetric memory).

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace accel::test {

inline std::set<std::string> shm_segments() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().starts_with("accel-shm-"))
      names.insert(e.path().filename().string());
  return names;
}

// Segments whose creator no longer runs: what a job leaks. Live processes' segments are not
// counted (ctest runs other tests that use the shm communicator at the same time).
inline std::set<std::string> leaked_shm_segments() {
  std::set<std::string> leaked;
  for (const std::string& name : shm_segments()) {
    unsigned long long ns = 0;
    int pid = 0;
    if (std::sscanf(name.c_str(), "accel-shm-%llu-%d-", &ns, &pid) == 2 && pid > 0 &&
        kill(pid, 0) != 0 && errno == ESRCH)
      leaked.insert(name);
  }
  return leaked;
}

// What leaked since `before` (leaked_shm_segments() then).
inline std::set<std::string> new_shm_leaks(const std::set<std::string>& before) {
  std::set<std::string> out;
  for (const std::string& name : leaked_shm_segments())
    if (!before.contains(name)) out.insert(name);
  return out;
}

// Whether `address` lies in a mapping of an accel-shm segment of this process (/proc/self/maps
// names it, "(deleted)" once unlinked).
inline bool in_shm_segment(const void* address) {
  const auto a = reinterpret_cast<unsigned long long>(address);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm/accel-shm-") == std::string::npos) continue;
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &lo, &hi) == 2 && a >= lo && a < hi) return true;
  }
  return false;
}

}  // namespace accel::test
