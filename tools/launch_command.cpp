// `accel launch [options] PROGRAM [ARGS...]`: parses the flags into LaunchOptions. Spelled as
// in Accelerate and torchrun (`--num_processes 4` and `--num_processes=4`; torchrun's dashed
// spellings like --max-restarts too). Every config key is also a flag (--<key> VALUE) and
// becomes a command-line override; the first word that is not an option is the program, and
// everything after it belongs to the program.

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "config/config.hpp"
#include "core/error.hpp"
#include "launch/launcher.hpp"
#include "tools/commands.hpp"

namespace accel::tools {
namespace {

constexpr const char* kUsageTemplate = R"(usage: accel launch [options] PROGRAM [ARGS...]

Starts PROGRAM once per process of the job, on this machine, with RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT and ACCEL_* set.
Settings: command line > environment (ACCEL_<KEY>) > config file > detected default.
Options take `--flag VALUE` or `--flag=VALUE`; torchrun's dashed spellings work too.

What to run (each is also a config key):
  --config_file FILE          the config `accel config` wrote (default: $ACCEL_CONFIG_FILE,
                              else ~/.config/accelerate-cpp/default_config.yaml if present)
@num_processes|processes over all machines
  --nproc_per_node N          torchrun's way: num_processes = N x num_machines
@num_machines|machines taking part (torchrun: --nnodes)
@machine_rank|this machine, 0..M-1; machine 0 hosts the store (--node_rank)
@main_process_ip|machine 0's address (--master_addr)
@main_process_port|the store's port; 0 = a free one, single machine (--master_port)
@mixed_precision|
@zero_stage|with --use_zero
@gpu_ids|becomes CUDA_VISIBLE_DEVICES
  --gradient_accumulation_steps N, --offload_optimizer_device @@offload_optimizer_device, --use_cpu[=BOOL]
Distributed type (or --distributed_type @@distributed_type):
  --multi_gpu                 one process per GPU, NCCL
  --multi_cpu                 one process per core group, Gloo (or MPI)
  --cpu                       run on CPU even where GPUs exist (use_cpu)
  --data_parallel             one process, a replica per GPU or CPU thread
                              (--data_parallel_replicas N on the CPU; 0 = one per core)
  --use_zero, --use_deepspeed ZeRO-sharded optimizer state
@cpu_communicator|
                            communicator for CPU processes (also --comm_backend)

Supervision:
  --max_restarts N            restart every worker up to N times after a failure (0)
  --monitor_interval SECONDS  how often workers are checked (0.1; at least 0.01)
  --grace_period SECONDS      SIGTERM -> SIGKILL when stopping workers (5)
  --rdzv_timeout SECONDS      how long machines wait for each other to join (300)
  --heartbeat_interval SECONDS  how often the machines' launchers check in (5)
  --heartbeat_misses N        check-ins a machine may miss before the job stops on it (3)
Output:
  --log_dir DIR               every rank's output also in DIR/rank_<R>.log
  --tee 0|1|2|3               with --log_dir: which streams also reach the console
                              (0 none, 1 stdout, 2 stderr, 3 both; default 3)
  -q, --quiet                 do not print the settings
Worker environment (each default applies only when the variable is unset, and is printed):
  --num_cpu_threads_per_process N   OMP_NUM_THREADS=N (default: cores / local processes)
  --no_omp_num_threads        do not set OMP_NUM_THREADS
  --no_malloc_hugetlb         do not set GLIBC_TUNABLES (malloc on huge pages, big blocks
                              reused) for CPU workers
  --no_gloo_hostname          do not set ACCEL_GLOO_HOSTNAME to our address toward machine 0
  --no_default_env            none of the three above
MPI:
  --use_mpi                   start the processes with mpirun (workers read OMPI_COMM_WORLD_*)
  --mpi_hostfile FILE         mpirun --hostfile FILE (several machines)
  --mpirun_arg ARG            passed to mpirun as is (repeat for several)
)";

// The usage with each config key's values as the schema declares them (config.hpp): a line
// "@KEY|TEXT" becomes "  --KEY VALUES   TEXT", and "@@KEY" inside a line becomes VALUES.
std::string usage() {
  constexpr std::size_t kTextColumn = 30;
  std::string out;
  std::string_view rest = kUsageTemplate;
  while (!rest.empty()) {
    const auto eol = rest.find('\n');
    std::string line(rest.substr(0, eol));
    rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 1);
    if (line.starts_with("@") && !line.starts_with("@@")) {
      const auto bar = line.find('|');
      const std::string key = line.substr(1, bar - 1), text = line.substr(bar + 1);
      line = "  --" + key + " " + config::value_hint(key);
      if (!text.empty())
        line += std::string(line.size() < kTextColumn ? kTextColumn - line.size() : 1, ' ') + text;
    }
    for (std::size_t at; (at = line.find("@@")) != std::string::npos;) {
      std::size_t end = at + 2;
      while (end < line.size() &&
             (std::isalnum(static_cast<unsigned char>(line[end])) || line[end] == '_'))
        ++end;
      line.replace(at, end - at, config::value_hint(line.substr(at + 2, end - at - 2)));
    }
    out += line + "\n";
  }
  return out;
}

// Durations are at most 11 days (1e6 s): beyond, the milliseconds would overflow.
constexpr double kMaxSeconds = 1e6;
// Checking the workers more often than this only burns a core (0 would spin it).
constexpr double kMinMonitorInterval = 0.01;

double parse_number(std::string_view flag, const std::string& text) {
  double out = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(out) || out < 0)
    throw ConfigError("accel launch: " + std::string(flag) + " expects a number of seconds, got '" +
                      text + "'");
  if (out > kMaxSeconds)
    throw ConfigError("accel launch: " + std::string(flag) +
                      " must be at most 1000000 seconds, got " + text);
  return out;
}

int parse_int(std::string_view flag, const std::string& text, int min_value) {
  int out = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty())
    throw ConfigError("accel launch: " + std::string(flag) + " expects an integer, got '" + text +
                      "'");
  if (out < min_value)
    throw ConfigError("accel launch: " + std::string(flag) + " must be at least " +
                      std::to_string(min_value) + ", got " + text);
  return out;
}

std::chrono::milliseconds seconds(std::string_view flag, const std::string& text) {
  return std::chrono::milliseconds(std::llround(parse_number(flag, text) * 1000));
}

bool parse_bool(std::string_view flag, const std::string& text) {
  if (text == "true" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "no") return false;
  throw ConfigError("accel launch: " + std::string(flag) + " expects true or false, got '" + text +
                    "'");
}

launch::Streams parse_tee(const std::string& text) {
  if (text == "0" || text == "none") return launch::Streams::none;
  if (text == "1" || text == "stdout") return launch::Streams::out;
  if (text == "2" || text == "stderr") return launch::Streams::err;
  if (text == "3" || text == "all" || text == "both") return launch::Streams::both;
  throw ConfigError(
      "accel launch: --tee expects 0 (none), 1 (stdout), 2 (stderr) or 3 (both), got '" + text +
      "'");
}

struct Flag {
  bool takes_value;
  std::function<void(const std::string& flag, const std::string& value)> apply;
};

// The launcher's own flags, and aliases of config keys in Accelerate's and torchrun's words.
std::map<std::string, Flag> flag_table(launch::LaunchOptions& o) {
  auto set_key = [&o](std::string key) {
    return [&o, key](const std::string&, const std::string& v) { o.overrides[key] = v; };
  };
  auto set_fixed = [&o](std::string key, std::string value) {
    return [&o, key, value](const std::string&, const std::string& v) {
      if (!v.empty() && !parse_bool("--" + key, v)) return;  // --multi_gpu=false: no-op
      o.overrides[key] = value;
    };
  };
  std::map<std::string, Flag> t;
  t["config_file"] = {true, [&o](auto&, auto& v) { o.config_file = v; }};
  t["max_restarts"] = {true, [&o](auto& f, auto& v) { o.max_restarts = parse_int(f, v, 0); }};
  t["monitor_interval"] = {true, [&o](auto& f, auto& v) {
                             if (parse_number(f, v) < kMinMonitorInterval)
                               throw ConfigError("accel launch: " + f +
                                                 " must be at least 0.01 seconds (checking more "
                                                 "often only burns a core), got " +
                                                 v);
                             o.monitor_interval = seconds(f, v);
                           }};
  t["grace_period"] = {true, [&o](auto& f, auto& v) { o.grace = seconds(f, v); }};
  t["rdzv_timeout"] = {true, [&o](auto& f, auto& v) { o.rdzv_timeout = seconds(f, v); }};
  t["heartbeat_interval"] = {true, [&o](auto& f, auto& v) {
                               o.heartbeat_interval =
                                   std::max(seconds(f, v), std::chrono::milliseconds(10));
                             }};
  t["heartbeat_misses"] = {true,
                           [&o](auto& f, auto& v) { o.heartbeat_misses = parse_int(f, v, 1); }};
  t["log_dir"] = {true, [&o](auto&, auto& v) { o.log_dir = v; }};
  t["tee"] = {true, [&o](auto&, auto& v) { o.tee = parse_tee(v); }};
  t["num_cpu_threads_per_process"] = {
      true, [&o](auto& f, auto& v) { o.num_cpu_threads_per_process = parse_int(f, v, 1); }};
  t["no_omp_num_threads"] = {false, [&o](auto&, auto&) { o.env_defaults.omp_num_threads = false; }};
  t["no_malloc_hugetlb"] = {false, [&o](auto&, auto&) { o.env_defaults.malloc_hugetlb = false; }};
  t["no_gloo_hostname"] = {false, [&o](auto&, auto&) { o.env_defaults.gloo_hostname = false; }};
  t["no_default_env"] = {false, [&o](auto&, auto&) { o.env_defaults = {false, false, false}; }};
  t["use_mpi"] = {false, [&o](auto& f, auto& v) { o.use_mpi = v.empty() || parse_bool(f, v); }};
  t["mpi_hostfile"] = {true, [&o](auto&, auto& v) { o.mpi_hostfile = v; }};
  t["mpirun_arg"] = {true, [&o](auto&, auto& v) { o.mpirun_args.push_back(v); }};
  t["quiet"] = {false, [&o](auto&, auto&) { o.quiet = true; }};
  // The distributed type, Accelerate's way.
  t["multi_gpu"] = {false, set_fixed("distributed_type", "MULTI_GPU")};
  t["multi_cpu"] = {false, set_fixed("distributed_type", "MULTI_CPU")};
  t["data_parallel"] = {false, set_fixed("distributed_type", "DATA_PARALLEL")};
  t["use_zero"] = {false, set_fixed("distributed_type", "ZERO")};
  t["use_deepspeed"] = {false, set_fixed("distributed_type", "ZERO")};
  t["cpu"] = {false, set_fixed("use_cpu", "true")};
  t["comm_backend"] = {true, set_key("cpu_communicator")};
  // torchrun's names for the same settings.
  t["nnodes"] = {true, set_key("num_machines")};
  t["node_rank"] = {true, set_key("machine_rank")};
  t["master_addr"] = {true, set_key("main_process_ip")};
  t["master_port"] = {true, set_key("main_process_port")};
  // Every config key, under its own name.
  for (const auto& spec : config::schema())
    if (!t.count(spec.name)) {
      if (spec.kind == config::ValueKind::boolean)
        t[spec.name] = {false, [&o, key = spec.name](auto&, auto& v) {
                          o.overrides[key] = v.empty() ? "true" : v;
                        }};
      else
        t[spec.name] = {true, set_key(spec.name)};
    }
  return t;
}

std::string suggestion(const std::map<std::string, Flag>& table, const std::string& name) {
  // The closest known flag by edit distance, when it is close enough to be a typo.
  std::string best;
  std::size_t best_d = 4;
  for (const auto& [known, flag] : table) {
    std::vector<std::size_t> row(known.size() + 1);
    for (std::size_t j = 0; j <= known.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= name.size(); ++i) {
      std::size_t diag = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= known.size(); ++j) {
        const std::size_t up = row[j];
        row[j] =
            std::min({row[j] + 1, row[j - 1] + 1, diag + (name[i - 1] == known[j - 1] ? 0 : 1)});
        diag = up;
      }
    }
    if (row[known.size()] < best_d) {
      best_d = row[known.size()];
      best = known;
    }
  }
  return best.empty() ? "" : " (did you mean --" + best + "?)";
}

launch::LaunchOptions parse_launch_options(int argc, char** argv, bool* help) {
  launch::LaunchOptions options;
  const auto table = flag_table(options);
  std::optional<int> nproc_per_node;
  int i = 0;
  for (; i < argc; ++i) {
    const std::string arg(argv[i]);
    if (arg == "--") {
      ++i;
      break;
    }
    if (!arg.starts_with("-") || arg == "-") break;  // the program: everything from here is its own
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return options;
    }
    if (arg == "-q") {
      options.quiet = true;
      continue;
    }
    if (!arg.starts_with("--"))
      throw ConfigError("accel launch: unknown option " + arg + " (options are spelled --name)");
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.erase(eq);
    }
    for (char& c : name)
      if (c == '-') c = '_';  // torchrun spells --max-restarts
    const std::string flag = "--" + name;
    if (name == "nproc_per_node") {
      if (!value && i + 1 >= argc) throw ConfigError("accel launch: " + flag + " needs a value");
      nproc_per_node = parse_int(flag, value ? *value : argv[++i], 1);
      continue;
    }
    const auto it = table.find(name);
    if (it == table.end())
      throw ConfigError("accel launch: unknown option " + arg.substr(0, arg.find('=')) +
                        suggestion(table, name));
    if (it->second.takes_value && !value) {
      if (i + 1 >= argc) throw ConfigError("accel launch: " + flag + " needs a value");
      value = argv[++i];
    }
    it->second.apply(flag, value.value_or(""));
  }
  for (; i < argc; ++i) options.program.emplace_back(argv[i]);
  options.nproc_per_node = nproc_per_node;
  return options;
}

}  // namespace

int run_launch_command(int argc, char** argv) {
  bool help = false;
  const launch::LaunchOptions options = parse_launch_options(argc, argv, &help);
  if (help) {
    std::fputs(usage().c_str(), stdout);
    return 0;
  }
  if (options.program.empty())
    throw ConfigError(
        "accel launch: no program to launch (usage: accel launch [options] PROGRAM [ARGS...])");
  return launch::launch(options);
}

}  // namespace accel::tools
