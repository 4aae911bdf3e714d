#include "launch/reaper.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

namespace accel::launch {
namespace {

using Clock = std::chrono::steady_clock;

struct ProcInfo {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgrp = 0;
  char state = '?';
};

// Every process /proc shows us: pid, parent, process group and state, from /proc/PID/stat
// ("pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses, so fields are
// read after its last ')').
std::vector<ProcInfo> all_processes() {
  std::vector<ProcInfo> out;
  DIR* dir = opendir("/proc");
  if (!dir) return out;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end != '\0' || pid <= 0) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string text;
    if (!std::getline(in, text)) continue;  // it exited meanwhile
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 1));
    ProcInfo p;
    p.pid = pid_t(pid);
    fields >> p.state >> p.ppid >> p.pgrp;
    if (fields) out.push_back(p);
  }
  closedir(dir);
  return out;
}

}  // namespace

bool become_child_subreaper() { return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0; }

std::vector<pid_t> leftover_processes(const std::vector<pid_t>& process_groups, bool children) {
  const pid_t self = getpid();
  const std::vector<ProcInfo> procs = all_processes();
  std::set<pid_t> found;
  const std::set<pid_t> groups(process_groups.begin(), process_groups.end());
  for (const ProcInfo& p : procs)
    if (p.state != 'Z' && p.pid != self && groups.count(p.pgrp)) found.insert(p.pid);
  if (children) {
    std::multimap<pid_t, const ProcInfo*> by_parent;
    for (const ProcInfo& p : procs) by_parent.emplace(p.ppid, &p);
    std::vector<pid_t> todo{self};
    while (!todo.empty()) {
      const pid_t parent = todo.back();
      todo.pop_back();
      auto [lo, hi] = by_parent.equal_range(parent);
      for (auto it = lo; it != hi; ++it) {
        const ProcInfo& p = *it->second;
        if (p.pid == self) continue;
        todo.push_back(p.pid);
        if (p.state != 'Z') found.insert(p.pid);
      }
    }
  }
  return {found.begin(), found.end()};
}

void reap_exited_children() {
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

std::size_t end_leftovers(const std::vector<pid_t>& process_groups, bool children,
                          std::chrono::milliseconds grace) {
  const auto term_until = Clock::now() + grace;
  const auto give_up_at = term_until + std::chrono::seconds(5);
  std::vector<pid_t> left = leftover_processes(process_groups, children);
  bool termed = false;
  while (!left.empty()) {
    // Polite first, so a leftover can clean up; then certain. Each round also catches the
    // children of a killed process, reparented to us meanwhile.
    const int sig = (!termed || Clock::now() < term_until) ? SIGTERM : SIGKILL;
    if (sig == SIGKILL || !termed)
      for (pid_t pid : left) kill(pid, sig);
    termed = true;
    if (Clock::now() > give_up_at) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (children) reap_exited_children();
    left = leftover_processes(process_groups, children);
  }
  if (children) reap_exited_children();
  return left.size();
}

}  // namespace accel::launch
