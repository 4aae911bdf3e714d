#include "backends/comm/shm/host_identity.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "foundation/error.hpp"

namespace accel::shm {
namespace {

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string inode_of(const char* path) {
  struct stat st {};
  return stat(path, &st) == 0 ? std::to_string(st.st_ino) : "?";
}

}  // namespace

std::string host_identity() {
  if (const char* forced = std::getenv("ACCEL_HOST_ID"); forced && *forced) return forced;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return std::string(name) + "/" + first_line("/proc/sys/kernel/random/boot_id") +
         "/ipc:" + inode_of("/proc/self/ns/ipc") + "/pid:" + inode_of("/proc/self/ns/pid");
}

std::vector<int> exchange_hosts(const StorePtr& store, int rank, int world, Milliseconds timeout) {
  store->set("host/" + std::to_string(rank), host_identity());
  std::vector<int> host(world);
  std::map<std::string, int> index;
  for (int r = 0; r < world; ++r) {
    std::string id;
    try {
      id = store->get("host/" + std::to_string(r), timeout);
    } catch (const TimeoutError&) {
      throw TimeoutError("rank " + std::to_string(rank) + ": timed out after " +
                         std::to_string(timeout.count()) + " ms waiting for rank " +
                         std::to_string(r) + " to say which host it is on");
    }
    host[r] = index.emplace(id, int(index.size())).first->second;
  }
  return host;
}

}  // namespace accel::shm
