#pragma once
// init_process_group: joins this process to the job it was started in (the analogue of
// torch.distributed.init_process_group with init_method env://). Reads ProcessEnv, connects
// to the rendezvous store (hosting it on rank 0 when no launcher does) and creates the
// communicator. Precedence for each setting: the argument > environment > default.

#include <memory>
#include <optional>
#include <string>

#include "accelerate/process/process_env.hpp"
#include "backends/comm/communicator.hpp"

namespace accel {

class TcpStoreServer;

struct ProcessGroupOptions {
  // "local", "gloo", "mpi", "nccl", "shm", "hierarchical" or "auto" (shm when every rank is
  // on one host, hierarchical otherwise). Empty: ACCEL_COMM_BACKEND, else "auto" when the
  // world has several ranks and "local" when it has one.
  std::string backend;
  // Per operation and for joining. Unset: ACCEL_COMM_TIMEOUT (seconds), else kDefaultCommTimeout.
  std::optional<Milliseconds> timeout;
  std::string group_name = "world";
};

class ProcessGroup {
 public:
  // `counted`: one of this process's groups that talk to other processes (at most one lives
  // at a time; init_process_group refuses a second).
  ProcessGroup(ProcessEnv env, std::unique_ptr<TcpStoreServer> server, StorePtr store,
               CommunicatorPtr comm, bool counted = false);
  // Waits (briefly, bounded) for every rank to finish with the store before rank 0 stops
  // hosting it, so late readers are not cut off.
  ~ProcessGroup();

  const ProcessEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  Communicator& comm() { return *comm_; }
  const StorePtr& store() const { return store_; }  // null for backends without one (mpi)
  // A communicator of `backend` over some of the world's ranks (this one as `rank` of
  // `world_size`), rendezvousing on this group's store under `name`: collective among them.
  // Refused for a backend without a store (mpi).
  CommunicatorPtr subgroup(std::string_view backend, int rank, int world_size,
                           const std::string& name) const;
  // The settings the world's communicator was made with (the template of subgroup's).
  CommOptions comm_options;

 private:
  ProcessEnv env_;
  std::unique_ptr<TcpStoreServer> server_;
  StorePtr store_;
  CommunicatorPtr comm_;
  bool counted_ = false;
};

std::unique_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});

// The backend and timeout init_process_group would use, after precedence is applied.
std::string resolve_backend(const ProcessGroupOptions& options, const ProcessEnv& env);
Milliseconds resolve_timeout(const ProcessGroupOptions& options);

}  // namespace accel
