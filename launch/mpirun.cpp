#include "launch/mpirun.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "foundation/host_cores.hpp"

namespace accel::launch {

std::string find_mpirun_executable() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const auto end = dirs.find(':', start);
    const std::string dir =
        dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!dir.empty()) {
      const auto candidate = std::filesystem::path(dir) / "mpirun";
      if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

std::vector<std::string> mpirun_command(const MpirunPlan& plan) {
  std::vector<std::string> argv{plan.mpirun};
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  const bool hostfile = !plan.options.mpi_hostfile.empty();
  if (hostfile) {
    argv.push_back("--hostfile");
    argv.push_back(plan.options.mpi_hostfile);
  } else if (plan.local_processes > usable_cores()) {
    argv.push_back("--oversubscribe");
  }
  argv.insert(argv.end(),
              {"--bind-to", "none", "--tag-output", "-np", std::to_string(plan.num_processes)});
  // mpirun decides these per process; our single-machine values would be wrong.
  static const std::set<std::string> mpi_decides = {
      "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "RANK", "LOCAL_RANK"};
  for (const auto& [name, value] : plan.env)
    if (!mpi_decides.count(name)) {
      argv.push_back("-x");
      argv.push_back(name + "=" + value);
    }
  argv.insert(argv.end(), plan.options.mpirun_args.begin(), plan.options.mpirun_args.end());
  argv.insert(argv.end(), plan.options.program.begin(), plan.options.program.end());
  return argv;
}

}  // namespace accel::launch
