// The config: every bad file exits `accel config validate` with 2 and a message naming the
// file, the line and the key; Accelerate's own configs are accepted; precedence default <
// file < environment < command line, with the source of every value; atomic saves.

#include <doctest/doctest.h>
#include <cctype>

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "config/config.hpp"
#include "config/config_file.hpp"
#include "config/detect.hpp"
#include "config/layers.hpp"
#include "config/resolve.hpp"
#include "foundation/error.hpp"
#include "foundation/file_io.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"

using namespace accel;
using namespace accel::config;
namespace fs = std::filesystem;
using accel::test::read_file;
using accel::test::TempDir;
using accel::test::write_file;

namespace {

// Every config-related variable removed, and HOME / XDG_CONFIG_HOME pointed into `home`, so
// neither this process nor its children see the user's real config. Restored at scope end.
class CleanEnvironment {
 public:
  explicit CleanEnvironment(const TempDir& home) {
    std::vector<std::string> names = {"ACCEL_CONFIG_FILE", "HOME", "XDG_CONFIG_HOME"};
    for (const auto& spec : schema()) names.push_back(env_var_for(spec.name));
    for (const auto& name : names) {
      const char* value = std::getenv(name.c_str());
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
      ::unsetenv(name.c_str());
    }
    ::setenv("HOME", home.path.c_str(), 1);
    ::setenv("XDG_CONFIG_HOME", (home.path / "xdg").c_str(), 1);
  }
  ~CleanEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// Runs `accel ARGS...` (through `sh -c PREFIX` when given: ulimit, redirections) and captures
// what it prints.
launch::WorkerExit run_accel(const std::vector<std::string>& args,
                             const std::vector<std::pair<std::string, std::string>>& env = {},
                             const std::string& shell_prefix = "") {
  launch::WorkerSpec spec;
  if (shell_prefix.empty()) {
    spec.argv = {test::bin_path("accel")};
  } else {
    spec.argv = {"sh", "-c", shell_prefix + "; exec \"$0\" \"$@\"", test::bin_path("accel")};
  }
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = env;
  spec.label = "accel";
  launch::WorkerGroupOptions options;
  options.capture = true;
  options.echo = false;
  options.timeout = std::chrono::seconds(60);
  auto result = launch::run_worker_group({spec}, options);
  REQUIRE_FALSE(result.timed_out);
  return result.workers.at(0);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

// Accelerate's `accelerate config` output for 2 GPUs, as users have it on disk.
constexpr const char* kAccelerateMultiGpu =
    "compute_environment: LOCAL_MACHINE\n"
    "debug: false\n"
    "deepspeed_config: {}\n"
    "distributed_type: MULTI_GPU\n"
    "downcast_bf16: 'no'\n"
    "enable_cpu_affinity: false\n"
    "fsdp_config: {}\n"
    "gpu_ids: all\n"
    "machine_rank: 0\n"
    "main_process_ip: null\n"
    "main_process_port: null\n"
    "main_training_function: main\n"
    "mixed_precision: fp16\n"
    "num_machines: 1\n"
    "num_processes: 2\n"
    "rdzv_backend: static\n"
    "same_network: true\n"
    "tpu_env: []\n"
    "tpu_use_cluster: false\n"
    "tpu_use_sudo: false\n"
    "use_cpu: false\n";

}  // namespace

TEST_CASE("each bad config exits 2 naming the file, the line and the key") {
  TempDir dir;
  CleanEnvironment clean(dir);
  struct Case {
    const char* yaml;
    int line;
    const char* key;
    const char* problem;
  };
  const Case cases[] = {
      {"distributed_type: MULTI_CPU\nnum_processes: 2\nnum_gpus: 2\n", 3, "num_gpus",
       "unknown key"},
      {"distributed_type: MULTI_CPU\nnum_processes: four\n", 2, "num_processes",
       "expects a whole number, got 'four'"},
      {"distributed_type: MULTI_CPU\nnum_processes: 0\n", 2, "num_processes",
       "0 is not a process count (1 or more)"},
      {"distributed_type: MULTI_CPU\nnum_processes: 2\nmain_process_port: 70000\n", 3,
       "main_process_port", "70000 is not a TCP port (0-65535)"},
      {"distributed_type: MULTI_CPU\nnum_processes: 4\nmachine_rank: 2\nnum_machines: 2\n", 3,
       "machine_rank", "2 is not below num_machines (2)"},
      {"distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 3\n", 3, "num_processes",
       "3 processes do not divide evenly over num_machines (2)"},
      {"distributed_type: ZERO\nzero_stage: 4\n", 2, "zero_stage", "4 is not a ZeRO stage (1-3)"},
      {"distributed_type: ZERO\nzero_stage: 2\nreshard_after_forward: false\n", 3,
       "reshard_after_forward", "reshard_after_forward needs zero_stage 3"},
      {"distributed_type: MULTI_GPU\nnum_processes: 2\nzero_stage: 2\n", 3, "zero_stage",
       "zero_stage 2 needs distributed_type ZERO, not MULTI_GPU"},
      {"distributed_type: MULTI_CPU\noffload_optimizer_device: cpu\n", 2,
       "offload_optimizer_device", "needs distributed_type ZERO"},
      {"distributed_type: FSDMP\n", 1, "distributed_type",
       "'FSDMP' is not one of NO, DATA_PARALLEL"},
      {"distributed_type: MULTI_CPU\nhybrid_shard: true\n", 2, "hybrid_shard",
       "hybrid_shard needs distributed_type ZERO"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_offload_params: true\n", 3,
       "fsdp_config.fsdp_offload_params", "offloading parameters is not available"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n", 3,
       "fsdp_config.fsdp_auto_wrap_policy", "SIZE_BASED_WRAP is not available"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_state_dict_type: LOCAL_STATE_DICT\n", 3,
       "fsdp_config.fsdp_state_dict_type",
       "'LOCAL_STATE_DICT' is not one of FULL_STATE_DICT, SHARDED_STATE_DICT"},
      {"distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding: true\n", 3,
       "fsdp_config.fsdp_sharding", "unknown key"},
      {"distributed_type: FSDP\nzero_stage: 2\nfsdp_config:\n  fsdp_sharding_strategy: 1\n", 2,
       "zero_stage", "2 contradicts FSDP's sharding strategy (stage 3"},
      {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  offload_param_device: cpu\n", 3,
       "deepspeed_config.offload_param_device", "offloading parameters ('cpu') is not available"},
      {"mixed_precision: fp8\n", 1, "mixed_precision", "'fp8' is not one of no, fp16, bf16"},
      {"distributed_type: MULTI_GPU\nnum_processes: 2\ngpu_ids: 0,0\n", 3, "gpu_ids",
       "GPU id 0 is listed twice"},
      {"distributed_type: MULTI_GPU\nnum_processes: 4\ngpu_ids: 0,1\n", 3, "gpu_ids",
       "lists 2 GPU(s) but 4 processes run on each machine"},
      {"distributed_type: MULTI_GPU\nnum_processes: 2\nuse_cpu: true\n", 3, "use_cpu",
       "contradicts distributed_type MULTI_GPU"},
      {"distributed_type: NO\nnum_processes: 2\n", 2, "num_processes",
       "distributed_type NO runs one process"},
      {"num_processes:\n  per_node: 2\n", 1, "num_processes", "expects a single value, got a map"},
      {"use_cpu: maybe\n", 1, "use_cpu", "expects true or false, got 'maybe'"},
      {"num_processes: 1\nnum_processes: 1\n", 2, "num_processes", "given twice (first on line 1)"},
      {"distributed_type: DEEPSPEED\nzero_stage: 2\ndeepspeed_config:\n  zero_stage: 3\n", 4,
       "deepspeed_config.zero_stage", "given twice (first on line 2)"},
      {"distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  zero_sharding: true\n",
       4, "deepspeed_config.zero_sharding", "unknown key"},
      {"distributed_type: MULTI_CPU\nmain_process_ip: [a, b]\n", 2, "main_process_ip",
       "expects a single value, got a list"},
      {"distributed_type: DATA_PARALLEL\nuse_cpu: true\ndata_parallel_replicas: -1\n", 3,
       "data_parallel_replicas", "-1 is not a replica count (0 = one per CPU core, or more)"},
      {"distributed_type: MULTI_CPU\nnum_processes: 2\ndata_parallel_replicas: 2\n", 3,
       "data_parallel_replicas", "2 replicas need distributed_type DATA_PARALLEL, not MULTI_CPU"},
      {"distributed_type: DATA_PARALLEL\nuse_cpu: true\ngpu_ids: 0\n", 3, "gpu_ids",
       "DATA_PARALLEL runs on the CPU here"},
      {"distributed_type: DATA_PARALLEL\nuse_cpu: false\ndata_parallel_replicas: 2\n", 3,
       "data_parallel_replicas", "data_parallel_replicas is for CPU replicas"},
      // A value forgotten is not a default taken (null is how "not set" is written).
      {"num_processes: 1\nmixed_precision:\n", 2, "mixed_precision", "no value given"},
      {"mixed_precision:   # fp16 later\nnum_processes: 1\n", 1, "mixed_precision",
       "no value given"},
      // yaml-cpp would read the quote to the end of the file, swallowing the keys after it.
      {"distributed_type: MULTI_CPU\nmain_process_ip: '10.0.0.1\nnum_processes: 2\n", 2,
       "main_process_ip", "the quote (') opened here is never closed"},
      {"distributed_type: MULTI_CPU\nnum_processes: 2\nmain_process_ip: \"10.0.0.1\n", 3,
       "main_process_ip", "the quote (\") opened here is never closed"},
      {"distributed_type: MULTI_CPU\nnum_processes: 100000\n", 2, "num_processes",
       "100000 processes on one machine; at most 1024 run on one machine"},
      {"distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 4000\n", 3, "num_processes",
       "4000 processes over 2 machines are 2000 per machine; at most 1024"},
      {"distributed_type: MULTI_CPU\nmain_process_ip: 10.0.0.1;reboot\n", 2, "main_process_ip",
       "expects a host name or IP address"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.file("bad.yaml");
    write_file(path, c.yaml);
    const auto out = run_accel({"config", "validate", path});
    const std::string expected = path + ":" + std::to_string(c.line) + ": key '" + c.key + "': ";
    INFO("config:\n" << c.yaml << "output:\n" << out.output);
    CHECK(out.exit_code == 2);
    CHECK(contains(out.output, expected));
    CHECK(contains(out.output, c.problem));
  }
}

TEST_CASE("Accelerate's FSDP config maps onto ZERO: the sharding strategy is the stage") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("fsdp.yaml");
  // As `accelerate config` writes it (FSDP v1 keys), with the sharding strategy varied.
  const auto fsdp = [&](const std::string& extra) {
    write_file(path,
               "compute_environment: LOCAL_MACHINE\n"
               "distributed_type: FSDP\n"
               "fsdp_config:\n"
               "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
               "  fsdp_backward_prefetch: BACKWARD_PRE\n"
               "  fsdp_offload_params: false\n"
               "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
               "  fsdp_version: 1\n" +
                   extra +
                   "mixed_precision: 'no'\n"
                   "num_machines: 1\n"
                   "num_processes: 2\n"
                   "use_cpu: true\n");
    return load_config_file(path);
  };
  const auto full = fsdp("  fsdp_sharding_strategy: FULL_SHARD\n");
  CHECK(full.config.distributed_type == DistributedType::ZERO);
  CHECK(full.config.zero_stage == 3);
  CHECK(full.config.reshard_after_forward);
  CHECK(full.origins.at("zero_stage") == path + ":9");
  CHECK(full.notes.size() == 2);  // prefetch, version
  CHECK(full.config.auto_wrap_policy == config::AutoWrapPolicy::TRANSFORMER_BASED_WRAP);
  CHECK(full.origins.at("auto_wrap_policy") == path + ":4");
  CHECK(full.config.state_dict_type == config::StateDictType::SHARDED_STATE_DICT);
  CHECK_FALSE(full.config.hybrid_shard);
  // HYBRID_SHARD: stage 3 within each machine, replicated across; its ZeRO-2 form stage 2.
  for (const char* hybrid : {"HYBRID_SHARD", "hybrid_shard", "4"}) {
    const auto h = fsdp(std::string("  fsdp_sharding_strategy: ") + hybrid + "\n");
    CHECK(h.config.zero_stage == 3);
    CHECK(h.config.hybrid_shard);
    CHECK(h.origins.at("hybrid_shard") == path + ":9");
  }
  const auto hybrid2 = fsdp("  fsdp_sharding_strategy: _HYBRID_SHARD_ZERO2\n");
  CHECK(hybrid2.config.zero_stage == 2);
  CHECK(hybrid2.config.hybrid_shard);
  CHECK(full.origins.at("state_dict_type") == path + ":7");
  CHECK(fsdp("").config.zero_stage == 3);  // FULL_SHARD is FSDP's default
  CHECK(fsdp("  fsdp_sharding_strategy: SHARD_GRAD_OP\n").config.zero_stage == 2);
  const auto kept = fsdp("  fsdp_sharding_strategy: 1\n  fsdp_reshard_after_forward: false\n");
  CHECK(kept.config.zero_stage == 3);
  CHECK_FALSE(kept.config.reshard_after_forward);
  CHECK(kept.origins.at("reshard_after_forward") == path + ":10");
  // Newer Accelerate writes the strategy's name under fsdp_reshard_after_forward.
  CHECK(fsdp("  fsdp_reshard_after_forward: SHARD_GRAD_OP\n").config.zero_stage == 2);
  CHECK(fsdp("  fsdp_reshard_after_forward: full_shard\n").config.zero_stage == 3);
  // A number there is FSDP2's boolean, not a strategy's number (1 would be FULL_SHARD).
  const auto numeric =
      fsdp("  fsdp_sharding_strategy: SHARD_GRAD_OP\n  fsdp_reshard_after_forward: 1\n");
  CHECK(numeric.config.zero_stage == 2);
  const auto zero3_kept =
      fsdp("  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_reshard_after_forward: 0\n");
  CHECK(zero3_kept.config.zero_stage == 3);
  CHECK_FALSE(zero3_kept.config.reshard_after_forward);
  CHECK(fsdp("  fsdp_activation_checkpointing: true\n").config.activation_checkpointing);
  CHECK_FALSE(full.config.activation_checkpointing);
  const auto ddp = fsdp("  fsdp_sharding_strategy: NO_SHARD\n");
  CHECK(ddp.config.distributed_type == DistributedType::MULTI_CPU);
  CHECK(ddp.config.zero_stage == 0);
}

TEST_CASE("the exact message for a port out of range") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  write_file(path, "distributed_type: MULTI_CPU\nnum_processes: 2\nmain_process_port: 70000\n");
  const auto out = run_accel({"config", "validate", path});
  CHECK(out.exit_code == 2);
  CHECK(out.output == path + ":3: key 'main_process_port': 70000 is not a TCP port (0-65535)\n");
}

TEST_CASE(
    "unparsable YAML, a top level that is not a map and a missing file exit 2 naming the file") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("broken.yaml");
  write_file(path, "distributed_type: MULTI_CPU\nnum_processes: [1, 2\nmixed_precision: no\n");
  auto out = run_accel({"config", "validate", path});
  INFO(out.output);
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, path + ":"));
  CHECK(contains(out.output, ": invalid YAML: "));

  write_file(path, "- distributed_type\n- NO\n");
  out = run_accel({"config", "validate", path});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, path + ":1: expected a map of key: value, got a list"));

  const std::string missing = dir.file("nowhere.yaml");
  out = run_accel({"config", "validate", missing});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, missing + ": cannot read config file: No such file or directory"));

  // A second document would be dropped without a word; one is all a config file holds.
  write_file(path, "distributed_type: MULTI_CPU\nnum_processes: 2\n---\nnum_processes: 4\n");
  out = run_accel({"config", "validate", path});
  INFO(out.output);
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, path + ":4: a second YAML document (after '---')"));

  // null (and ~) still mean "not set", as Accelerate writes them; so does an empty file.
  write_file(path, "mixed_precision: null\nnum_processes: ~\ngpu_ids: Null # later\n");
  out = run_accel({"config", "validate", path});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  write_file(path, "");
  CHECK(run_accel({"config", "validate", path}).exit_code == 0);
}

TEST_CASE(
    "Accelerate's own config files are accepted, with a note for each key that means nothing "
    "here") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("accelerate.yaml");
  write_file(path, kAccelerateMultiGpu);
  const auto out = run_accel({"config", "validate", path});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, path + ": valid"));
  CHECK(contains(out.output, "note: " + path + ":2: key 'debug': "));
  CHECK(contains(out.output, "key 'same_network'"));

  const auto loaded = load_config_file(path);
  CHECK(loaded.config.distributed_type == DistributedType::MULTI_GPU);
  CHECK(loaded.config.num_processes == 2);
  CHECK(loaded.config.rdzv_backend == "static");
  CHECK(loaded.config.mixed_precision == MixedPrecision::fp16);
  CHECK(loaded.config.main_process_port == 29500);  // null = not set: the default
  CHECK(loaded.sources.at("main_process_port") == Source::default_value);
  CHECK(loaded.sources.at("num_processes") == Source::config_file);
  CHECK(loaded.origins.at("num_processes") == path + ":15");
  CHECK(comm_backend(loaded.config) == "nccl");
}

TEST_CASE("Accelerate's DEEPSPEED config maps onto ZERO, its nested keys onto ours") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("deepspeed.yaml");
  write_file(path,
             "compute_environment: LOCAL_MACHINE\n"
             "deepspeed_config:\n"
             "  gradient_accumulation_steps: 4\n"
             "  offload_optimizer_device: cpu\n"
             "  offload_param_device: none\n"
             "  zero3_init_flag: false\n"
             "  zero_stage: 1\n"
             "distributed_type: DEEPSPEED\n"
             "mixed_precision: bf16\n"
             "num_machines: 1\n"
             "num_processes: 4\n"
             "use_cpu: true\n");
  const auto loaded = load_config_file(path);
  CHECK(loaded.config.distributed_type == DistributedType::ZERO);
  CHECK(loaded.config.zero_stage == 1);
  CHECK(loaded.config.offload_optimizer_device == "cpu");
  CHECK(loaded.config.gradient_accumulation_steps == 4);
  CHECK(loaded.origins.at("zero_stage") == path + ":7");
  CHECK(comm_backend(loaded.config) == "auto");
  CHECK(loaded.notes.size() == 2);

  // ZeRO-3's DeepSpeed key under its DeepSpeed name.
  write_file(path,
             "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"
             "  stage3_param_persistence_threshold: 4096\nnum_processes: 2\nuse_cpu: true\n");
  const auto stage3 = load_config_file(path);
  CHECK(stage3.config.zero_stage == 3);
  CHECK(stage3.config.zero3_param_persistence_threshold == 4096);
  CHECK(stage3.origins.at("zero3_param_persistence_threshold") == path + ":4");

  // ZERO without a stage takes stage 2, as Accelerate's wizard suggests.
  write_file(path, "distributed_type: ZERO\nnum_processes: 2\n");
  CHECK(load_config_file(path).config.zero_stage == 2);
  // An empty file is all defaults.
  write_file(path, "");
  CHECK_NOTHROW(load_config_file(path));
}

TEST_CASE("precedence: detected < config file < environment < command line, with sources") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  write_file(path, "distributed_type: MULTI_CPU\nnum_processes: 4\nmixed_precision: bf16\n");

  auto r = resolve_config(path, {});
  CHECK(r.file == path);
  CHECK(r.config.num_processes == 4);
  CHECK(r.sources.at("num_processes") == Source::config_file);
  CHECK(r.origins.at("num_processes") == path + ":2");
  CHECK(r.sources.size() == schema().size());
  CHECK(r.sources.at("main_process_port") == Source::default_value);

  ::setenv("ACCEL_NUM_PROCESSES", "6", 1);
  ::setenv("ACCEL_MIXED_PRECISION", "FP16", 1);
  r = resolve_config(path, {});
  CHECK(r.config.num_processes == 6);
  CHECK(r.sources.at("num_processes") == Source::environment);
  CHECK(r.origins.at("num_processes") == "environment variable ACCEL_NUM_PROCESSES");
  CHECK(r.config.mixed_precision == MixedPrecision::fp16);

  r = resolve_config(path, {{"num_processes", "8"}});
  CHECK(r.config.num_processes == 8);
  CHECK(r.sources.at("num_processes") == Source::command_line);
  CHECK(r.sources.at("mixed_precision") == Source::environment);
  CHECK(r.sources.at("distributed_type") == Source::config_file);

  // An empty variable counts as unset.
  ::setenv("ACCEL_NUM_PROCESSES", "", 1);
  CHECK(resolve_config(path, {}).config.num_processes == 4);
  ::unsetenv("ACCEL_NUM_PROCESSES");
  ::unsetenv("ACCEL_MIXED_PRECISION");

  // Nothing configured: what this machine suggests, and each guess reported.
  r = resolve_config(std::nullopt, {});
  CHECK_FALSE(r.file.has_value());
  const Config detected = detect_defaults();
  CHECK(r.config.distributed_type == detected.distributed_type);
  CHECK(r.config.num_processes == detected.num_processes);
  CHECK(r.sources.at("distributed_type") == Source::detected);
  CHECK_FALSE(r.guesses.empty());
}

TEST_CASE(
    "values from the environment and the command line are checked like the file's, naming their "
    "origin") {
  TempDir dir;
  CleanEnvironment clean(dir);
  ::setenv("ACCEL_MAIN_PROCESS_PORT", "70000", 1);
  try {
    resolve_config(std::nullopt, {});
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()) ==
          "environment variable ACCEL_MAIN_PROCESS_PORT: key 'main_process_port': 70000 is not a "
          "TCP port (0-65535)");
  }
  ::unsetenv("ACCEL_MAIN_PROCESS_PORT");

  CHECK_THROWS_WITH_AS(
      resolve_config(std::nullopt, {{"num_processes", "0"}}),
      "command line --num_processes: key 'num_processes': 0 is not a process count (1 or more)",
      ConfigError);
  CHECK_THROWS_WITH_AS(resolve_config(std::nullopt, {{"num_gpu", "2"}}),
                       doctest::Contains("command line --num_gpu: unknown key"), ConfigError);

  // Across sources: the rank from the flag, the machine count from the file.
  const std::string path = dir.file("cfg.yaml");
  write_file(path, "distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 2\n");
  const std::string expected =
      "command line --machine_rank: key 'machine_rank': 2 is not below num_machines (2); "
      "num_machines 2 is from " +
      path + ":2";
  CHECK_THROWS_WITH_AS(resolve_config(path, {{"machine_rank", "2"}}), expected.c_str(),
                       ConfigError);
  // Accelerate's spelling from the environment too.
  ::setenv("ACCEL_DISTRIBUTED_TYPE", "deepspeed", 1);
  CHECK(resolve_config(std::nullopt, {}).config.distributed_type == DistributedType::ZERO);
  ::unsetenv("ACCEL_DISTRIBUTED_TYPE");
}

TEST_CASE("where the config file is looked for") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string xdg_file =
      (dir.path / "xdg" / "accelerate-cpp" / "default_config.yaml").string();
  CHECK(default_config_path() == xdg_file);
  ::unsetenv("XDG_CONFIG_HOME");
  CHECK(default_config_path() ==
        (dir.path / ".config" / "accelerate-cpp" / "default_config.yaml").string());
  ::setenv("XDG_CONFIG_HOME", (dir.path / "xdg").c_str(), 1);

  // The default location is read only when it exists.
  CHECK_FALSE(resolve_config(std::nullopt, {}).file.has_value());
  fs::create_directories(fs::path(xdg_file).parent_path());
  write_file(xdg_file, "distributed_type: MULTI_CPU\nnum_processes: 3\n");
  auto r = resolve_config(std::nullopt, {});
  CHECK(r.file == xdg_file);
  CHECK(r.config.num_processes == 3);

  // $ACCEL_CONFIG_FILE beats the default location; --config_file beats both.
  const std::string named = dir.file("named.yaml");
  write_file(named, "distributed_type: MULTI_CPU\nnum_processes: 5\n");
  ::setenv("ACCEL_CONFIG_FILE", named.c_str(), 1);
  CHECK(resolve_config(std::nullopt, {}).config.num_processes == 5);
  const std::string flagged = dir.file("flagged.yaml");
  write_file(flagged, "distributed_type: MULTI_CPU\nnum_processes: 7\n");
  CHECK(resolve_config(flagged, {}).config.num_processes == 7);

  // A file named explicitly must exist.
  CHECK_THROWS_WITH_AS(resolve_config(dir.file("missing.yaml"), {}),
                       doctest::Contains("missing.yaml: cannot read config file"), ConfigError);
  ::setenv("ACCEL_CONFIG_FILE", dir.file("missing.yaml").c_str(), 1);
  CHECK_THROWS_AS(resolve_config(std::nullopt, {}), ConfigError);
}

TEST_CASE("to_environment writes ACCEL_* pairs that resolve back to the same config") {
  TempDir dir;
  CleanEnvironment clean(dir);
  Config c;
  c.distributed_type = DistributedType::ZERO;
  c.use_cpu = true;
  c.num_processes = 4;
  c.num_machines = 2;
  c.machine_rank = 1;
  c.main_process_ip = "10.0.0.1";
  c.zero_stage = 1;
  c.offload_optimizer_device = "cpu";
  c.cpu_communicator = "mpi";
  c.mixed_precision = MixedPrecision::bf16;
  c.gradient_accumulation_steps = 8;
  const auto env = to_environment(c);
  bool saw_stage = false;
  for (const auto& [name, value] : env) {
    if (name == "ACCEL_ZERO_STAGE") saw_stage = (value == "1");
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  CHECK(saw_stage);
  const auto r = resolve_config(std::nullopt, {});
  for (const auto& spec : schema()) {
    INFO(spec.name);
    CHECK(get_value(r.config, spec.name) == get_value(c, spec.name));
    if (is_written(c, spec.name)) CHECK(r.sources.at(spec.name) == Source::environment);
  }
  // Keys that do not apply are left out: no ZeRO stage for DDP, no replica count but for
  // DATA_PARALLEL.
  c.distributed_type = DistributedType::MULTI_CPU;
  c.zero_stage = 0;
  c.offload_optimizer_device = "none";
  for (const auto& [name, value] : to_environment(c)) {
    CHECK(name != "ACCEL_ZERO_STAGE");
    CHECK(name != "ACCEL_DATA_PARALLEL_REPLICAS");
  }
  // DATA_PARALLEL on the CPU: its replica count travels as ACCEL_DATA_PARALLEL_REPLICAS.
  Config dp;
  dp.distributed_type = DistributedType::DATA_PARALLEL;
  dp.use_cpu = true;
  dp.data_parallel_replicas = 3;
  bool saw_replicas = false;
  for (const auto& spec : schema()) ::unsetenv(env_var_for(spec.name).c_str());
  for (const auto& [name, value] : to_environment(dp)) {
    if (name == "ACCEL_DATA_PARALLEL_REPLICAS") saw_replicas = (value == "3");
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  CHECK(saw_replicas);
  const auto back = resolve_config(std::nullopt, {});
  CHECK(back.config.data_parallel_replicas == 3);
  CHECK(back.config.num_processes == 1);
  CHECK(back.sources.at("data_parallel_replicas") == Source::environment);
}

TEST_CASE("accel config show prints every value with where it came from") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  write_file(path, "distributed_type: MULTI_CPU\nnum_processes: 4\ndebug: false\n");
  const auto out =
      run_accel({"config", "show", "--config_file", path}, {{"ACCEL_MIXED_PRECISION", "bf16"}});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "config file: " + path));
  CHECK(contains(out.output, "(" + path + ":2)"));
  CHECK(contains(out.output, "bf16"));
  CHECK(contains(out.output, "(environment variable ACCEL_MIXED_PRECISION)"));
  CHECK(contains(out.output, "main_process_port"));
  CHECK(contains(out.output, "(default)"));
  CHECK(contains(out.output, "note: " + path + ":3: key 'debug'"));
}

TEST_CASE(
    "accel config default writes this machine's defaults, and will not overwrite without --force") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("sub/dir/default.yaml");
  auto out = run_accel({"config", "default", "--config_file", path});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "wrote " + path));
  const auto loaded = load_config_file(path);
  const Config expected = detect_defaults();
  for (const auto& spec : schema()) {
    INFO(spec.name);
    CHECK(get_value(loaded.config, spec.name) == get_value(expected, spec.name));
  }
  out = run_accel({"config", "default", "--config_file", path});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "already exists"));
  out = run_accel({"config", "default", "--config_file", path, "--force"});
  CHECK(out.exit_code == 0);
}

TEST_CASE("detected defaults follow the hardware") {
  const Config cpu = defaults_for({8, 0});
  CHECK(cpu.distributed_type == DistributedType::MULTI_CPU);
  CHECK(cpu.num_processes == 8);
  CHECK(cpu.use_cpu);
  CHECK(comm_backend(cpu) == "auto");
  const Config one_core = defaults_for({1, 0});
  CHECK(one_core.distributed_type == DistributedType::NO);
  const Config one_gpu = defaults_for({8, 1});
  CHECK(one_gpu.distributed_type == DistributedType::NO);
  CHECK_FALSE(one_gpu.use_cpu);
  CHECK(one_gpu.num_processes == 1);
  const Config gpus = defaults_for({64, 4});
  CHECK(gpus.distributed_type == DistributedType::MULTI_GPU);
  CHECK(gpus.num_processes == 4);
  CHECK(comm_backend(gpus) == "nccl");
  const Hardware here = detect_hardware();
  CHECK(here.cpu_cores >= 1);
  CHECK(here.gpus >= 0);
}

TEST_CASE("the detected distributed_type fits the process count and machines asked for") {
  auto build = [](std::map<std::string, std::string> given, Hardware hw) {
    detail::Layer layer;
    for (const auto& [key, value] : given) {
      const std::string where = "command line --" + key;
      layer[key] = {parse_value_or_throw(key, value, where), Source::command_line, where};
    }
    return detail::build_config(layer, hw, true);
  };
  // One GPU and --num_processes 4: CPU processes, not NO (one process) contradicting the 4.
  auto r = build({{"num_processes", "4"}}, {16, 1});
  CHECK(r.config.distributed_type == DistributedType::MULTI_CPU);
  CHECK(r.sources.at("distributed_type") == Source::detected);
  CHECK(r.origins.at("distributed_type") == "detected: 1 GPU, 16 CPU cores; 4 processes asked for");
  CHECK(r.guesses.front() ==
        "distributed_type = MULTI_CPU (detected: 1 GPU, 16 CPU cores; 4 processes asked for)");
  // As many processes as GPUs: one each.
  r = build({{"num_processes", "4"}}, {16, 4});
  CHECK(r.config.distributed_type == DistributedType::MULTI_GPU);
  // Two machines of one GPU each.
  r = build({{"num_machines", "2"}, {"machine_rank", "1"}}, {16, 1});
  CHECK(r.config.distributed_type == DistributedType::MULTI_GPU);
  CHECK(r.config.num_processes == 2);
  // One process asked for: NO.
  r = build({{"num_processes", "1"}}, {16, 4});
  CHECK(r.config.distributed_type == DistributedType::NO);
  // CPU only although GPUs exist: a process per core.
  r = build({{"use_cpu", "true"}}, {6, 2});
  CHECK(r.config.distributed_type == DistributedType::MULTI_CPU);
  CHECK(r.config.num_processes == 6);
  // gpu_ids decides the process count for GPU work.
  r = build({{"distributed_type", "MULTI_GPU"}, {"gpu_ids", "1,3,5"}}, {16, 8});
  CHECK(r.config.num_processes == 3);
  // ZERO on GPUs goes over NCCL, on CPUs over the CPU communicator.
  r = build({{"distributed_type", "ZERO"}}, {16, 2});
  CHECK(comm_backend(r.config) == "nccl");
  CHECK(r.config.zero_stage == 2);
  r = build({{"distributed_type", "ZERO"}, {"use_cpu", "yes"}, {"cpu_communicator", "mpi"}},
            {16, 2});
  CHECK(comm_backend(r.config) == "mpi");
}

TEST_CASE("a saved config reads back the same, quoted for YAML 1.1 readers") {
  TempDir dir;
  Config c;
  c.distributed_type = DistributedType::NO;
  c.mixed_precision = MixedPrecision::no;
  c.gpu_ids = "0";
  const std::string path = dir.file("cfg.yaml");
  save_config(path, c);
  const std::string text = read_file(path);
  CHECK(contains(text, "distributed_type: 'NO'\n"));  // PyYAML would read a bare NO as false
  CHECK(contains(text, "mixed_precision: 'no'\n"));
  CHECK(contains(text, "gpu_ids: '0'\n"));
  CHECK_FALSE(contains(text, "zero_stage"));
  const auto loaded = load_config_file(path);
  for (const auto& spec : schema())
    CHECK(get_value(loaded.config, spec.name) == get_value(c, spec.name));

  // An inconsistent config is not written at all.
  Config bad;
  bad.distributed_type = DistributedType::MULTI_CPU;
  bad.num_processes = 2;
  bad.machine_rank = 3;
  bad.use_cpu = true;
  CHECK_THROWS_WITH_AS(save_config(path, bad),
                       doctest::Contains("key 'machine_rank': 3 is not below num_machines (1)"),
                       ConfigError);
  CHECK(read_file(path) == text);
}

TEST_CASE("an interrupted save leaves the old file intact") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  const std::string old_text = "distributed_type: MULTI_CPU\nnum_processes: 2\n";
  write_file(path, old_text);

  SUBCASE("an exception at the last moment, after the data is on disk") {
    CHECK_THROWS_WITH(
        write_file_atomically(path, "num_processes: 9\n",
                              {.before_rename = [] { throw std::runtime_error("crash"); }}),
        "crash");
    CHECK(read_file(path) == old_text);
    CHECK(files_in(dir.path) == std::vector<std::string>{"cfg.yaml"});  // no temporary left behind
  }
  SUBCASE("a write that fails (file size limit, SIGXFSZ ignored) exits 1 and cleans up") {
    const auto out = run_accel({"config", "default", "--force", "--config_file", path}, {},
                               "trap '' XFSZ; ulimit -f 0");
    INFO(out.output);
    CHECK(out.exit_code == 1);
    CHECK(contains(out.output, "cannot write"));
    CHECK(read_file(path) == old_text);
    CHECK(files_in(dir.path) == std::vector<std::string>{"cfg.yaml"});
  }
  SUBCASE("a process killed in the middle of the write (SIGXFSZ)") {
    const auto out =
        run_accel({"config", "default", "--force", "--config_file", path}, {}, "ulimit -f 0");
    INFO(out.output);
    CHECK(out.signal == SIGXFSZ);
    CHECK(read_file(path) == old_text);
  }
  SUBCASE("a directory that does not exist yet is created") {
    const std::string nested = dir.file("a/b/cfg.yaml");
    write_file_atomically(nested, "num_processes: 1\n");
    CHECK(read_file(nested) == "num_processes: 1\n");
  }
}

TEST_CASE("accel config rejects unknown actions and arguments with exit 2") {
  auto out = run_accel({"config", "frobnicate"});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "unknown action 'frobnicate'"));
  out = run_accel({"config", "show", "--bogus"});
  CHECK(out.exit_code == 2);
  out = run_accel({"config", "--help"});
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "accel config validate"));
}

TEST_CASE("accel launch --help lists every config key as the schema declares it") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const auto out = run_accel({"launch", "--help"});
  REQUIRE(out.exit_code == 0);
  INFO(out.output);
  std::string flat;  // the help with its line wrapping undone
  for (const char c : out.output)
    if (!std::isspace(static_cast<unsigned char>(c)) || (!flat.empty() && flat.back() != ' '))
      flat += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
  for (const auto& spec : schema()) {
    CAPTURE(spec.name);
    CHECK(contains(flat, " --" + spec.name + (spec.kind == ValueKind::boolean ? "[=BOOL] " : " ")));
    CHECK(contains(flat, "(default: " + default_text(spec)));
    for (const auto& alias : spec.aliases) CHECK(contains(flat, "also --" + alias));
  }
  // An alias sets its key, checked by the same rules.
  const auto bad = run_accel({"launch", "--nnodes", "0", "true"});
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "key 'num_machines': 0 is not a machine count"));
  // A fixed default is Config{}'s value, written once: the help follows the initializer.
  CHECK(default_text(*find_key("main_process_port")) == "29500");
  CHECK(contains(out.output, "(default: 29500; also --master_port)"));
  std::size_t start = 0;
  while (start < out.output.size()) {
    const auto end = std::min(out.output.find('\n', start), out.output.size());
    CHECK(end - start <= 100);
    start = end + 1;
  }
}

TEST_CASE("zero_stage has one limit everywhere: the schema's, in help, flags, environment, files") {
  TempDir dir;
  CleanEnvironment clean(dir);
  // What `accel launch --help` advertises is what the schema accepts.
  auto out = run_accel({"launch", "--help"});
  CHECK(out.exit_code == 0);
  INFO(out.output);
  CHECK(contains(out.output, "--zero_stage 1|2|3 "));
  CHECK(contains(out.output, "--zero3_param_persistence_threshold N\n"));
  CHECK(contains(out.output, "--reshard_after_forward[=BOOL]"));
  // A stage the help does not offer is refused before any process starts, naming where it
  // came from (the Accelerator used to find out at run time).
  out = run_accel(
      {"launch", "--use_zero", "--cpu", "--num_processes", "2", "--zero_stage", "4", "true"});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output,
                 "command line --zero_stage: key 'zero_stage': 4 is not a ZeRO stage "
                 "(1-3)"));
  out = run_accel({"launch", "--use_zero", "--cpu", "--num_processes", "2", "true"},
                  {{"ACCEL_ZERO_STAGE", "4"}});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "environment variable ACCEL_ZERO_STAGE: key 'zero_stage': 4 is not"));
  const auto* spec = find_key("zero_stage");
  REQUIRE(spec != nullptr);
  CHECK(spec->min_value == kMinZeroStage);
  CHECK(spec->max_value == kMaxZeroStage);
  CHECK(value_hint("zero_stage") == "1|2|3");
}
