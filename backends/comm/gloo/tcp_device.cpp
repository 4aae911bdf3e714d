#include "backends/comm/gloo/tcp_device.hpp"

#include <dirent.h>
#include <sched.h>

#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <vector>

#include "foundation/env_value.hpp"

namespace accel {
namespace {

// This process's thread ids, sorted (empty when /proc cannot be read).
std::vector<int> thread_ids() {
  std::vector<int> ids;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* entry = readdir(dir))
      if (entry->d_name[0] != '.') ids.push_back(std::atoi(entry->d_name));
    closedir(dir);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

std::shared_ptr<gloo::transport::Device> make_tcp_device(const std::string& hostname) {
  const bool batch = env_uint("ACCEL_GLOO_LOOP_BATCH", 1, 0, 1) == 1;
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  // One device at a time, so ranks made on threads of one process tell their threads apart.
  static std::mutex creating;
  std::vector<int> started;
  std::shared_ptr<gloo::transport::Device> device;
  {
    std::lock_guard lock(creating);
    const std::vector<int> before = thread_ids();
    device = gloo::transport::tcp::CreateDevice(attr);
    std::ranges::set_difference(thread_ids(), before, std::back_inserter(started));
  }
  // The device started exactly one thread; if another thread of the process started at the
  // same moment, which is which is unknown, and the loop thread is left as it is.
  if (started.size() != 1) return device;
  const int loop = started.front();
  std::ofstream("/proc/self/task/" + std::to_string(loop) + "/comm") << "accel-gloo-io";
  if (batch) {
    const sched_param param{};
    // Best effort: where the policy cannot be set, the thread only keeps Gloo's behaviour.
    sched_setscheduler(loop, SCHED_BATCH, &param);
  }
  return device;
}

}  // namespace accel
