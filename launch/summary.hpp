#pragma once
// The text `accel launch` (and `accel env`) prints about what is in effect: every setting with
// where it came from, a warning per guessed value, and the environment defaults the launcher
// added for the workers with how to switch each off.

#include <string>
#include <vector>

#include "config/config.hpp"
#include "launch/worker_env.hpp"

namespace accel::launch {

// One line per setting that applies ("  num_processes    4    command line --num_processes"),
// then the config file read.
std::string describe_settings(const config::ResolvedConfig& resolved,
                              const std::string& indent = "  ");

// "warning: num_processes = 16 was guessed (...); choose it with --num_processes or in the config
// file"
std::vector<std::string> guess_warnings(const config::ResolvedConfig& resolved);

// One line per default the launcher added.
std::string describe_env_defaults(const std::vector<EnvDefault>& defaults,
                                  const std::string& indent = "  ");

}  // namespace accel::launch
