#pragma once
// The one place communicators are registered by name. A backend compiled out (its
// ACCEL_WITH_* option off) is still known by name, so asking for it gives a clear error
// saying how it was built, not "unknown".

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/comm/communicator.hpp"

namespace accel {

// "local" (the world of one), "gloo", "mpi", "nccl", "shm" (ranks on one host),
// "hierarchical" (shm inside each host, gloo between hosts) and "auto" (shm when every rank
// is on one host, else hierarchical; gloo when built without shm).
CommunicatorPtr create_communicator(std::string_view backend, const CommOptions& options);

// Names of the communicators built into this library.
std::vector<std::string> available_communicators();
bool communicator_available(std::string_view backend);

// What the built communicators' libraries say about themselves at run time, for `accel env`:
// {"MPI library", "Open MPI v4.1.4, ..."}, {"NCCL", "2.21.5"}, {"CUDA", "runtime 13.0, ..."}.
std::vector<std::pair<std::string, std::string>> communicator_library_versions();

}  // namespace accel
