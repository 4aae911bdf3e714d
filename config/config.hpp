#pragma once
// The run configuration `accel config` writes and `accel launch` reads: YAML with Hugging
// Face Accelerate's key names wherever a key means the same thing, so an Accelerate user's
// config is understood. One struct, and one table that knows every key (config.cpp): its
// type, allowed values, default and help. The file loader, the environment and command-line
// overrides, the wizard and `accel config show` all parse and check values through it.
//
// Precedence, lowest to highest: default (built in, or detected from this machine) < config
// file < environment (ACCEL_<KEY>, e.g. ACCEL_NUM_PROCESSES) < command line (--<key>).
// resolve_config() (config/resolve.hpp) applies it and records where each value came from.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace accel::config {

enum class DistributedType { NO, DATA_PARALLEL, MULTI_CPU, MULTI_GPU, ZERO };
enum class MixedPrecision { no, fp16, bf16 };
enum class AutoWrapPolicy { TRANSFORMER_BASED_WRAP, NO_WRAP };     // FSDP's names
enum class StateDictType { FULL_STATE_DICT, SHARDED_STATE_DICT };  // FSDP's names
// default_value: built in (main_process_port 29500); detected: derived from this machine's
// GPUs and cores (num_processes); the others: given by the user.
enum class Source { default_value, detected, config_file, environment, command_line };

std::string to_string(DistributedType);
std::string to_string(MixedPrecision);
std::string to_string(AutoWrapPolicy);
std::string to_string(StateDictType);
std::string to_string(
    Source);  // "default", "detected", "config file", "environment", "command line"

struct Config {
  std::string compute_environment = "LOCAL_MACHINE";
  DistributedType distributed_type = DistributedType::NO;
  int num_processes =
      1;  // over all machines, as in Accelerate: each runs num_processes / num_machines
  int num_machines = 1;
  // Elastic jobs (torchrun's --nnodes MIN:MAX, --rdzv_backend c10d): rounds of the machines
  // that come, between min_machines (0: num_machines) and num_machines, ranked as they join.
  int min_machines = 0;
  std::string rdzv_backend = "static";  // static: each machine's machine_rank; c10d: elastic
  int machine_rank = 0;
  std::string main_process_ip = "127.0.0.1";
  int main_process_port = 29500;  // 0 = pick a free port
  // Run on CPU although GPUs exist. Implied by MULTI_CPU (true) and MULTI_GPU (false); it
  // decides the device for NO, ZERO and DATA_PARALLEL (replicas on GPUs or CPU threads).
  bool use_cpu = false;
  std::string gpu_ids = "all";  // "all" or a comma-separated list "0,1"
  MixedPrecision mixed_precision = MixedPrecision::no;
  int zero_stage = 0;  // a stage (kMinZeroStage..kMaxZeroStage) with ZERO; 0 otherwise
  std::string offload_optimizer_device = "none";  // "none" or "cpu" (ZERO only)
  // zero_stage 3: parameters under this many elements stay gathered (DeepSpeed's
  // stage3_param_persistence_threshold), and whether a unit is freed after its forward
  // (FSDP's reshard_after_forward).
  int zero3_param_persistence_threshold = 100000;
  bool reshard_after_forward = true;
  // ZERO: shard over each machine's processes and replicate across machines (FSDP's
  // HYBRID_SHARD): the collectives of the sharding stay inside the machine.
  bool hybrid_shard = false;
  // LibTorch: a prepared torch::nn::Sequential runs each child, and each ShardedUnit block
  // runs, through activation checkpointing (recomputed in backward).
  bool activation_checkpointing = false;
  // zero_stage 3, LibTorch: TRANSFORMER_BASED_WRAP makes each child of the model's ModuleLists
  // and Sequentials a unit (gathered when first used); NO_WRAP keeps the root (and any
  // ShardedUnit blocks) the only units (FSDP's auto_wrap_policy).
  AutoWrapPolicy auto_wrap_policy = AutoWrapPolicy::TRANSFORMER_BASED_WRAP;
  // LibTorch checkpoints: the model as one LibTorch archive written by rank 0
  // (FULL_STATE_DICT), or each rank's own slices and the layout that reshards them, merged by
  // accel merge-weights (SHARDED_STATE_DICT: nothing gathered at save). FSDP's state_dict_type.
  StateDictType state_dict_type = StateDictType::FULL_STATE_DICT;
  // Experiment tracking (Accelerate's names): the trackers init_trackers starts (none;
  // tensorboard, csv, jsonl, mlflow, or all, comma-separated), the project's directory and where
  // the trackers write (project_dir when empty).
  std::string log_with = "none";
  std::string project_dir = ".";
  std::string logging_dir;
  // Project checkpoints (Accelerate's ProjectConfiguration): save_state() without a directory
  // writes project_dir/checkpoints/checkpoint_<i>; total_limit keeps the newest N (0: all).
  bool automatic_checkpoint_naming = false;
  int total_limit = 0;
  // The samples of one step over all processes, whatever their number (elastic jobs): every
  // sampler's per-process batch becomes global_batch_size / num_processes (0: the loop's).
  int global_batch_size = 0;
  // Each machine keeps its own copy of every checkpoint (no shared filesystem): the shared
  // files from its first process, its processes' own files (Accelerate's save_on_each_node).
  bool save_on_each_node = false;
  // Progress bars (Accelerator::progress, the accel commands) off on every process.
  bool disable_progress_bar = false;
  // "auto" (shm on one machine, hierarchical across machines), "gloo", "mpi", "shm" or
  // "hierarchical" for CPU work
  std::string cpu_communicator = "auto";
  // DATA_PARALLEL on the CPU: replicas (worker threads) in the one process; 0 = one per core.
  int data_parallel_replicas = 0;
  int gradient_accumulation_steps = 1;
  // Pipeline parallelism (DeepSpeed's pipeline engine; accel::TorchPipeline): the model split
  // into pipeline_parallel_size stages, each step's batch into num_microbatches, run by
  // pipeline_schedule (GPIPE, 1F1B, INTERLEAVED_1F1B with pipeline_chunks model chunks per
  // stage, ZERO_BUBBLE); the layers split by partition_method (parameters, uniform, profile).
  int pipeline_parallel_size = 1;
  int num_microbatches = 1;
  std::string pipeline_schedule = "1F1B";
  int pipeline_chunks = 1;
  std::string partition_method = "parameters";
};

// The most processes one machine runs (num_processes / num_machines): more than any machine
// has cores or GPUs, and few enough that the launcher's descriptors and process table hold.
inline constexpr int kMaxProcessesPerMachine = 1024;

// What a config implies, so every consumer derives it the same way.
int processes_per_machine(const Config&);  // num_processes / num_machines
// An elastic job: rdzv_backend c10d, or min_machines below num_machines.
bool is_elastic(const Config&);
int fewest_machines(const Config&);  // min_machines, or num_machines when 0
bool uses_gpu(const Config&);        // MULTI_GPU, or NO/ZERO/DATA_PARALLEL without use_cpu
// The communicator the workers use: "nccl" for GPU work across processes, cpu_communicator
// for CPU work across processes, "local" for one process (NO, DATA_PARALLEL).
std::string comm_backend(const Config&);
// GPU ids as numbers; empty for "all".
std::vector<int> gpu_id_list(const Config&);

// A value given on the command line or in the environment, as text, keyed by YAML key name
// ("num_processes"). Parsed and validated exactly like the same key in a file.
using Overrides = std::map<std::string, std::string>;

struct ResolvedConfig {
  Config config;
  std::map<std::string, Source> sources;  // every key -> where its value came from
  // every key -> the same in words: "/home/u/.config/accelerate-cpp/default_config.yaml:3",
  // "environment variable ACCEL_NUM_PROCESSES", "command line --num_processes",
  // "detected: 16 CPU cores, no GPU", "default".
  std::map<std::string, std::string> origins;
  std::optional<std::string> file;  // the config file read, if any
  // Keys whose value was detected from this machine, for warnings: "KEY = VALUE (WHY)", e.g.
  // "num_processes = 16 (detected: 16 CPU cores, no GPU)"; the key is the first word.
  std::vector<std::string> guesses;
  std::vector<std::string> notes;  // Accelerate keys that were read and ignored
};

// ---- The schema: one entry per key, in the order files and `accel config show` list them.
// Each key is declared once, in config.cpp's table: its name, type, range, default, help,
// where it lives in Config, when it applies, how it is checked against the other keys and
// the wizard's question. Parsing, printing, ACCEL_<KEY>, --<key>, `accel launch --help`'s
// value hints and the wizard's menus are all derived from that entry.

enum class ValueKind { text, integer, boolean, choice };

// The ZeRO stages that exist (backends/zero/): the schema's range, and through it the
// wizard's menu, `accel launch --help` and the error for any other stage.
inline constexpr int kMinZeroStage = 1;
inline constexpr int kMaxZeroStage = 3;

// Where a key's value lives in Config.
using Field =
    std::variant<std::string Config::*, int Config::*, bool Config::*, DistributedType Config::*,
                 MixedPrecision Config::*, AutoWrapPolicy Config::*, StateDictType Config::*>;

// One answer the wizard's menu offers.
struct Option {
  std::string value;  // canonical, as the schema spells it ("MULTI_CPU", "true")
  std::string label;  // what the user reads
  int number = 0;     // what the user types to pick it
};

struct KeySpec {
  std::string name;  // YAML key: "num_processes"
  ValueKind kind;
  Field field;
  std::vector<std::string> aliases;  // other flags for the key, torchrun's names ("nnodes")
  std::vector<std::string> choices;  // for choice: the canonical spellings (an enum's names)
  int min_value = 0;                 // for integer
  int max_value = 0;
  std::string range_text;  // "a TCP port (0-65535)": the end of "70000 is not ..."
  // How the default is derived when it is not a fixed value ("true when no GPU is found");
  // "" = the fixed value Config's member initializer gives. See default_text().
  std::string default_rule;
  std::string help;
  std::string flag_value;  // what --KEY takes in `accel launch --help` ("N"); "" = derived
  // The wizard's question ("" = never asked); "{last_machine}" becomes num_machines - 1.
  std::string question;
  std::vector<Option> options;               // its menu; empty = a free-text answer
  bool (*applies)(const Config&) = nullptr;  // is_written; nullptr = always
  std::optional<std::string> (*check)(const Config&) = nullptr;  // consistency_problem
  std::vector<std::string> related;  // the other keys `check` looks at, for error origins
};

const std::vector<KeySpec>& schema();
// log_with's trackers in order, each once: "all" as tensorboard, csv, jsonl, mlflow; "none"
// as nothing.
std::vector<std::string> log_with_names(std::string_view log_with);
const KeySpec* find_key(std::string_view name);  // nullptr when unknown
// What --KEY takes, for help texts: "no|fp16|bf16", "1|2" for a short range, else flag_value.
std::string value_hint(std::string_view key);
// The default as help texts show it: the rule, or Config{}'s value ("29500").
std::string default_text(const KeySpec&);
std::string env_var_for(std::string_view key);  // "ACCEL_NUM_PROCESSES"
std::string upper(std::string_view s);          // ASCII upper case: "full_shard" -> "FULL_SHARD"
std::string flag_for(std::string_view key);     // "--num_processes"

// Parses `text` as a value of `key` (case-insensitive choices, DEEPSPEED as ZERO, yes/no
// for booleans) and returns its canonical spelling, or the problem in words.
struct Parsed {
  std::optional<std::string> value;
  std::string problem;  // set when value is empty: "70000 is not a TCP port (0-65535)"
};
Parsed parse_value(std::string_view key, std::string_view text);
// The same, throwing ConfigError "WHERE: key 'KEY': PROBLEM".
std::string parse_value_or_throw(std::string_view key, std::string_view text,
                                 std::string_view where);

// Reads and writes one key of a Config as canonical text ("true", "MULTI_CPU", "29500").
// set_value expects a value parse_value accepted.
std::string get_value(const Config&, std::string_view key);
void set_value(Config&, std::string_view key, std::string_view canonical);

// Whether a key belongs in a written file or a worker's environment for this config: the
// ZeRO keys only with distributed_type ZERO, data_parallel_replicas only with DATA_PARALLEL;
// everything else always.
bool is_written(const Config&, std::string_view key);

// Checks one key against the others (machine_rank below num_machines, zero_stage only with
// ZERO, data_parallel_replicas only with DATA_PARALLEL, at most kMaxProcessesPerMachine per
// machine, ...); the problem in words, or nullopt. Errors are reported against the key named
// here, so a message points at the line (or variable, or flag) that set it.
std::optional<std::string> consistency_problem(const Config&, std::string_view key);

// "unknown key (did you mean 'num_processes'?)": the problem for a key not in the schema.
std::string unknown_key_problem(std::string_view key);

// The candidate nearest to `name` by edit distance when it is close enough to be a typo
// (fewer than 4 edits), else "": the one "did you mean" of keys and flags.
std::string closest_name(std::string_view name, const std::vector<std::string>& candidates);

// Accelerate keys that mean nothing here: read, ignored, noted. The note for `key`, or
// nullopt when the key is not one of them. `section` is "" or "deepspeed_config".
std::optional<std::string> ignored_key_note(std::string_view section, std::string_view key);

}  // namespace accel::config
