#pragma once
// The run configuration `accel config` writes and `accel launch` reads: YAML with Hugging
// Face Accelerate's key names wherever a key means the same thing, so an Accelerate user's
// config is understood. One struct, one place that knows every key (config.cpp).
//
// Precedence, lowest to highest: detected default < config file < environment (ACCEL_<KEY>,
// e.g. ACCEL_NUM_PROCESSES) < command line. resolve_config() applies it and records where
// each value came from, for `accel config show` and the launcher's summary.

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace accel::config {

enum class DistributedType { NO, DATA_PARALLEL, MULTI_CPU, MULTI_GPU, ZERO };
enum class MixedPrecision { no, fp16, bf16 };
enum class Source { detected, config_file, environment, command_line };

std::string to_string(DistributedType);
std::string to_string(MixedPrecision);
std::string to_string(Source);  // "detected", "config file", "environment", "command line"

struct Config {
  std::string compute_environment = "LOCAL_MACHINE";
  DistributedType distributed_type = DistributedType::NO;
  int num_processes = 1;  // over all machines, as in Accelerate: each runs num_processes / num_machines
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip = "127.0.0.1";
  int main_process_port = 29500;  // 0 = pick a free port
  std::string gpu_ids = "all";    // "all" or a comma-separated list "0,1"
  MixedPrecision mixed_precision = MixedPrecision::no;
  int zero_stage = 0;                               // 1, 2 or 3 when distributed_type ZERO
  std::string offload_optimizer_device = "none";    // "none" or "cpu"
  std::string cpu_communicator = "gloo";            // "gloo" or "mpi" for CPU work
  int gradient_accumulation_steps = 1;
};

// A value given on the command line or in the environment, as text, keyed by YAML key name
// ("num_processes"). Parsed and validated exactly like the same key in a file.
using Overrides = std::map<std::string, std::string>;

struct ResolvedConfig {
  Config config;
  std::map<std::string, Source> sources;  // every key -> where its value came from
  std::optional<std::string> file;        // the config file read, if any
  std::vector<std::string> guesses;       // values that were detected, for the launcher's warnings
};

}  // namespace accel::config
