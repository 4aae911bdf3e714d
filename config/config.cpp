// The schema: every key, its type, allowed values, default and help, and the one parser and
// the one set of cross-key rules that files, environment, flags and the wizard share.

#include "config/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "foundation/error.hpp"

namespace accel::config {

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

std::optional<long long> parse_integer(std::string_view text) {
  long long v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

// A value as messages show it: quoted, and cut short when long, so a 50 MB value gives a
// one-line error.
std::string quoted(std::string_view text) {
  constexpr std::size_t kShown = 40;
  if (text.size() <= kShown + 20) return "'" + std::string(text) + "'";
  return "'" + std::string(text.substr(0, kShown)) + "...' (" + std::to_string(text.size()) +
         " characters)";
}

// A host name (at most 253 characters, as DNS allows), an IPv4 address or an IPv6 one (with
// a %zone); nothing else reaches the resolver.
std::optional<std::string> check_host(std::string_view text) {
  constexpr std::size_t kMaxHostLength = 253;
  const bool ok =
      text.size() <= kMaxHostLength && std::all_of(text.begin(), text.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
               c == ':' || c == '%';
      });
  if (ok) return std::nullopt;
  return "expects a host name or IP address (at most " + std::to_string(kMaxHostLength) +
         " letters, digits and . - _ : %), got " + quoted(text);
}

std::optional<std::string> check_gpu_ids(std::string_view text, std::string* canonical) {
  if (lower(text) == "all") {
    *canonical = "all";
    return std::nullopt;
  }
  std::vector<std::string> ids;
  std::set<long long> seen;
  std::string_view rest = text;
  while (true) {
    const auto comma = rest.find(',');
    const auto item = trim(rest.substr(0, comma));
    const auto id = parse_integer(item);
    if (!id || *id < 0 || *id > 1023)
      return "expects 'all' or GPU ids like 0,1, got " + quoted(text);
    if (!seen.insert(*id).second) return "GPU id " + std::to_string(*id) + " is listed twice";
    ids.push_back(std::to_string(*id));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  *canonical = join(ids, ",");
  return std::nullopt;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// ---- Cross-key rules, one per key, named in the table below. Each returns the problem in
// words; it is reported against its own key, so a message points at the line that set it.

std::string type_of(const Config& c) { return to_string(c.distributed_type); }

bool one_process(const Config& c) {
  return c.distributed_type == DistributedType::NO ||
         c.distributed_type == DistributedType::DATA_PARALLEL;
}

bool is_zero(const Config& c) { return c.distributed_type == DistributedType::ZERO; }
bool is_zero3(const Config& c) { return is_zero(c) && c.zero_stage == 3; }
bool is_data_parallel(const Config& c) {
  return c.distributed_type == DistributedType::DATA_PARALLEL;
}

std::optional<std::string> check_num_processes(const Config& c) {
  if (one_process(c) && c.num_processes != 1)
    return "distributed_type " + type_of(c) + " runs one process, not " +
           std::to_string(c.num_processes);
  if (c.num_processes % c.num_machines != 0)
    return std::to_string(c.num_processes) + " processes do not divide evenly over num_machines (" +
           std::to_string(c.num_machines) + ")";
  if (processes_per_machine(c) > kMaxProcessesPerMachine)
    return std::to_string(c.num_processes) + " processes" +
           (c.num_machines == 1 ? std::string(" on one machine")
                                : " over " + std::to_string(c.num_machines) + " machines are " +
                                      std::to_string(processes_per_machine(c)) + " per machine") +
           "; at most " + std::to_string(kMaxProcessesPerMachine) + " run on one machine";
  return std::nullopt;
}

std::optional<std::string> check_num_machines(const Config& c) {
  if (one_process(c) && c.num_machines != 1)
    return "distributed_type " + type_of(c) + " runs on one machine, not " +
           std::to_string(c.num_machines);
  return std::nullopt;
}

std::optional<std::string> check_machine_rank(const Config& c) {
  if (c.machine_rank >= c.num_machines)
    return std::to_string(c.machine_rank) + " is not below num_machines (" +
           std::to_string(c.num_machines) + ")";
  return std::nullopt;
}

std::optional<std::string> check_main_process_port(const Config& c) {
  if (c.main_process_port == 0 && c.num_machines > 1)
    return "0 (a free port) only works on one machine; the other machines must know the port";
  return std::nullopt;
}

std::optional<std::string> check_use_cpu(const Config& c) {
  if (c.use_cpu && c.distributed_type == DistributedType::MULTI_GPU)
    return "true contradicts distributed_type " + type_of(c) + " (GPU processes)";
  if (!c.use_cpu && c.distributed_type == DistributedType::MULTI_CPU)
    return "false contradicts distributed_type MULTI_CPU";
  return std::nullopt;
}

std::optional<std::string> check_gpu_ids(const Config& c) {
  if (is_data_parallel(c) && !uses_gpu(c) && !gpu_id_list(c).empty())
    return "lists GPU(s) " + c.gpu_ids +
           " but DATA_PARALLEL runs on the CPU here (use_cpu true, or no GPU found): its "
           "replicas are threads, set data_parallel_replicas instead";
  if (uses_gpu(c)) {
    const auto ids = gpu_id_list(c);
    const int per_machine = one_process(c) ? 1 : processes_per_machine(c);
    if (!ids.empty() && static_cast<int>(ids.size()) < per_machine)
      return "lists " + std::to_string(ids.size()) + " GPU(s) but " + std::to_string(per_machine) +
             " processes run on each machine, one GPU each";
  }
  return std::nullopt;
}

std::optional<std::string> check_zero_stage(const Config& c) {
  if (c.zero_stage != 0 && !is_zero(c))
    return "zero_stage " + std::to_string(c.zero_stage) + " needs distributed_type ZERO, not " +
           type_of(c);
  return std::nullopt;
}

// log_with: known tracker names, comma-separated (config/config.cpp keeps the list in step with
// accelerate/trackers/tracker.cpp's builtin_trackers; config/ cannot depend on the front end).
std::vector<std::string> comma_separated(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    out.emplace_back(text.substr(0, comma));
    text = comma == std::string_view::npos ? "" : text.substr(comma + 1);
  }
  return out;
}

std::optional<std::string> log_with_problem(std::string_view names) {
  static const std::vector<std::string> known = {"none",  "tensorboard", "csv",
                                                 "jsonl", "mlflow",      "all"};
  for (const std::string& name : comma_separated(names)) {
    if (name == "wandb" || name == "comet_ml" || name == "aim" || name == "clearml" ||
        name == "dvclive")
      return "the " + name + " tracker is not available (tensorboard, csv, jsonl, mlflow or all)";
    if (std::find(known.begin(), known.end(), name) == known.end())
      return "'" + name +
             "' is not a tracker (tensorboard, csv, jsonl, mlflow or all, comma-separated)";
  }
  return std::nullopt;
}

std::optional<std::string> check_zero3_threshold(const Config& c) {
  if (is_zero3(c) ||
      c.zero3_param_persistence_threshold == Config{}.zero3_param_persistence_threshold)
    return std::nullopt;
  return "zero3_param_persistence_threshold needs zero_stage 3 (distributed_type ZERO)";
}

std::optional<std::string> check_hybrid_shard(const Config& c) {
  if (!c.hybrid_shard || is_zero(c)) return std::nullopt;
  return "hybrid_shard needs distributed_type ZERO";
}

std::optional<std::string> check_reshard_after_forward(const Config& c) {
  if (is_zero3(c) || c.reshard_after_forward == Config{}.reshard_after_forward) return std::nullopt;
  return "reshard_after_forward needs zero_stage 3 (distributed_type ZERO)";
}

bool is_pipelined(const Config& c) { return c.pipeline_parallel_size > 1; }

// The launch-level facts of a pipeline; the schedule's own rules (INTERLEAVED_1F1B's
// num_microbatches a multiple of the stages, ...) are checked where it is built
// (accelerate/pipeline/schedule.hpp's check_shape), naming these keys.
std::optional<std::string> check_pipeline_parallel_size(const Config& c) {
  if (!is_pipelined(c)) return std::nullopt;
  if (c.distributed_type != DistributedType::MULTI_CPU)
    return "pipeline_parallel_size " + std::to_string(c.pipeline_parallel_size) +
           " needs distributed_type MULTI_CPU, not " + type_of(c) +
           " (ZERO with a pipeline is not built: DeepSpeed refuses ZeRO-2/3 with pipelines; "
           "MULTI_GPU's NCCL has no groups of some ranks yet)";
  if (c.num_processes % c.pipeline_parallel_size != 0)
    return "num_processes " + std::to_string(c.num_processes) +
           " is not a multiple of pipeline_parallel_size " +
           std::to_string(c.pipeline_parallel_size) + " (each replica of the pipeline runs " +
           std::to_string(c.pipeline_parallel_size) + " processes)";
  return std::nullopt;
}

std::optional<std::string> check_pipeline_chunks(const Config& c) {
  if (c.pipeline_chunks == 1 || c.pipeline_schedule == "INTERLEAVED_1F1B") return std::nullopt;
  return "pipeline_chunks " + std::to_string(c.pipeline_chunks) +
         " needs pipeline_schedule INTERLEAVED_1F1B, not " + c.pipeline_schedule;
}

std::optional<std::string> check_offload_optimizer_device(const Config& c) {
  if (c.offload_optimizer_device != "none" && !is_zero(c))
    return "offloading the optimizer needs distributed_type ZERO, not " + type_of(c);
  return std::nullopt;
}

std::optional<std::string> check_data_parallel_replicas(const Config& c) {
  if (c.data_parallel_replicas != 0 && !is_data_parallel(c))
    return std::to_string(c.data_parallel_replicas) +
           " replicas need distributed_type DATA_PARALLEL, not " + type_of(c);
  if (c.data_parallel_replicas != 0 && uses_gpu(c))
    return "DATA_PARALLEL on GPUs takes one replica per GPU in gpu_ids; data_parallel_replicas "
           "is for CPU replicas (use_cpu true)";
  return std::nullopt;
}

// An enum's names in its order, so a choice's index is its enum value.
template <typename E, std::size_t N>
std::vector<std::string> names_of(const E (&values)[N]) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(values[i]) != i) throw std::logic_error("names_of: enum order");
    names.push_back(to_string(values[i]));
  }
  return names;
}
constexpr DistributedType kDistributedTypes[] = {
    DistributedType::NO, DistributedType::DATA_PARALLEL, DistributedType::MULTI_CPU,
    DistributedType::MULTI_GPU, DistributedType::ZERO};
constexpr MixedPrecision kMixedPrecisions[] = {MixedPrecision::no, MixedPrecision::fp16,
                                               MixedPrecision::bf16};
constexpr AutoWrapPolicy kAutoWrapPolicies[] = {AutoWrapPolicy::TRANSFORMER_BASED_WRAP,
                                                AutoWrapPolicy::NO_WRAP};
constexpr StateDictType kStateDictTypes[] = {StateDictType::FULL_STATE_DICT,
                                             StateDictType::SHARDED_STATE_DICT};

// ---- The table: every key, declared once.

std::vector<KeySpec> make_schema() {
  using K = ValueKind;
  const std::string stages = std::to_string(kMinZeroStage) + "-" + std::to_string(kMaxZeroStage);
  return {
      {.name = "compute_environment",
       .kind = K::choice,
       .field = &Config::compute_environment,
       .choices = {"LOCAL_MACHINE"},
       .help = "where the processes run: this machine's own (Accelerate's SageMaker is not "
               "supported)",
       .question = "In which compute environment are you running?",
       .options = {{"LOCAL_MACHINE", "This machine", 0}}},
      {.name = "distributed_type",
       .kind = K::choice,
       .field = &Config::distributed_type,
       .choices = names_of(kDistributedTypes),
       .default_rule = "MULTI_GPU with 2+ GPUs, NO with one, MULTI_CPU without",
       .help = "NO: one process; DATA_PARALLEL: one process, a model replica per GPU (or per CPU "
               "thread: data_parallel_replicas); MULTI_CPU / MULTI_GPU: one process per core "
               "group / GPU (DDP); ZERO: sharded optimizer state (DEEPSPEED and FSDP are read as "
               "ZERO)",
       .question = "Which type of distributed training do you want?",
       .options = {{"NO", "NO             one process, one device", 0},
                   {"DATA_PARALLEL",
                    "DATA_PARALLEL  one process, a model replica on each GPU (or CPU thread)", 1},
                   {"MULTI_CPU", "MULTI_CPU      one process per CPU share (DDP over gloo or mpi)",
                    2},
                   {"MULTI_GPU", "MULTI_GPU      one process per GPU (DDP over NCCL)", 3},
                   {"ZERO", "ZERO           one process per device, optimizer state sharded (ZeRO)",
                    4}}},
      {.name = "num_processes",
       .kind = K::integer,
       .field = &Config::num_processes,
       .min_value = 1,
       .max_value = 1 << 20,
       .range_text = "a process count (1 or more)",
       .default_rule = "1 per GPU, or 1 per CPU core without GPUs; 1 for NO and DATA_PARALLEL",
       .help = "processes over all machines; each machine runs num_processes / num_machines",
       .flag_value = "N",
       .question =
           "How many processes should be used for distributed training (over all machines)?",
       .check = check_num_processes,
       .related = {"distributed_type", "num_machines"}},
      {.name = "num_machines",
       .kind = K::integer,
       .field = &Config::num_machines,
       .aliases = {"nnodes"},
       .min_value = 1,
       .max_value = 1 << 16,
       .range_text = "a machine count (1 or more)",
       .help = "machines taking part; each runs `accel launch` with its own machine_rank",
       .flag_value = "M",
       .question =
           "How many different machines will you use (more than 1 for multi-node training)?",
       .check = check_num_machines,
       .related = {"distributed_type"}},
      {.name = "machine_rank",
       .kind = K::integer,
       .field = &Config::machine_rank,
       .aliases = {"node_rank"},
       .min_value = 0,
       .max_value = (1 << 16) - 1,
       .range_text = "a machine rank (0 or more)",
       .help = "this machine's rank, 0 .. num_machines-1; machine 0 hosts the rendezvous store",
       .flag_value = "K",
       .question = "What is the rank of this machine (0 .. {last_machine})?",
       .check = check_machine_rank,
       .related = {"num_machines"}},
      {.name = "min_machines",
       .kind = K::integer,
       .field = &Config::min_machines,
       .min_value = 0,
       .max_value = 1 << 16,
       .range_text = "a machine count (0: num_machines)",
       .help = "elastic jobs: the fewest machines that train (torchrun's --nnodes MIN:MAX sets "
               "it and num_machines); below num_machines the machines meet in rounds (as "
               "rdzv_backend c10d)",
       .flag_value = "M",
       .question = "What is the fewest machines the job may go on with (elastic; "
                   "num_machines is the most)?",
       .applies = [](const Config& c) { return c.min_machines != 0; },
       .check = [](const Config& c) -> std::optional<std::string> {
         if (c.min_machines <= c.num_machines) return std::nullopt;
         return "min_machines " + std::to_string(c.min_machines) + " is above num_machines " +
                std::to_string(c.num_machines) + " (the most machines)";
       },
       .related = {"num_machines"}},
      {.name = "rdzv_backend",
       .kind = K::choice,
       .field = &Config::rdzv_backend,
       .choices = {"static", "c10d"},
       .help = "static: every machine gives its machine_rank; c10d: machines join rounds and "
               "are ranked as they come, the job restarting at each new size (elastic)",
       .flag_value = "static|c10d",
       .question = "What rendezvous backend will you use?",
       .options = {{"static", "static  every machine gives its machine_rank", 0},
                   {"c10d", "c10d    elastic: machines join rounds, ranked as they come", 1}},
       .applies = [](const Config& c) { return c.rdzv_backend != "static"; }},
      {.name = "main_process_ip",
       .kind = K::text,
       .field = &Config::main_process_ip,
       .aliases = {"master_addr"},
       .help = "address of machine 0, where the rendezvous store listens",
       .flag_value = "IP",
       .question = "What is the IP address of the machine that will host the main process?"},
      {.name = "main_process_port",
       .kind = K::integer,
       .field = &Config::main_process_port,
       .aliases = {"master_port"},
       .min_value = 0,
       .max_value = 65535,
       .range_text = "a TCP port (0-65535)",
       .help = "port of the rendezvous store on machine 0; 0 picks a free one (single machine "
               "only)",
       .flag_value = "P",
       .question = "What is the port you will use to communicate with the main process?",
       .check = check_main_process_port,
       .related = {"num_machines"}},
      {.name = "use_cpu",
       .kind = K::boolean,
       .field = &Config::use_cpu,
       .default_rule = "true when no GPU is found",
       .help = "run on CPU even if GPUs exist (decides the device for NO and ZERO)",
       .question = "Do you want to run your training on CPU only (even if a GPU is available)?",
       .options = {{"false", "no", 0}, {"true", "yes", 1}},
       .check = check_use_cpu,
       .related = {"distributed_type"}},
      {.name = "gpu_ids",
       .kind = K::text,
       .field = &Config::gpu_ids,
       .help = "GPUs this machine uses: all, or ids like 0,1 (becomes CUDA_VISIBLE_DEVICES)",
       .flag_value = "all|0,1,...",
       .question = "What GPU(s) (by id) should be used for training on this machine as a "
                   "comma-separated list?",
       .check = check_gpu_ids,
       .related = {"num_processes", "num_machines"}},
      {.name = "mixed_precision",
       .kind = K::choice,
       .field = &Config::mixed_precision,
       .choices = names_of(kMixedPrecisions),
       .help = "compute in fp16 or bf16 with fp32 master weights",
       .question = "Do you wish to use mixed precision?",
       .options = {{"no", "no", 0}, {"fp16", "fp16", 1}, {"bf16", "bf16", 2}}},
      {.name = "zero_stage",
       .kind = K::integer,
       .field = &Config::zero_stage,
       .min_value = kMinZeroStage,
       .max_value = kMaxZeroStage,
       .range_text = "a ZeRO stage (" + stages + ")",
       .default_rule = "2 with ZERO",
       .help = "ZERO only: 1 shards optimizer state, 2 also gradients, 3 also parameters",
       .question = "What should be your ZeRO optimization stage?",
       // The menu keeps the stages the range allows (wizard.cpp); a stage added to the range
       // needs its line here.
       .options = {{"1", "stage 1: shard optimizer state", 1},
                   {"2", "stage 2: shard optimizer state and gradients", 2},
                   {"3", "stage 3: shard optimizer state, gradients and parameters", 3}},
       .applies = is_zero,
       .check = check_zero_stage,
       .related = {"distributed_type"}},
      {.name = "offload_optimizer_device",
       .kind = K::choice,
       .field = &Config::offload_optimizer_device,
       .choices = {"none", "cpu"},
       .help = "ZERO only: keep optimizer state in host memory",
       .question = "Where to offload optimizer states?",
       .options = {{"none", "none", 0}, {"cpu", "cpu", 1}},
       .applies = is_zero,
       .check = check_offload_optimizer_device,
       .related = {"distributed_type"}},
      {.name = "zero3_param_persistence_threshold",
       .kind = K::integer,
       .field = &Config::zero3_param_persistence_threshold,
       .aliases = {"stage3_param_persistence_threshold"},
       .min_value = 0,
       .max_value = 1 << 30,
       .range_text = "an element count (0 or more)",
       .help = "zero_stage 3 only: parameters with fewer elements stay gathered on every rank",
       .flag_value = "N",
       .question = "Below how many elements should a parameter stay gathered (not sharded)?",
       .applies = is_zero3,
       .check = check_zero3_threshold,
       .related = {"zero_stage", "distributed_type"}},
      {.name = "reshard_after_forward",
       .kind = K::boolean,
       .field = &Config::reshard_after_forward,
       .aliases = {"fsdp_reshard_after_forward"},
       .help = "zero_stage 3 only: free a unit's gathered parameters after its forward and "
               "gather them again for its backward (false: keep them, less traffic, more memory)",
       .question = "Should a unit's parameters be freed after its forward (gathered again for "
                   "the backward)?",
       .options = {{"true", "yes", 1}, {"false", "no", 0}},
       .applies = is_zero3,
       .check = check_reshard_after_forward,
       .related = {"zero_stage", "distributed_type"}},
      {.name = "hybrid_shard",
       .kind = K::boolean,
       .field = &Config::hybrid_shard,
       .help = "ZERO only: shard over each machine's processes and replicate across machines "
               "(FSDP's HYBRID_SHARD; the sharding's collectives stay inside each machine)",
       .question = "Should the sharding stay within each machine (replicated across machines)?",
       .options = {{"false", "no", 0}, {"true", "yes", 1}},
       .applies = is_zero,
       .check = check_hybrid_shard,
       .related = {"distributed_type", "num_machines"}},
      {.name = "auto_wrap_policy",
       .kind = K::choice,
       .field = &Config::auto_wrap_policy,
       .aliases = {"fsdp_auto_wrap_policy"},
       .choices = names_of(kAutoWrapPolicies),
       .help = "zero_stage 3, LibTorch: each child of the model's ModuleLists and Sequentials is "
               "a unit (TRANSFORMER_BASED_WRAP), or only the root and ShardedUnit blocks are "
               "(NO_WRAP)",
       .question = "Which modules should be gathered as units of their own?",
       .options = {{"TRANSFORMER_BASED_WRAP", "each ModuleList or Sequential child", 0},
                   {"NO_WRAP", "the whole model (and ShardedUnit blocks)", 1}},
       .applies = is_zero3,
       .related = {"zero_stage", "distributed_type"}},
      {.name = "state_dict_type",
       .kind = K::choice,
       .field = &Config::state_dict_type,
       .aliases = {"fsdp_state_dict_type"},
       .choices = names_of(kStateDictTypes),
       .help = "LibTorch checkpoints: the model as one LibTorch archive from rank 0 "
               "(FULL_STATE_DICT), or each rank's own slices, merged by accel merge-weights "
               "(SHARDED_STATE_DICT)"},
      {.name = "activation_checkpointing",
       .kind = K::boolean,
       .field = &Config::activation_checkpointing,
       .aliases = {"fsdp_activation_checkpointing"},
       .help = "LibTorch: run each child of a prepared torch::nn::Sequential, and each "
               "accel::ShardedUnit block, through activation checkpointing (its activations "
               "recomputed in backward: less memory, one more forward)"},
      {.name = "log_with",
       .kind = K::text,
       .field = &Config::log_with,
       .help = "trackers acc.init_trackers starts on the main process: none, or tensorboard, "
               "csv, jsonl, mlflow or all, comma-separated",
       .flag_value = "NAMES"},
      {.name = "project_dir",
       .kind = K::text,
       .field = &Config::project_dir,
       .help = "the project's directory (Accelerate's ProjectConfiguration.project_dir)",
       .flag_value = "DIR"},
      {.name = "logging_dir",
       .kind = K::text,
       .field = &Config::logging_dir,
       .default_rule = "project_dir",
       .help = "where the trackers write, one directory per project name",
       .flag_value = "DIR",
       .applies = [](const Config& c) { return !c.logging_dir.empty(); }},
      {.name = "automatic_checkpoint_naming",
       .kind = K::boolean,
       .field = &Config::automatic_checkpoint_naming,
       .help = "save_state() without a directory writes project_dir/checkpoints/checkpoint_<i> "
               "(i counting up), and load_state() without one reads the newest complete one",
       .applies = [](const Config& c) { return c.automatic_checkpoint_naming; }},
      {.name = "total_limit",
       .kind = K::integer,
       .field = &Config::total_limit,
       .min_value = 0,
       .max_value = 1 << 20,
       .range_text = "a number of checkpoints (0: keep all)",
       .help = "with automatic_checkpoint_naming: keep the newest N checkpoints, deleting the "
               "oldest only once a new one is complete (0: keep all)",
       .flag_value = "N",
       .applies = [](const Config& c) { return c.total_limit != 0; },
       .check = [](const Config& c) -> std::optional<std::string> {
         if (c.total_limit == 0 || c.automatic_checkpoint_naming) return std::nullopt;
         return "total_limit needs automatic_checkpoint_naming true (it counts the named "
                "checkpoints)";
       },
       .related = {"automatic_checkpoint_naming"}},
      {.name = "global_batch_size",
       .kind = K::integer,
       .field = &Config::global_batch_size,
       .min_value = 0,
       .max_value = 1 << 30,
       .range_text = "a sample count (0: the loop's batch size per process)",
       .help = "samples per step over all processes: every sampler's batch becomes "
               "global_batch_size / num_processes (refused when it does not divide), so the "
               "same global batches are drawn at any number of processes (0: the loop's own "
               "batch size, per process)",
       .flag_value = "N",
       .applies = [](const Config& c) { return c.global_batch_size != 0; }},
      {.name = "save_on_each_node",
       .kind = K::boolean,
       .field = &Config::save_on_each_node,
       .help = "machines without a shared filesystem: save_state writes a whole checkpoint "
               "directory on each machine (the shared files from its first process, and its "
               "processes' own); load_state then needs the same ranks on each machine",
       .applies = [](const Config& c) { return c.save_on_each_node; },
       .check = [](const Config& c) -> std::optional<std::string> {
         if (!c.save_on_each_node || !is_zero3(c)) return std::nullopt;
         return "save_on_each_node with zero_stage 3 is not supported yet (a rank loading "
                "its parameters reads every rank's slices, which would be on other machines); "
                "save to a shared filesystem";
       },
       .related = {"zero_stage", "distributed_type"}},
      {.name = "disable_progress_bar",
       .kind = K::boolean,
       .field = &Config::disable_progress_bar,
       .help = "no progress bar: acc.progress(loader) iterates without drawing one (the bar is "
               "drawn on the main process only: one redrawn line on a terminal, else a plain "
               "line every few seconds)",
       .applies = [](const Config& c) { return c.disable_progress_bar; }},
      {.name = "cpu_communicator",
       .kind = K::choice,
       .field = &Config::cpu_communicator,
       .aliases = {"comm_backend"},
       .choices = {"auto", "gloo", "mpi", "shm", "hierarchical"},
       .help = "communicator for CPU processes: auto (shared memory when every process is on "
               "one machine, else shared memory inside machines and gloo between them), gloo "
               "(TCP), mpi (under mpirun), shm or hierarchical (forced)",
       .question = "Which communicator should the CPU processes use?",
       .options = {{"auto", "auto  shared memory within a machine, Gloo between machines", 0},
                   {"gloo", "gloo  TCP, started by accel launch", 1},
                   {"mpi", "mpi   MPI, for clusters with a fast interconnect", 2}}},
      {.name = "data_parallel_replicas",
       .kind = K::integer,
       .field = &Config::data_parallel_replicas,
       .min_value = 0,
       .max_value = 1 << 16,
       .range_text = "a replica count (0 = one per CPU core, or more)",
       .default_rule = "0: one per CPU core",
       .help = "DATA_PARALLEL on the CPU only: model replicas, each on its own thread, in the "
               "one process",
       .flag_value = "N",
       .question = "How many model replicas (threads) should DataParallel run (0 = one per CPU "
                   "core)?",
       .applies = is_data_parallel,
       .check = check_data_parallel_replicas,
       .related = {"distributed_type", "use_cpu"}},
      {.name = "gradient_accumulation_steps",
       .kind = K::integer,
       .field = &Config::gradient_accumulation_steps,
       .min_value = 1,
       .max_value = 1 << 20,
       .range_text = "a step count (1 or more)",
       .help = "micro-batches per optimizer step; gradients are synchronised on the last one",
       .flag_value = "N",
       .question = "How many gradient accumulation steps?"},
      {.name = "pipeline_parallel_size",
       .kind = K::integer,
       .field = &Config::pipeline_parallel_size,
       .min_value = 1,
       .max_value = kMaxProcessesPerMachine,
       .range_text = "a stage count (1 or more)",
       .help = "LibTorch's TorchPipeline: the model's layers split into this many stages, one "
               "per process of each replica (1: no pipeline)",
       .flag_value = "P",
       .question = "How many pipeline stages should the model be split into (1: no pipeline)?",
       .applies = is_pipelined,
       .check = check_pipeline_parallel_size,
       .related = {"distributed_type", "num_processes"}},
      {.name = "num_microbatches",
       .kind = K::integer,
       .field = &Config::num_microbatches,
       .min_value = 1,
       .max_value = 1 << 20,
       .range_text = "a micro-batch count (1 or more)",
       .help = "pipeline: each step's batch splits into this many micro-batches (the loss their "
               "mean); more fill the pipeline's bubble",
       .flag_value = "M",
       .question = "How many micro-batches should each step's batch be split into?",
       .applies = is_pipelined},
      {.name = "pipeline_schedule",
       .kind = K::choice,
       .field = &Config::pipeline_schedule,
       .choices = {"GPIPE", "1F1B", "INTERLEAVED_1F1B", "ZERO_BUBBLE"},
       .help = "pipeline: the order of forwards and backwards (1F1B holds at most one "
               "micro-batch per later stage; INTERLEAVED_1F1B runs pipeline_chunks chunks per "
               "stage; ZERO_BUBBLE fills the bubble with the weight gradients)",
       .question = "Which pipeline schedule?",
       .options = {{"1F1B", "1F1B (PipeDream-flush)", 0},
                   {"GPIPE", "GPipe: all forwards, then all backwards", 1},
                   {"INTERLEAVED_1F1B", "interleaved 1F1B: several model chunks per stage", 2},
                   {"ZERO_BUBBLE", "zero bubble (ZB-H1)", 3}},
       .applies = is_pipelined},
      {.name = "pipeline_chunks",
       .kind = K::integer,
       .field = &Config::pipeline_chunks,
       .min_value = 1,
       .max_value = 1 << 10,
       .range_text = "a chunk count (1 or more)",
       .help = "pipeline_schedule INTERLEAVED_1F1B: model chunks (virtual stages) per stage",
       .flag_value = "V",
       .question = "How many model chunks per stage?",
       .applies = is_pipelined,
       .check = check_pipeline_chunks,
       .related = {"pipeline_schedule"}},
      {.name = "partition_method",
       .kind = K::choice,
       .field = &Config::partition_method,
       .choices = {"parameters", "uniform", "profile"},
       .help = "pipeline: split the layers so each stage holds about as many parameters "
               "(parameters), layers (uniform) or seconds of forward + backward, each layer "
               "timed on a sample micro-batch on every rank (profile)",
       .question = "How should the layers be split into stages?",
       .options = {{"parameters", "balance parameter counts", 0},
                   {"uniform", "balance layer counts", 1},
                   {"profile", "balance measured forward + backward time", 2}},
       .applies = is_pipelined},
  };
}
}  // namespace

std::string to_string(DistributedType t) {
  switch (t) {
    case DistributedType::NO:
      return "NO";
    case DistributedType::DATA_PARALLEL:
      return "DATA_PARALLEL";
    case DistributedType::MULTI_CPU:
      return "MULTI_CPU";
    case DistributedType::MULTI_GPU:
      return "MULTI_GPU";
    case DistributedType::ZERO:
      return "ZERO";
  }
  return "?";
}

std::string to_string(MixedPrecision p) {
  switch (p) {
    case MixedPrecision::no:
      return "no";
    case MixedPrecision::fp16:
      return "fp16";
    case MixedPrecision::bf16:
      return "bf16";
  }
  return "?";
}

std::string to_string(AutoWrapPolicy p) {
  return p == AutoWrapPolicy::NO_WRAP ? "NO_WRAP" : "TRANSFORMER_BASED_WRAP";
}

std::string to_string(StateDictType t) {
  return t == StateDictType::SHARDED_STATE_DICT ? "SHARDED_STATE_DICT" : "FULL_STATE_DICT";
}

std::string to_string(Source s) {
  switch (s) {
    case Source::default_value:
      return "default";
    case Source::detected:
      return "detected";
    case Source::config_file:
      return "config file";
    case Source::environment:
      return "environment";
    case Source::command_line:
      return "command line";
  }
  return "?";
}

int processes_per_machine(const Config& c) {
  return c.num_machines > 0 ? c.num_processes / c.num_machines : c.num_processes;
}

bool is_elastic(const Config& c) {
  return c.rdzv_backend == "c10d" || fewest_machines(c) < c.num_machines;
}

int fewest_machines(const Config& c) {
  return c.min_machines != 0 ? c.min_machines : c.num_machines;
}

bool uses_gpu(const Config& c) {
  switch (c.distributed_type) {
    case DistributedType::MULTI_GPU:
      return true;
    case DistributedType::MULTI_CPU:
      return false;
    case DistributedType::NO:
    case DistributedType::ZERO:
    case DistributedType::DATA_PARALLEL:
      return !c.use_cpu;
  }
  return false;
}

std::string comm_backend(const Config& c) {
  if (c.distributed_type == DistributedType::NO ||
      c.distributed_type == DistributedType::DATA_PARALLEL)
    return "local";
  return uses_gpu(c) ? "nccl" : c.cpu_communicator;
}

std::vector<int> gpu_id_list(const Config& c) {
  std::vector<int> ids;
  if (c.gpu_ids == "all") return ids;
  std::string_view rest = c.gpu_ids;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    if (auto id = parse_integer(trim(rest.substr(0, comma)))) ids.push_back(static_cast<int>(*id));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return ids;
}

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = make_schema();
  return table;
}

const KeySpec* find_key(std::string_view name) {
  for (const auto& spec : schema())
    if (spec.name == name) return &spec;
  return nullptr;
}

std::string default_text(const KeySpec& spec) {
  return spec.default_rule.empty() ? get_value(Config{}, spec.name) : spec.default_rule;
}

std::string env_var_for(std::string_view key) { return "ACCEL_" + upper(key); }
std::string flag_for(std::string_view key) { return "--" + std::string(key); }

Parsed parse_value(std::string_view key, std::string_view raw) {
  const KeySpec* spec = find_key(key);
  if (spec == nullptr) return {std::nullopt, unknown_key_problem(key)};
  const std::string_view text = trim(raw);
  const std::string shown = quoted(text);
  switch (spec->kind) {
    case ValueKind::integer: {
      const auto v = parse_integer(text);
      if (!v) return {std::nullopt, "expects a whole number, got " + shown};
      if (*v < spec->min_value || *v > spec->max_value)
        return {std::nullopt, std::to_string(*v) + " is not " + spec->range_text};
      return {std::to_string(*v), ""};
    }
    case ValueKind::boolean: {
      const auto l = lower(text);
      if (l == "true" || l == "yes" || l == "on" || l == "1") return {"true", ""};
      if (l == "false" || l == "no" || l == "off" || l == "0") return {"false", ""};
      return {std::nullopt, "expects true or false, got " + shown};
    }
    case ValueKind::choice: {
      // Accelerate spells its choices in one case (MULTI_GPU, fp16); people type either.
      std::string wanted = lower(text);
      // Accelerate's names for ZeRO (a file's fsdp_config sets the stage: config_file.cpp).
      if (key == "distributed_type" && (wanted == "deepspeed" || wanted == "fsdp")) wanted = "zero";
      for (const auto& choice : spec->choices)
        if (lower(choice) == wanted) return {choice, ""};
      return {std::nullopt, shown + " is not one of " + join(spec->choices, ", ")};
    }
    case ValueKind::text: {
      if (key == "gpu_ids") {
        std::string canonical;
        if (auto problem = check_gpu_ids(text, &canonical)) return {std::nullopt, *problem};
        return {canonical, ""};
      }
      if (text.empty()) return {std::nullopt, "expects a value, got nothing"};
      if (std::any_of(text.begin(), text.end(),
                      [](char c) { return std::isspace(static_cast<unsigned char>(c)); }))
        return {std::nullopt, "expects one word, got " + shown};
      if (key == "main_process_ip")
        if (auto problem = check_host(text)) return {std::nullopt, *problem};
      if (key == "log_with")
        if (auto problem = log_with_problem(text)) return {std::nullopt, *problem};
      return {std::string(text), ""};
    }
  }
  return {std::nullopt, "unsupported"};
}

std::string parse_value_or_throw(std::string_view key, std::string_view text,
                                 std::string_view where) {
  auto parsed = parse_value(key, text);
  if (!parsed.value)
    throw ConfigError(std::string(where) + ": key '" + std::string(key) + "': " + parsed.problem);
  return *parsed.value;
}

std::string get_value(const Config& c, std::string_view key) {
  const KeySpec* spec = find_key(key);
  if (spec == nullptr) throw std::invalid_argument("get_value: unknown key " + std::string(key));
  return std::visit(
      [&](auto field) -> std::string {
        const auto& value = c.*field;
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::string>)
          return value;
        else if constexpr (std::is_same_v<T, bool>)
          return value ? "true" : "false";
        else if constexpr (std::is_same_v<T, int>)
          return std::to_string(value);
        else
          return to_string(value);
      },
      spec->field);
}

void set_value(Config& c, std::string_view key, std::string_view v) {
  const KeySpec* spec = find_key(key);
  if (spec == nullptr) throw std::invalid_argument("set_value: unknown key " + std::string(key));
  std::visit(
      [&](auto field) {
        auto& value = c.*field;
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::string>) {
          value = v;
        } else if constexpr (std::is_same_v<T, bool>) {
          value = (v == "true");
        } else if constexpr (std::is_same_v<T, int>) {
          const auto n = parse_integer(v);
          if (!n) throw std::invalid_argument("set_value: not a number for " + std::string(key));
          value = static_cast<int>(*n);
        } else {  // an enum: its choices are its names, in its order (names_of)
          const auto it = std::find(spec->choices.begin(), spec->choices.end(), v);
          if (it == spec->choices.end())
            throw std::invalid_argument("set_value: bad " + std::string(key));
          value = static_cast<T>(it - spec->choices.begin());
        }
      },
      spec->field);
}

bool is_written(const Config& c, std::string_view key) {
  const KeySpec* spec = find_key(key);
  return spec == nullptr || spec->applies == nullptr || spec->applies(c);
}

std::optional<std::string> consistency_problem(const Config& c, std::string_view key) {
  const KeySpec* spec = find_key(key);
  if (spec == nullptr || spec->check == nullptr) return std::nullopt;
  return spec->check(c);
}

std::string value_hint(std::string_view key) {
  const KeySpec* spec = find_key(key);
  if (spec == nullptr) return "VALUE";
  if (!spec->flag_value.empty()) return spec->flag_value;
  if (spec->kind == ValueKind::choice) return join(spec->choices, "|");
  std::vector<std::string> values;  // a short range, spelled out: "1|2"
  for (int v = spec->min_value; v <= spec->max_value && values.size() <= 4; ++v)
    values.push_back(std::to_string(v));
  return values.size() <= 4 ? join(values, "|") : "N";
}

std::string closest_name(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = 4;  // farther than this is no suggestion, only noise
  for (const std::string& candidate : candidates) {
    const auto d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

std::string unknown_key_problem(std::string_view key) {
  std::vector<std::string> names;
  for (const auto& spec : schema()) names.emplace_back(spec.name);
  const std::string best = closest_name(key, names);
  std::string problem = "unknown key";
  if (!best.empty()) problem += " (did you mean '" + best + "'?)";
  return problem;
}

std::vector<std::string> log_with_names(std::string_view log_with) {
  std::vector<std::string> out;
  for (const std::string& name : comma_separated(log_with)) {
    if (name == "all")
      out.insert(out.end(), {"tensorboard", "csv", "jsonl", "mlflow"});
    else if (!name.empty() && name != "none")
      out.push_back(name);
  }
  return out;
}

std::optional<std::string> ignored_key_note(std::string_view section, std::string_view key) {
  static const std::set<std::string, std::less<>> top = {"debug",
                                                         "downcast_bf16",
                                                         "main_training_function",
                                                         "same_network",
                                                         "tpu_env",
                                                         "tpu_name",
                                                         "tpu_zone",
                                                         "tpu_vm",
                                                         "tpu_use_cluster",
                                                         "tpu_use_sudo",
                                                         "command_file",
                                                         "commands",
                                                         "enable_cpu_affinity",
                                                         "dynamo_config",
                                                         "dynamo_backend",
                                                         "megatron_lm_config",
                                                         "ipex_config",
                                                         "mpirun_config",
                                                         "fp8_config",
                                                         "tp_config",
                                                         "machine_type"};
  static const std::set<std::string, std::less<>> deepspeed = {
      "deepspeed_config_file",      "offload_param_device",
      "offload_param_nvme_path",    "offload_optimizer_nvme_path",
      "gradient_clipping",          "zero3_init_flag",
      "zero3_save_16bit_model",     "deepspeed_multinode_launcher",
      "deepspeed_hostfile",         "deepspeed_exclusion_filter",
      "deepspeed_inclusion_filter", "deepspeed_moe_layer_cls_names"};
  if (section.empty()) {
    if (key == "fp16")
      return "old Accelerate spelling of mixed_precision; ignored (write mixed_precision: fp16)";
    if (top.count(key) != 0) return "Accelerate setting with no meaning in accelerate-cpp; ignored";
    return std::nullopt;
  }
  if (section == "deepspeed_config" && deepspeed.count(key) != 0)
    return "DeepSpeed setting accelerate-cpp's ZeRO does not use; ignored";
  static const std::set<std::string, std::less<>> fsdp = {"fsdp_transformer_layer_cls_to_wrap",
                                                          "fsdp_min_num_params",
                                                          "fsdp_backward_prefetch",
                                                          "fsdp_forward_prefetch",
                                                          "fsdp_use_orig_params",
                                                          "fsdp_sync_module_states",
                                                          "fsdp_cpu_ram_efficient_loading",
                                                          "fsdp_version"};
  if (section == "fsdp_config" && fsdp.count(key) != 0)
    return "FSDP setting with no meaning here (units come from the model's structure, prefetch "
           "is always on, every rank starts from rank 0's parameters); ignored";
  return std::nullopt;
}

}  // namespace accel::config
