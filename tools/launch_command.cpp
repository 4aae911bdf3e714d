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
#include "foundation/error.hpp"
#include "launch/launcher.hpp"
#include "tools/commands.hpp"

namespace accel::tools {
namespace {

constexpr const char* kUsageTemplate = R"(usage: accel launch [options] PROGRAM [ARGS...]

Starts PROGRAM once per process of the job, on this machine, with RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT and ACCEL_* set.
Settings: command line > environment (ACCEL_<KEY>) > config file > detected default.
Options take `--flag VALUE` or `--flag=VALUE`; torchrun's dashed spellings work too.

What to run:
  --config_file FILE          the config `accel config` wrote (default: $ACCEL_CONFIG_FILE,
                              else ~/.config/accelerate-cpp/default_config.yaml if present)
  --nproc_per_node N          torchrun's way: num_processes = N x num_machines
  --multi_gpu, --multi_cpu, --data_parallel, --use_zero (--use_deepspeed)
                              shorthands for --distributed_type MULTI_GPU, MULTI_CPU, ...
  --cpu                       shorthand for --use_cpu true
@KEYS
Supervision:
  --max_restarts N            restart every worker up to N times after a failure (0)
  --monitor_interval SECONDS  how often workers are checked (0.1; at least 0.01)
  --grace_period SECONDS      SIGTERM -> SIGKILL when stopping workers (5)
  --rdzv_timeout SECONDS      how long machines wait for each other to join (300; elastic 600)
  --heartbeat_interval SECONDS  how often the machines' launchers check in (5)
  --heartbeat_misses N        check-ins a machine may miss before the job stops on it (3)
torchrun's rendezvous flags:
  --nnodes N                  --num_machines N (N:N too); every machine gives --machine_rank
  --nnodes MIN:MAX            elastic: machines join rounds (ranks by join order, the store's
                              host first); a lost machine or failure restarts whoever is left
                              (at least MIN; counted by --max_restarts), a machine joining
                              restarts the job bigger (not counted)
  --standalone                one machine, its store on a free local port
  --rdzv_endpoint HOST[:PORT] --main_process_ip HOST [--main_process_port PORT]; elastic:
                              the agent whose address HOST is hosts the store
  --rdzv_backend static|c10d  static: --machine_rank; c10d: elastic rounds at any --nnodes
  --rdzv_id ID                the workers' TORCHELASTIC_RUN_ID (default: none)
  --rdzv_conf K=V,...         join_timeout (--rdzv_timeout), keep_alive_interval
                              (--heartbeat_interval), keep_alive_max_attempt
                              (--heartbeat_misses), last_call_timeout (elastic; 30)
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

// Wraps `text` to lines of at most kWidth columns, every line after the first indented by
// `indent` spaces.
std::string wrapped(const std::string& text, std::size_t first_column, std::size_t indent) {
  constexpr std::size_t kWidth = 100;
  std::string out;
  std::size_t column = first_column;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    if (column > first_column && column + 1 + word.size() > kWidth) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
    } else if (column > first_column || (column == first_column && !out.empty())) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    at = end + 1;
  }
  return out;
}

// One entry per config key, derived from the schema (config.hpp): the flag and its values,
// the help, the default, the torchrun alias and the environment variable.
std::string key_lines() {
  constexpr std::size_t kTextColumn = 30;
  std::string out =
      "Config keys (each also ACCEL_<KEY> in the environment and a line in the file):\n";
  for (const auto& spec : config::schema()) {
    std::string line = "  " + config::flag_for(spec.name) + " " + config::value_hint(spec.name);
    if (spec.kind == config::ValueKind::boolean)
      line = "  " + config::flag_for(spec.name) + "[=BOOL]";
    std::string text = spec.help + " (default: " + config::default_text(spec);
    for (const auto& alias : spec.aliases) text += "; also --" + alias;
    text += ")";
    if (line.size() + 2 > kTextColumn) {
      out += line + "\n" + std::string(kTextColumn, ' ');
    } else {
      out += line + std::string(kTextColumn - line.size(), ' ');
    }
    out += wrapped(text, kTextColumn, kTextColumn) + "\n";
  }
  return out;
}

std::string usage() {
  std::string out = kUsageTemplate;
  const auto at = out.find("@KEYS\n");
  return out.replace(at, 6, key_lines());
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

// torchrun's rendezvous flags, for the rendezvous this launcher runs (torchrun's "static"):
// machine 0 hosts the store at main_process_ip:main_process_port and every machine gives its
// --machine_rank. Elastic ranges and the c10d backend (ranks by join order) are refused,
// saying so.
void add_rendezvous_flags(launch::LaunchOptions& o, std::map<std::string, Flag>& t) {
  t["nnodes"] = {true, [&o](const std::string& f, const std::string& v) {
                   const std::size_t colon = v.find(':');
                   o.overrides.erase("min_machines");  // the last --nnodes counts
                   if (colon == std::string::npos) {
                     o.overrides["num_machines"] = v;
                     return;
                   }
                   const int lo = parse_int(f, v.substr(0, colon), 1);
                   const int hi = parse_int(f, v.substr(colon + 1), 1);
                   if (lo > hi)
                     throw ConfigError("accel launch: " + f + " " + v +
                                       ": MIN is above MAX (expected MIN:MAX, MIN <= MAX)");
                   // A range is elastic (machines join and leave); N:N is a fixed count.
                   if (lo != hi) o.overrides["min_machines"] = std::to_string(lo);
                   o.overrides["num_machines"] = std::to_string(hi);
                 }};
  t["rdzv_backend"] = {
      true, [&o](const std::string& f, const std::string& v) {
        // c10d: ranks given out as machines join (elastic_agent.hpp), at any --nnodes.
        if (v == "static" || v == "c10d") {
          o.overrides["rdzv_backend"] = v;
          return;
        }
        throw ConfigError("accel launch: " + f + " expects static or c10d, got '" + v + "'");
      }};
  // HOST, HOST:PORT, [IPV6]:PORT, or a bare IPv6 address.
  t["rdzv_endpoint"] = {
      true, [&o](const std::string& f, const std::string& v) {
        std::string host = v, port;
        if (v.starts_with('[') && v.find(']') != std::string::npos) {
          host = v.substr(1, v.find(']') - 1);
          const std::string rest = v.substr(v.find(']') + 1);
          if (rest.starts_with(':')) port = rest.substr(1);
        } else if (v.find(':') != std::string::npos && v.find(':') == v.rfind(':')) {
          host = v.substr(0, v.find(':'));
          port = v.substr(v.find(':') + 1);
        }
        if (host.empty())
          throw ConfigError("accel launch: " + f + " expects HOST[:PORT], got '" + v + "'");
        o.overrides["main_process_ip"] = host;
        if (!port.empty()) o.overrides["main_process_port"] = port;
      }};
  t["rdzv_id"] = {true, [&o](const std::string&, const std::string& v) { o.run_id = v; }};
  t["rdzv_conf"] = {
      true, [&o](const std::string& f, const std::string& v) {
        for (std::size_t at = 0; at < v.size();) {
          const std::size_t comma = std::min(v.find(',', at), v.size());
          const std::string item = v.substr(at, comma - at);
          at = comma + 1;
          const std::size_t eq = item.find('=');
          const std::string key = item.substr(0, eq),
                            value = eq == std::string::npos ? "" : item.substr(eq + 1);
          const std::string what = f + " " + key;
          if (key == "join_timeout")
            o.rdzv_timeout = seconds(what, value);
          else if (key == "keep_alive_interval")
            o.heartbeat_interval = std::max(seconds(what, value), std::chrono::milliseconds(10));
          else if (key == "keep_alive_max_attempt")
            o.heartbeat_misses = parse_int(what, value, 1);
          else if (key == "last_call_timeout")
            o.last_call_timeout = seconds(what, value);
          else
            throw ConfigError("accel launch: " + f + ": unknown key '" + key +
                              "' (known: join_timeout, last_call_timeout, keep_alive_interval, "
                              "keep_alive_max_attempt)");
        }
      }};
  t["standalone"] = {false, [&o](const std::string& f, const std::string& v) {
                       if (!v.empty() && !parse_bool(f, v)) return;
                       o.standalone = true;
                     }};
}

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
  // Every config key, under its own name and its aliases (torchrun's names).
  for (const auto& spec : config::schema()) {
    for (const auto& alias : spec.aliases) t[alias] = {true, set_key(spec.name)};
    if (!t.count(spec.name)) {
      if (spec.kind == config::ValueKind::boolean)
        t[spec.name] = {false, [&o, key = spec.name](auto&, auto& v) {
                          o.overrides[key] = v.empty() ? "true" : v;
                        }};
      else
        t[spec.name] = {true, set_key(spec.name)};
    }
  }
  add_rendezvous_flags(o, t);
  return t;
}

std::string suggestion(const std::map<std::string, Flag>& table, const std::string& name) {
  std::vector<std::string> known;
  for (const auto& [flag, unused] : table) known.push_back(flag);
  const std::string best = config::closest_name(name, known);
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
  if (options.standalone) {
    // torchrun's --standalone: this machine alone, its store on a free local port.
    for (const char* key : {"num_machines", "main_process_ip", "main_process_port"})
      if (options.overrides.count(key) &&
          !(std::string(key) == "num_machines" && options.overrides.at(key) == "1"))
        throw ConfigError(std::string("accel launch: --standalone runs one machine on a free "
                                      "local port; it cannot be combined with --") +
                          (std::string(key) == "num_machines" ? "nnodes/--num_machines" : key) +
                          " (or --rdzv_endpoint)");
    options.overrides["num_machines"] = "1";
    options.overrides["machine_rank"] = "0";
    options.overrides["main_process_ip"] = "127.0.0.1";
    options.overrides["main_process_port"] = "0";
  }
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
