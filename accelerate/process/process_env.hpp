#pragma once
// Who this process is in the job, read from what started it: `accel launch` or torchrun
// (RANK, WORLD_SIZE, ...), OpenMPI's mpirun (OMPI_COMM_WORLD_*), a PMI launcher (PMI_*), or
// Slurm's srun (SLURM_*). Without any of them: rank 0 of a world of one.

#include <string>

namespace accel {

struct ProcessEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // True when `accel launch` hosts the rendezvous store; otherwise rank 0 hosts it.
  bool launcher_hosts_store = false;
  // Where rank and world came from: "RANK", "OMPI", "PMI", "SLURM" or "default".
  std::string source = "default";
};

// Throws ConfigError naming the variable when one is set but malformed or inconsistent.
ProcessEnv read_process_env();

// The value of an integer environment variable, or fallback when unset; ConfigError names
// the variable and the value when it is not an integer.
int env_int(const char* name, int fallback);
std::string env_string(const char* name, const std::string& fallback);

}  // namespace accel
