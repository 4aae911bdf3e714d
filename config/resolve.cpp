#include "config/resolve.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "config/config_file.hpp"
#include "config/layers.hpp"
#include "foundation/error.hpp"

namespace accel::config {
namespace detail {

void check_consistency(const ResolvedConfig& r) {
  for (const auto& spec : schema()) {
    const auto problem = consistency_problem(r.config, spec.name);
    if (!problem) continue;
    std::string message = r.origins.at(spec.name) + ": key '" + spec.name + "': " + *problem;
    // Where the other keys the rule looked at came from, when that was somewhere else
    // ("zero_stage 2 needs ZERO ...; distributed_type MULTI_GPU is from ...").
    for (const auto& other : spec.related) {
      const Source s = r.sources.at(other);
      if (s != Source::default_value && r.origins.at(other) != r.origins.at(spec.name) &&
          s != r.sources.at(spec.name))
        message +=
            "; " + other + " " + get_value(r.config, other) + " is from " + r.origins.at(other);
    }
    throw ConfigError(message);
  }
}

ResolvedConfig build_config(const Layer& given, const Hardware& hw, bool check) {
  ResolvedConfig out;
  Config& c = out.config;
  auto mark = [&](const std::string& key, Source source, const std::string& where) {
    out.sources[key] = source;
    out.origins[key] = where;
  };
  for (const auto& spec : schema()) mark(spec.name, Source::default_value, "default");
  for (const auto& [key, setting] : given) {
    set_value(c, key, setting.value);
    mark(key, setting.source, setting.where);
  }

  // Derived defaults, in dependency order: each may look at what was given or derived above.
  const std::string detected = "detected: " + describe(hw);
  auto derive = [&](const std::string& key, const std::string& value, Source source,
                    const std::string& where) {
    if (given.count(key) != 0) return;
    set_value(c, key, value);
    mark(key, source, where);
    if (source == Source::detected) out.guesses.push_back(key + " = " + value + " (" + where + ")");
  };
  const std::string implied = "implied by distributed_type ";
  {
    // The type follows what was asked for as well as the machine: `--num_processes 4` on one
    // GPU means 4 CPU processes, not NO (one process) contradicting the 4.
    const bool given_processes = given.count("num_processes") != 0;
    const bool cpu_only = given.count("use_cpu") != 0 ? c.use_cpu : hw.gpus == 0;
    const auto ids = gpu_id_list(c);
    const int gpus = ids.empty() ? hw.gpus : static_cast<int>(ids.size());
    const int per_machine = given_processes ? processes_per_machine(c) : 0;
    const bool several =
        c.num_machines > 1 ||
        (given_processes ? c.num_processes > 1 : (cpu_only ? hw.cpu_cores > 1 : gpus > 1));
    const char* type = !several   ? "NO"
                       : cpu_only ? "MULTI_CPU"
                       : (!given_processes || given.count("use_cpu") != 0 || per_machine <= gpus)
                           ? "MULTI_GPU"
                           : "MULTI_CPU";
    std::string why = detected;
    if (given_processes) why += "; " + std::to_string(c.num_processes) + " processes asked for";
    if (c.num_machines > 1) why += "; " + std::to_string(c.num_machines) + " machines";
    derive("distributed_type", type, Source::detected, why);
  }
  const std::string type = to_string(c.distributed_type);
  switch (c.distributed_type) {
    case DistributedType::MULTI_CPU:
      derive("use_cpu", "true", Source::default_value, implied + type);
      break;
    case DistributedType::MULTI_GPU:
      derive("use_cpu", "false", Source::default_value, implied + type);
      break;
    case DistributedType::NO:
    case DistributedType::ZERO:
    case DistributedType::DATA_PARALLEL:
      derive("use_cpu", hw.gpus == 0 ? "true" : "false", Source::detected, detected);
      break;
  }
  if (c.distributed_type == DistributedType::NO ||
      c.distributed_type == DistributedType::DATA_PARALLEL) {
    derive("num_processes", "1", Source::default_value, implied + type);
  } else {
    const auto ids = gpu_id_list(c);
    const int per_machine = !uses_gpu(c)   ? hw.cpu_cores
                            : !ids.empty() ? static_cast<int>(ids.size())
                                           : std::max(1, hw.gpus);
    const bool from_ids = uses_gpu(c) && !ids.empty();
    derive("num_processes", std::to_string(std::max(1, per_machine) * c.num_machines),
           from_ids ? Source::default_value : Source::detected,
           from_ids ? "one per GPU in gpu_ids" : detected);
  }
  derive("zero_stage", c.distributed_type == DistributedType::ZERO ? "2" : "0",
         Source::default_value, "default");

  if (check) check_consistency(out);
  return out;
}

}  // namespace detail

ResolvedConfig resolve_config(const std::optional<std::string>& config_file_flag,
                              const Overrides& command_line) {
  detail::Layer layer;
  std::optional<std::string> file;
  std::vector<std::string> notes;

  std::string path;
  bool must_exist = true;
  if (config_file_flag && !config_file_flag->empty()) {
    path = *config_file_flag;
  } else if (const char* env = std::getenv("ACCEL_CONFIG_FILE"); env != nullptr && *env != '\0') {
    path = env;  // named on purpose, like the flag: a missing file is a mistake worth reporting
  } else {
    path = default_config_path();
    must_exist = false;
  }
  std::error_code ec;
  if (must_exist || std::filesystem::exists(path, ec)) {
    auto read = detail::read_config_file(path);
    layer = std::move(read.settings);
    notes = std::move(read.notes);
    file = path;
  }

  // An empty variable counts as unset: `ACCEL_NUM_PROCESSES= accel launch ...` is the shell's
  // way of switching one off.
  for (const auto& spec : schema()) {
    const std::string var = env_var_for(spec.name);
    const char* value = std::getenv(var.c_str());
    if (value == nullptr || *value == '\0') continue;
    const std::string where = "environment variable " + var;
    layer[spec.name] = {parse_value_or_throw(spec.name, value, where), Source::environment, where};
  }
  for (const auto& [key, value] : command_line) {
    const std::string where = "command line " + flag_for(key);
    if (find_key(key) == nullptr) throw ConfigError(where + ": " + unknown_key_problem(key));
    layer[key] = {parse_value_or_throw(key, value, where), Source::command_line, where};
  }

  auto out = detail::build_config(layer, detect_hardware(), true);
  out.file = file;
  out.notes = std::move(notes);
  return out;
}

Config defaults_for(const Hardware& hw) { return detail::build_config({}, hw, false).config; }

Config detect_defaults() { return defaults_for(detect_hardware()); }

std::vector<std::pair<std::string, std::string>> to_environment(const Config& c) {
  std::vector<std::pair<std::string, std::string>> env;
  for (const auto& spec : schema())
    if (is_written(c, spec.name)) env.emplace_back(env_var_for(spec.name), get_value(c, spec.name));
  return env;
}

}  // namespace accel::config
