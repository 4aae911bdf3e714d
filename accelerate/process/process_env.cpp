#include "accelerate/process/process_env.hpp"

#include <charconv>
#include <cstdlib>

#include "foundation/error.hpp"

namespace accel {

std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  int out = 0;
  const char* end = v + std::char_traits<char>::length(v);
  auto [ptr, ec] = std::from_chars(v, end, out);
  if (ec != std::errc() || ptr != end)
    throw ConfigError("environment variable " + std::string(name) + "='" + v +
                      "' is not an integer");
  return out;
}

namespace {

bool has(const char* name) {
  const char* v = std::getenv(name);
  return v && *v;
}

// Reads rank/world (and the local ones) from one launcher's family of variables.
bool read_family(ProcessEnv& env, const char* source, const char* rank, const char* world,
                 const char* local_rank, const char* local_world, const char* node) {
  if (!has(rank)) return false;
  env.source = source;
  env.rank = env_int(rank, 0);
  env.world_size = env_int(world, 1);
  env.local_rank = env_int(local_rank, env.rank);
  env.local_world_size = env_int(local_world, env.world_size);
  env.node_rank = node ? env_int(node, 0) : 0;
  return true;
}

}  // namespace

ProcessEnv read_process_env() {
  ProcessEnv env;
  // Our launcher and torchrun first, then what mpirun, PMI launchers and srun set.
  read_family(env, "RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK") ||
      // Not OMPI_COMM_WORLD_NODE_RANK: despite its name that is a process's rank among those
      // on its node (like the local rank), not the node's index. See below.
      read_family(env, "OMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr) ||
      read_family(env, "PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                  nullptr) ||
      read_family(env, "SLURM", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                  "SLURM_NTASKS_PER_NODE", "SLURM_NODEID");

  // Open MPI names no node index; with its default by-slot mapping of equally many processes
  // per node, it is the rank divided by the processes per node.
  if (env.source == "OMPI" && env.local_world_size > 0)
    env.node_rank = env.rank / env.local_world_size;

  if (env.world_size < 1)
    throw ConfigError("world size from " + env.source + " variables is " +
                      std::to_string(env.world_size) + "; it must be at least 1");
  if (env.rank < 0 || env.rank >= env.world_size)
    throw ConfigError("rank " + std::to_string(env.rank) + " from " + env.source +
                      " variables is outside the world of " + std::to_string(env.world_size));
  env.master_addr = env_string("MASTER_ADDR", env.master_addr);
  env.master_port = env_int("MASTER_PORT", env.master_port);
  if (env.master_port < 1 || env.master_port > 65535)
    throw ConfigError("MASTER_PORT=" + std::to_string(env.master_port) +
                      " is not a TCP port (1-65535)");
  env.launcher_hosts_store = env_string("ACCEL_LAUNCHER_STORE", "0") == "1";
  return env;
}

}  // namespace accel
