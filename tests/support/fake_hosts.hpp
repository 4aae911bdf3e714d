#pragma once
// For workers of the hierarchical communicator's tests: one machine looks like several hosts
// (ACCEL_HOST_ID). claim_fake_host(H): rank r claims host r % H, so ranks are numbered round
// robin over the hosts. claim_fake_host_of("0,0,1,1"): rank r claims the r-th host listed
// (here hosts numbering their ranks in blocks, as `accel launch` does); returns the hosts.

#include <cstdlib>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace accel::test {

inline int fake_rank() {
  const char* rank = std::getenv("RANK");
  if (!rank) rank = std::getenv("OMPI_COMM_WORLD_RANK");  // under mpirun
  return rank ? std::atoi(rank) : 0;
}

inline void claim_fake_host(int hosts) {
  const std::string id = "fake-host-" + std::to_string(fake_rank() % hosts);
  setenv("ACCEL_HOST_ID", id.c_str(), 1);
}

inline int claim_fake_host_of(const std::string& list) {
  std::vector<std::string> host_of;
  std::stringstream in(list);
  for (std::string host; std::getline(in, host, ',');) host_of.push_back(host);
  const int rank = fake_rank();
  if (rank >= int(host_of.size()))
    throw std::invalid_argument("--fake_host_of " + list + " names no host for rank " +
                                std::to_string(rank));
  setenv("ACCEL_HOST_ID", ("fake-host-" + host_of[std::size_t(rank)]).c_str(), 1);
  return int(std::set<std::string>(host_of.begin(), host_of.end()).size());
}

}  // namespace accel::test
