#pragma once
// Helpers for tests that simulate machines with network namespaces (launch_multinode_test,
// launch_elastic_test): the `ip` command, quiet shell commands, and the removal of
// namespaces an earlier, killed run left (their names carry its pid).

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace accel::test {

// The `ip` command (iproute2), or "" when it is not installed.
inline std::string find_ip() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// Runs a command quietly; true when it exited 0.
inline bool run_quietly(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// Why namespaces cannot be made here, or "" when they can be tried.
inline std::string netns_unavailable(const std::string& ip) {
  if (ip.empty()) return "the `ip` command (iproute2) is not installed";
  if (geteuid() != 0) return "creating network namespaces needs root (CAP_NET_ADMIN)";
  return "";
}

// Deletes the namespaces named `<prefix><pid>_...` whose pid no longer runs.
inline void remove_stale_namespaces(const std::string& ip, const std::string& prefix) {
  FILE* list = popen((ip + " netns list 2>/dev/null").c_str(), "r");
  if (!list) return;
  char line[256];
  while (std::fgets(line, sizeof(line), list)) {
    char name[64] = {};
    if (std::sscanf(line, "%63s", name) != 1) continue;
    const std::string n = name;
    if (!n.starts_with(prefix)) continue;
    const int pid = std::atoi(n.c_str() + prefix.size());
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) run_quietly(ip + " netns del " + n);
  }
  pclose(list);
}

}  // namespace accel::test
