// The schema: every key, its type, allowed values, default and help, and the one parser and
// the one set of cross-key rules that files, environment, flags and the wizard share.

#include "config/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>
#include <stdexcept>

#include "backends/comm/error.hpp"

namespace accel::config {
namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

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

std::vector<KeySpec> make_schema() {
  using K = ValueKind;
  std::vector<KeySpec> s;
  auto add = [&](KeySpec spec) { s.push_back(std::move(spec)); };
  add({"compute_environment",
       K::choice,
       {"LOCAL_MACHINE"},
       0,
       0,
       "",
       "LOCAL_MACHINE",
       "where the processes run: this machine's own (Accelerate's SageMaker is not supported)"});
  add({"distributed_type",
       K::choice,
       {"NO", "DATA_PARALLEL", "MULTI_CPU", "MULTI_GPU", "ZERO"},
       0,
       0,
       "",
       "MULTI_GPU with 2+ GPUs, NO with one, MULTI_CPU without",
       "NO: one process; DATA_PARALLEL: one process, a model replica per GPU (or per CPU thread: "
       "data_parallel_replicas); MULTI_CPU / MULTI_GPU: "
       "one process per core group / GPU (DDP); ZERO: sharded optimizer state (DEEPSPEED is read "
       "as ZERO)"});
  add({"num_processes",
       K::integer,
       {},
       1,
       1 << 20,
       "a process count (1 or more)",
       "1 per GPU, or 1 per CPU core without GPUs; 1 for NO and DATA_PARALLEL",
       "processes over all machines; each machine runs num_processes / num_machines"});
  add({"num_machines",
       K::integer,
       {},
       1,
       1 << 16,
       "a machine count (1 or more)",
       "1",
       "machines taking part; each runs `accel launch` with its own machine_rank"});
  add({"machine_rank",
       K::integer,
       {},
       0,
       (1 << 16) - 1,
       "a machine rank (0 or more)",
       "0",
       "this machine's rank, 0 .. num_machines-1; machine 0 hosts the rendezvous store"});
  add({"main_process_ip",
       K::text,
       {},
       0,
       0,
       "",
       "127.0.0.1",
       "address of machine 0, where the rendezvous store listens"});
  add({"main_process_port",
       K::integer,
       {},
       0,
       65535,
       "a TCP port (0-65535)",
       "29500",
       "port of the rendezvous store on machine 0; 0 picks a free one (single machine only)"});
  add({"use_cpu",
       K::boolean,
       {},
       0,
       0,
       "",
       "true when no GPU is found",
       "run on CPU even if GPUs exist (decides the device for NO and ZERO)"});
  add({"gpu_ids",
       K::text,
       {},
       0,
       0,
       "",
       "all",
       "GPUs this machine uses: all, or ids like 0,1 (becomes CUDA_VISIBLE_DEVICES)"});
  add({"mixed_precision",
       K::choice,
       {"no", "fp16", "bf16"},
       0,
       0,
       "",
       "no",
       "compute in fp16 or bf16 with fp32 master weights"});
  add({"zero_stage",
       K::integer,
       {},
       1,
       3,
       "a ZeRO stage (1-3)",
       "2 with ZERO",
       "ZERO only: 1 shards optimizer state, 2 also gradients, 3 also parameters"});
  add({"offload_optimizer_device",
       K::choice,
       {"none", "cpu"},
       0,
       0,
       "",
       "none",
       "ZERO only: keep optimizer state in host memory"});
  add({"cpu_communicator",
       K::choice,
       {"auto", "gloo", "mpi", "shm", "hierarchical"},
       0,
       0,
       "",
       "auto",
       "communicator for CPU processes: auto (shared memory when every process is on one "
       "machine, else shared memory inside machines and gloo between them), gloo (TCP), mpi "
       "(under mpirun), shm or hierarchical (forced)"});
  add({"data_parallel_replicas",
       K::integer,
       {},
       0,
       1 << 16,
       "a replica count (0 = one per CPU core, or more)",
       "0 (one per CPU core)",
       "DATA_PARALLEL on the CPU only: model replicas, each on its own thread, in the one process"});
  add({"gradient_accumulation_steps",
       K::integer,
       {},
       1,
       1 << 20,
       "a step count (1 or more)",
       "1",
       "micro-batches per optimizer step; gradients are synchronised on the last one"});
  return s;
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

bool is_zero_key(std::string_view key) {
  return key == "zero_stage" || key == "offload_optimizer_device";
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
      if (key == "distributed_type" && wanted == "deepspeed") wanted = "zero";  // Accelerate's name
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
  if (key == "compute_environment") return c.compute_environment;
  if (key == "distributed_type") return to_string(c.distributed_type);
  if (key == "num_processes") return std::to_string(c.num_processes);
  if (key == "num_machines") return std::to_string(c.num_machines);
  if (key == "machine_rank") return std::to_string(c.machine_rank);
  if (key == "main_process_ip") return c.main_process_ip;
  if (key == "main_process_port") return std::to_string(c.main_process_port);
  if (key == "use_cpu") return c.use_cpu ? "true" : "false";
  if (key == "gpu_ids") return c.gpu_ids;
  if (key == "mixed_precision") return to_string(c.mixed_precision);
  if (key == "zero_stage") return std::to_string(c.zero_stage);
  if (key == "offload_optimizer_device") return c.offload_optimizer_device;
  if (key == "cpu_communicator") return c.cpu_communicator;
  if (key == "data_parallel_replicas") return std::to_string(c.data_parallel_replicas);
  if (key == "gradient_accumulation_steps") return std::to_string(c.gradient_accumulation_steps);
  throw std::invalid_argument("get_value: unknown key " + std::string(key));
}

void set_value(Config& c, std::string_view key, std::string_view v) {
  auto to_int = [&] {
    auto n = parse_integer(v);
    if (!n) throw std::invalid_argument("set_value: not a number for " + std::string(key));
    return static_cast<int>(*n);
  };
  if (key == "compute_environment")
    c.compute_environment = v;
  else if (key == "distributed_type") {
    const auto& choices = find_key(key)->choices;
    const auto it = std::find(choices.begin(), choices.end(), v);
    if (it == choices.end()) throw std::invalid_argument("set_value: bad distributed_type");
    c.distributed_type = static_cast<DistributedType>(it - choices.begin());
  } else if (key == "num_processes")
    c.num_processes = to_int();
  else if (key == "num_machines")
    c.num_machines = to_int();
  else if (key == "machine_rank")
    c.machine_rank = to_int();
  else if (key == "main_process_ip")
    c.main_process_ip = v;
  else if (key == "main_process_port")
    c.main_process_port = to_int();
  else if (key == "use_cpu")
    c.use_cpu = (v == "true");
  else if (key == "gpu_ids")
    c.gpu_ids = v;
  else if (key == "mixed_precision") {
    const auto& choices = find_key(key)->choices;
    const auto it = std::find(choices.begin(), choices.end(), v);
    if (it == choices.end()) throw std::invalid_argument("set_value: bad mixed_precision");
    c.mixed_precision = static_cast<MixedPrecision>(it - choices.begin());
  } else if (key == "zero_stage")
    c.zero_stage = to_int();
  else if (key == "offload_optimizer_device")
    c.offload_optimizer_device = v;
  else if (key == "cpu_communicator")
    c.cpu_communicator = v;
  else if (key == "data_parallel_replicas")
    c.data_parallel_replicas = to_int();
  else if (key == "gradient_accumulation_steps")
    c.gradient_accumulation_steps = to_int();
  else
    throw std::invalid_argument("set_value: unknown key " + std::string(key));
}

bool is_written(const Config& c, std::string_view key) {
  if (is_zero_key(key)) return c.distributed_type == DistributedType::ZERO;
  if (key == "data_parallel_replicas") return c.distributed_type == DistributedType::DATA_PARALLEL;
  return true;
}

std::optional<std::string> consistency_problem(const Config& c, std::string_view key) {
  const auto type = to_string(c.distributed_type);
  const bool one_process = c.distributed_type == DistributedType::NO ||
                           c.distributed_type == DistributedType::DATA_PARALLEL;
  if (key == "machine_rank" && c.machine_rank >= c.num_machines)
    return std::to_string(c.machine_rank) + " is not below num_machines (" +
           std::to_string(c.num_machines) + ")";
  if (key == "num_machines" && one_process && c.num_machines != 1)
    return "distributed_type " + type + " runs on one machine, not " +
           std::to_string(c.num_machines);
  if (key == "num_processes") {
    if (one_process && c.num_processes != 1)
      return "distributed_type " + type + " runs one process, not " +
             std::to_string(c.num_processes);
    if (c.num_processes % c.num_machines != 0)
      return std::to_string(c.num_processes) +
             " processes do not divide evenly over num_machines (" +
             std::to_string(c.num_machines) + ")";
    if (processes_per_machine(c) > kMaxProcessesPerMachine)
      return std::to_string(c.num_processes) + " processes" +
             (c.num_machines == 1 ? std::string(" on one machine")
                                  : " over " + std::to_string(c.num_machines) + " machines are " +
                                        std::to_string(processes_per_machine(c)) + " per machine") +
             "; at most " + std::to_string(kMaxProcessesPerMachine) + " run on one machine";
  }
  if (key == "zero_stage" && c.zero_stage != 0 && c.distributed_type != DistributedType::ZERO)
    return "zero_stage " + std::to_string(c.zero_stage) + " needs distributed_type ZERO, not " +
           type;
  if (key == "offload_optimizer_device" && c.offload_optimizer_device != "none" &&
      c.distributed_type != DistributedType::ZERO)
    return "offloading the optimizer needs distributed_type ZERO, not " + type;
  if (key == "use_cpu") {
    if (c.use_cpu && c.distributed_type == DistributedType::MULTI_GPU)
      return "true contradicts distributed_type " + type + " (GPU processes)";
    if (!c.use_cpu && c.distributed_type == DistributedType::MULTI_CPU)
      return "false contradicts distributed_type MULTI_CPU";
  }
  if (key == "data_parallel_replicas" && c.data_parallel_replicas != 0 &&
      c.distributed_type != DistributedType::DATA_PARALLEL)
    return std::to_string(c.data_parallel_replicas) +
           " replicas need distributed_type DATA_PARALLEL, not " + type;
  if (key == "data_parallel_replicas" && c.data_parallel_replicas != 0 && uses_gpu(c))
    return "DATA_PARALLEL on GPUs takes one replica per GPU in gpu_ids; data_parallel_replicas "
           "is for CPU replicas (use_cpu true)";
  if (key == "gpu_ids" && c.distributed_type == DistributedType::DATA_PARALLEL && !uses_gpu(c) &&
      !gpu_id_list(c).empty())
    return "lists GPU(s) " + c.gpu_ids +
           " but DATA_PARALLEL runs on the CPU here (use_cpu true, or no GPU found): its "
           "replicas are threads, set data_parallel_replicas instead";
  if (key == "gpu_ids" && uses_gpu(c)) {
    const auto ids = gpu_id_list(c);
    const int per_machine = one_process ? 1 : processes_per_machine(c);
    if (!ids.empty() && static_cast<int>(ids.size()) < per_machine)
      return "lists " + std::to_string(ids.size()) + " GPU(s) but " + std::to_string(per_machine) +
             " processes run on each machine, one GPU each";
  }
  if (key == "main_process_port" && c.main_process_port == 0 && c.num_machines > 1)
    return "0 (a free port) only works on one machine; the other machines must know the port";
  return std::nullopt;
}

std::string unknown_key_problem(std::string_view key) {
  std::string best;
  std::size_t best_distance = 4;  // farther than this is no suggestion, only noise
  for (const auto& spec : schema()) {
    const auto d = edit_distance(key, spec.name);
    if (d < best_distance) {
      best_distance = d;
      best = spec.name;
    }
  }
  std::string problem = "unknown key";
  if (!best.empty()) problem += " (did you mean '" + best + "'?)";
  return problem;
}

std::optional<std::string> ignored_key_note(std::string_view section, std::string_view key) {
  static const std::set<std::string, std::less<>> top = {"debug",
                                                         "downcast_bf16",
                                                         "main_training_function",
                                                         "rdzv_backend",
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
                                                         "fsdp_config",
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
  return std::nullopt;
}

}  // namespace accel::config
