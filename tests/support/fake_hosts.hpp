#pragma once
// For workers of the hierarchical communicator's tests: rank r claims host r % hosts
// (ACCEL_HOST_ID), so one machine looks like `hosts` hosts with interleaved ranks.

#include <cstdlib>
#include <string>

namespace accel::test {

inline void claim_fake_host(int hosts) {
  const char* rank = std::getenv("RANK");
  if (!rank) rank = std::getenv("OMPI_COMM_WORLD_RANK");  // under mpirun
  const std::string id = "fake-host-" + std::to_string((rank ? std::atoi(rank) : 0) % hosts);
  setenv("ACCEL_HOST_ID", id.c_str(), 1);
}

}  // namespace accel::test
