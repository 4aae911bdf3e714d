#pragma once
// Internal to accel_config: values as given (by a file, the environment, the command line or
// the wizard), already parsed by the schema, and the one function that puts defaults under
// them and checks the keys against each other. The loader, resolve_config and the wizard
// all end in build_config, so they agree on defaults and on what is consistent.

#include <map>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/detect.hpp"

namespace accel::config::detail {

struct Setting {
  std::string value;  // canonical, as parse_value returned it
  Source source;
  std::string where;  // "/path/cfg.yaml:3", "environment variable ACCEL_X", "command line --x"
};
using Layer = std::map<std::string, Setting>;

// Keys missing from `given` get their defaults (built in, or derived from `hw` and the given
// distributed_type, use_cpu, num_machines and gpu_ids). With `check`, the first key (in
// schema order) that contradicts the others throws ConfigError "WHERE: key 'K': PROBLEM".
ResolvedConfig build_config(const Layer& given, const Hardware& hw, bool check);

// Throws ConfigError for the first key of `resolved` that contradicts the others.
void check_consistency(const ResolvedConfig& resolved);

struct FileSettings {
  Layer settings;
  std::vector<std::string> notes;  // "/p:7: key 'debug': ... ignored"
};
// Reads and parses a config file key by key (no defaults, no cross-key checks).
FileSettings read_config_file(const std::string& path);

}  // namespace accel::config::detail
