#pragma once
// Which ranks can share memory: the same kernel (boot id), the same /dev/shm (IPC namespace)
// and the same pids (pid namespace). ACCEL_HOST_ID replaces it, so tests can make one machine
// look like several hosts.

#include <string>
#include <vector>

#include "foundation/store/store.hpp"

namespace accel::shm {

std::string host_identity();

// Every rank's host, exchanged through the store (keys "host/<rank>"): a host index per rank,
// hosts numbered in order of their lowest rank.
std::vector<int> exchange_hosts(const StorePtr& store, int rank, int world, Milliseconds timeout);

}  // namespace accel::shm
