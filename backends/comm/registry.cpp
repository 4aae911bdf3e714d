#include "backends/comm/registry.hpp"

#include "backends/comm/local_communicator.hpp"
#include "foundation/error.hpp"
#if ACCEL_HAVE_GLOO
#include "backends/comm/gloo/gloo_communicator.hpp"
#endif
#if ACCEL_HAVE_MPI
#include "backends/comm/mpi/mpi_communicator.hpp"
#endif
#if ACCEL_HAVE_NCCL
#include "backends/comm/nccl/nccl_communicator.hpp"
#endif
#if ACCEL_HAVE_SHM
#include "backends/comm/shm/hierarchical_communicator.hpp"
#include "backends/comm/shm/host_identity.hpp"
#include "backends/comm/shm/shm_communicator.hpp"
#include "foundation/store/prefix_store.hpp"
#endif

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

namespace accel {
namespace {

struct Entry {
  std::string_view name;
  bool built;
  std::string_view option;  // the CMake option that builds it
  CommunicatorPtr (*make)(const CommOptions&);
};

template <typename T>
CommunicatorPtr make(const CommOptions& options) {
  return std::make_unique<T>(options);
}

CommunicatorPtr make_local(const CommOptions& options) {
  ACCEL_CHECK_ARG(options.world_size == 1,
                  "the 'local' communicator is the world of one; world size " +
                      std::to_string(options.world_size) + " needs gloo, mpi or nccl");
  return std::make_unique<LocalCommunicator>(options.timeout);
}

#if ACCEL_HAVE_SHM
// Every rank's host, through the store under "<backend>/<group>/".
std::vector<int> hosts_of(std::string_view backend, const CommOptions& options) {
  ACCEL_CHECK_ARG(options.store != nullptr,
                  "the '" + std::string(backend) + "' communicator needs a rendezvous store");
  auto store =
      std::make_shared<PrefixStore>(std::string(backend) + "/" + options.group_name, options.store);
  return shm::exchange_hosts(store, options.rank, options.world_size, options.timeout);
}

// What carries the hierarchical communicator's traffic between hosts: MPI when this job is an
// MPI world with the same ranks (mpirun, `accel launch --use_mpi`), Gloo otherwise;
// ACCEL_HIERARCHICAL_BETWEEN_HOSTS (gloo or mpi) chooses explicitly.
bool mpi_between_hosts(const CommOptions& options) {
  const char* variable = std::getenv("ACCEL_HIERARCHICAL_BETWEEN_HOSTS");
  const std::string chosen = variable ? variable : "";
  if (chosen == "gloo") return false;
  if (chosen == "mpi") {
#if !ACCEL_HAVE_MPI
    throw InvalidArgument(
        "ACCEL_HIERARCHICAL_BETWEEN_HOSTS=mpi, but the mpi communicator is not built "
        "(ACCEL_WITH_MPI)");
#endif
    return true;
  }
  if (!chosen.empty())
    throw InvalidArgument("ACCEL_HIERARCHICAL_BETWEEN_HOSTS is '" + chosen +
                          "'; expected gloo or mpi");
#if ACCEL_HAVE_MPI
  const std::pair<const char*, const char*> families[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, {"PMI_RANK", "PMI_SIZE"}};
  for (const auto& [rank, size] : families) {
    const char* r = std::getenv(rank);
    const char* n = std::getenv(size);
    if (r && n) return std::atoi(r) == options.rank && std::atoi(n) == options.world_size;
  }
#endif
  (void)options;
  return false;
}

HierarchicalCommunicator::Factory between_hosts(bool mpi) {
  return [mpi](const CommOptions& options, const std::vector<int>& members) -> CommunicatorPtr {
#if ACCEL_HAVE_MPI
    if (mpi) return std::make_unique<MpiCommunicator>(options, members);
#endif
    (void)mpi;
    (void)members;
#if ACCEL_HAVE_GLOO
    return std::make_unique<GlooCommunicator>(options);
#else
    (void)options;
    throw InvalidArgument(
        "the hierarchical communicator needs gloo between hosts (ACCEL_WITH_GLOO), or mpi "
        "under mpirun");
#endif
  };
}

CommunicatorPtr make_hierarchical(const CommOptions& options) {
  return std::make_unique<HierarchicalCommunicator>(options, hosts_of("hierarchical", options),
                                                    between_hosts(mpi_between_hosts(options)));
}

// Shared memory when every rank is on this host, the hierarchical composite otherwise.
CommunicatorPtr make_auto(const CommOptions& options) {
  if (options.world_size == 1) return std::make_unique<LocalCommunicator>(options.timeout);
  std::vector<int> hosts = hosts_of("auto", options);
  const bool one_host = std::all_of(hosts.begin(), hosts.end(), [](int h) { return h == 0; });
  if (one_host) return std::make_unique<ShmCommunicator>(options);
  return std::make_unique<HierarchicalCommunicator>(options, std::move(hosts),
                                                    between_hosts(mpi_between_hosts(options)));
}
#elif ACCEL_HAVE_GLOO
// Built without shared memory, "auto" is Gloo.
CommunicatorPtr make_auto(const CommOptions& options) {
  if (options.world_size == 1) return std::make_unique<LocalCommunicator>(options.timeout);
  return std::make_unique<GlooCommunicator>(options);
}
#endif

const Entry kEntries[] = {
    {"local", true, "", &make_local},
#if ACCEL_HAVE_GLOO
    {"gloo", true, "ACCEL_WITH_GLOO", &make<GlooCommunicator>},
#else
    {"gloo", false, "ACCEL_WITH_GLOO", nullptr},
#endif
#if ACCEL_HAVE_MPI
    {"mpi", true, "ACCEL_WITH_MPI", &make<MpiCommunicator>},
#else
    {"mpi", false, "ACCEL_WITH_MPI", nullptr},
#endif
#if ACCEL_HAVE_NCCL
    {"nccl", true, "ACCEL_WITH_NCCL", &make<NcclCommunicator>},
#else
    {"nccl", false, "ACCEL_WITH_NCCL", nullptr},
#endif
#if ACCEL_HAVE_SHM
    {"shm", true, "ACCEL_WITH_SHM", &make<ShmCommunicator>},
    {"hierarchical", true, "ACCEL_WITH_SHM", &make_hierarchical},
#else
    {"shm", false, "ACCEL_WITH_SHM", nullptr},
    {"hierarchical", false, "ACCEL_WITH_SHM", nullptr},
#endif
#if ACCEL_HAVE_SHM || ACCEL_HAVE_GLOO
    {"auto", true, "", &make_auto},
#else
    {"auto", false, "ACCEL_WITH_SHM or ACCEL_WITH_GLOO", nullptr},
#endif
};

}  // namespace

CommunicatorPtr create_communicator(std::string_view backend, const CommOptions& options) {
  for (const Entry& e : kEntries) {
    if (e.name != backend) continue;
    if (!e.built)
      throw InvalidArgument("communicator '" + std::string(backend) +
                            "' is not built into this accelerate-cpp (configure with " +
                            std::string(e.option) + "=ON and its dependency installed)");
    return e.make(options);
  }
  std::string known;
  for (const Entry& e : kEntries) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw InvalidArgument("unknown communicator '" + std::string(backend) + "' (known: " + known +
                        ")");
}

std::vector<std::string> available_communicators() {
  std::vector<std::string> names;
  for (const Entry& e : kEntries)
    if (e.built) names.emplace_back(e.name);
  return names;
}

std::vector<std::pair<std::string, std::string>> communicator_library_versions() {
  std::vector<std::pair<std::string, std::string>> out;
#if ACCEL_HAVE_MPI
  out.emplace_back("MPI library", mpi_library_version());
#endif
#if ACCEL_HAVE_NCCL
  out.emplace_back("NCCL library", nccl_library_version());
  out.emplace_back("CUDA", cuda_summary());
#endif
  return out;
}

bool communicator_available(std::string_view backend) {
  for (const Entry& e : kEntries)
    if (e.name == backend) return e.built;
  return false;
}

}  // namespace accel
