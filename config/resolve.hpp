#pragma once
// The config in effect: detected defaults < config file < ACCEL_<KEY> environment variables
// < command line, each value parsed by the schema and the whole checked for consistency.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "config/detect.hpp"

namespace accel::config {

// config_file_flag: --config_file, which must exist. Without it: $ACCEL_CONFIG_FILE (must
// exist too), else the default location if a file is there (config/config_file.hpp).
// command_line: YAML key -> text, e.g. {"num_processes", "4"}; errors name "--num_processes".
ResolvedConfig resolve_config(const std::optional<std::string>& config_file_flag,
                              const Overrides& command_line);

// What this machine suggests with nothing configured: MULTI_GPU with one process per GPU when
// there are 2+, NO on the one GPU, MULTI_CPU over gloo with one process per core without GPUs
// (NO on a single core).
Config detect_defaults();
Config defaults_for(const Hardware& hw);

// The chosen settings as ACCEL_<KEY>=value pairs for the workers (the names resolve_config
// reads), for every key that applies to this config (is_written).
std::vector<std::pair<std::string, std::string>> to_environment(const Config&);

}  // namespace accel::config
