#pragma once
// --use_mpi: instead of forking the workers itself, `accel launch` runs one mpirun that starts
// them (on this machine, or on the hosts of --mpi_hostfile). The workers then find their
// rank and world in OMPI_COMM_WORLD_*; everything else the launcher would have set travels as
// mpirun -x NAME=VALUE.

#include <string>
#include <vector>

#include "launch/launch_options.hpp"
#include "launch/worker_env.hpp"

namespace accel::launch {

// The mpirun executable found in PATH, or "".
std::string find_mpirun_executable();

struct MpirunPlan {
  std::string mpirun;       // the executable
  int num_processes = 1;    // -np: the whole world
  int local_processes = 1;  // on this machine (decides --oversubscribe)
  EnvList env;              // passed with -x
  LaunchOptions options;    // hostfile, extra arguments, program
};

// The full command line. Adds --allow-run-as-root as root, --oversubscribe when this machine
// has fewer cores than local processes and no hostfile says otherwise, --bind-to none (MPI's
// default core binding would squeeze each worker's OpenMP threads onto one core), and
// --tag-output so every line names the rank it came from.
std::vector<std::string> mpirun_command(const MpirunPlan& plan);

}  // namespace accel::launch
