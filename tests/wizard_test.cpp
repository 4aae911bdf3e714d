// `accel config`, the wizard: answers piped line by line and keys typed on a pseudo-terminal
// produce the expected YAML; a wrong answer is explained and asked again; input that ends
// early leaves the old file as it was; the terminal is restored after raw mode, also on Ctrl-C.

#include <doctest/doctest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <fcntl.h>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "config/config.hpp"
#include "config/config_file.hpp"
#include "config/resolve.hpp"
#include "config/wizard.hpp"
#include "foundation/error.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"

using namespace accel;
using namespace accel::config;
namespace fs = std::filesystem;
using accel::test::read_file;
using accel::test::TempDir;
using accel::test::write_file;
using namespace std::chrono_literals;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// No ACCEL_* variable and no real home directory reach the wizard (or its children).
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

// `accel config ARGS...` with its stdin read from `answers_file`.
launch::WorkerExit run_wizard_process(const std::string& answers_file,
                                      const std::vector<std::string>& args) {
  launch::WorkerSpec spec;
  spec.argv = {"sh", "-c", "exec \"$0\" config \"$@\" < \"$ANSWERS\"", test::bin_path("accel")};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = {{"ANSWERS", answers_file}};
  spec.label = "accel";
  launch::WorkerGroupOptions options;
  options.capture = true;
  options.echo = false;
  options.timeout = std::chrono::seconds(60);
  auto result = launch::run_worker_group({spec}, options);
  REQUIRE_FALSE(result.timed_out);
  return result.workers.at(0);
}

std::string lines(const std::vector<std::string>& answers) {
  std::string text;
  for (const auto& a : answers) text += a + "\n";
  return text;
}

// Runs the wizard in this process on `answers` with fixed hardware; returns the config and
// what it printed.
std::pair<Config, std::string> wizard_in_process(const std::string& answers, const Hardware& hw) {
  std::istringstream in(answers);
  std::ostringstream out;
  auto prompter = make_line_prompter(in, out);
  Config c = run_wizard(*prompter, hw);
  return {c, out.str()};
}

// A child process on a pseudo-terminal, and the bounded waits a test drives it with.
class PtyProcess {
 public:
  explicit PtyProcess(const std::vector<std::string>& argv) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::forkpty(&master_, nullptr, nullptr, nullptr);
    if (pid_ < 0) throw std::runtime_error("forkpty failed");
    if (pid_ == 0) {
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    // The terminal's other end, held here to look at its mode (raw or not) from outside.
    slave_ = ::open(::ptsname(master_), O_RDWR | O_NOCTTY);
  }
  ~PtyProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (slave_ >= 0) ::close(slave_);
    ::close(master_);
  }

  // Reads output until `text` appears after what earlier expects consumed; false after
  // `limit` or when the output ends first.
  bool expect(const std::string& text, std::chrono::milliseconds limit = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      const auto found = seen_.find(text, consumed_);
      if (found != std::string::npos) {
        consumed_ = found + text.size();
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{master_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(master_, buf, sizeof buf);
      if (n <= 0) return false;  // EIO: the child closed the terminal
      seen_.append(buf, static_cast<std::size_t>(n));
    }
  }

  void send(const std::string& keys) {
    REQUIRE(::write(master_, keys.data(), keys.size()) == static_cast<ssize_t>(keys.size()));
  }

  bool canonical_mode() const {
    termios t{};
    REQUIRE(::tcgetattr(slave_, &t) == 0);
    return (t.c_lflag & ICANON) != 0 && (t.c_lflag & ECHO) != 0;
  }

  // The exit status, waiting at most `limit` (then SIGKILL).
  int wait(std::chrono::milliseconds limit = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (true) {
      // Keep draining output so the child never blocks writing to a full terminal.
      pollfd p{master_, POLLIN, 0};
      if (::poll(&p, 1, 10) > 0) {
        char buf[4096];
        const ssize_t n = ::read(master_, buf, sizeof buf);
        if (n > 0) seen_.append(buf, static_cast<std::size_t>(n));
      }
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
    }
    reaped_ = true;
    return status;
  }

  const std::string& output() const { return seen_; }

 private:
  int master_ = -1;
  int slave_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string seen_;
  std::size_t consumed_ = 0;
};

}  // namespace

TEST_CASE("empty answers take the defaults shown, which follow the earlier answers") {
  const Hardware hw{8, 0};
  const auto [config, out] = wizard_in_process(std::string(20, '\n'), hw);
  const Config expected = defaults_for(hw);
  for (const auto& spec : schema()) {
    INFO(spec.name);
    CHECK(get_value(config, spec.name) == get_value(expected, spec.name));
  }
  INFO(out);
  CHECK(contains(out, "Number or name [2: MULTI_CPU]: "));
  CHECK(contains(out, "over all machines)? [8]: "));
  // Questions that do not apply to one machine of CPU processes are not asked.
  CHECK_FALSE(contains(out, "rank of this machine"));
  CHECK_FALSE(contains(out, "GPU(s)"));
  CHECK_FALSE(contains(out, "ZeRO optimization stage"));
  CHECK(contains(out, "Which communicator"));

  // On 4 GPUs the same empty answers choose MULTI_GPU with 4 processes and ask for GPU ids.
  const auto [gpu_config, gpu_out] = wizard_in_process(std::string(20, '\n'), Hardware{32, 4});
  CHECK(gpu_config.distributed_type == DistributedType::MULTI_GPU);
  CHECK(gpu_config.num_processes == 4);
  CHECK(contains(gpu_out, "GPU(s)"));
  CHECK_FALSE(contains(gpu_out, "Which communicator"));
}

TEST_CASE(
    "choices by number or by name; ZeRO questions only for ZERO; machine questions only for 2+ "
    "machines") {
  const Hardware hw{8, 2};
  // compute env, type (Accelerate's name), machines, rendezvous (default static), rank, ip,
  // port, use_cpu, stage (by value), offload, processes, gpu ids, precision (by number), steps.
  const auto [c, out] = wizard_in_process(lines({"", "deepspeed", "2", "", "1", "10.0.0.7", "29600",
                                                 "no", "1", "cpu", "4", "0,1", "2", "8"}),
                                          hw);
  INFO(out);
  CHECK(c.distributed_type == DistributedType::ZERO);
  CHECK(c.num_machines == 2);
  CHECK(c.machine_rank == 1);
  CHECK(c.main_process_ip == "10.0.0.7");
  CHECK(c.main_process_port == 29600);
  CHECK_FALSE(c.use_cpu);
  CHECK(c.zero_stage == 1);
  CHECK(c.offload_optimizer_device == "cpu");
  CHECK(c.num_processes == 4);
  CHECK(c.gpu_ids == "0,1");
  CHECK(c.mixed_precision == MixedPrecision::bf16);
  CHECK(c.gradient_accumulation_steps == 8);
  CHECK(contains(out, "rank of this machine (0 .. 1)"));
}

TEST_CASE("DATA_PARALLEL: CPU replicas asked for without GPUs, GPU ids with them") {
  // compute env, type, use_cpu (detected yes), replicas (a bad one, then 3), precision, steps.
  const auto [c, out] =
      wizard_in_process(lines({"", "DATA_PARALLEL", "", "-1", "3", "", ""}), Hardware{8, 0});
  INFO(out);
  CHECK(c.distributed_type == DistributedType::DATA_PARALLEL);
  CHECK(c.use_cpu);
  CHECK(c.num_processes == 1);
  CHECK(c.data_parallel_replicas == 3);
  CHECK(contains(out, "How many model replicas (threads) should DataParallel run"));
  CHECK(contains(out,
                 "-1 is not a replica count (0 = one per CPU core, or more); please answer "
                 "again."));
  CHECK_FALSE(contains(out, "GPU(s)"));
  CHECK_FALSE(contains(out, "over all machines)?"));

  // On 2 GPUs, not on the CPU: the replicas are the GPUs, so gpu_ids is asked instead.
  const auto [g, gpu_out] =
      wizard_in_process(lines({"", "DATA_PARALLEL", "no", "0,1", "", ""}), Hardware{8, 2});
  INFO(gpu_out);
  CHECK_FALSE(g.use_cpu);
  CHECK(g.gpu_ids == "0,1");
  CHECK(g.data_parallel_replicas == 0);
  CHECK(contains(gpu_out, "GPU(s)"));
  CHECK_FALSE(contains(gpu_out, "model replicas (threads)"));
}

TEST_CASE("a wrong answer is explained and asked again") {
  const Hardware hw{8, 0};
  const auto [c, out] = wizard_in_process(lines({"", "HOROVOD", "MULTI_CPU", "two", "2", "", "5",
                                                 "1", "", "", "0", "3", "6", "", "gloo", "", ""}),
                                          hw);
  INFO(out);
  CHECK(contains(out,
                 "'HOROVOD' is not a choice: type 0-4 or one of NO, DATA_PARALLEL, MULTI_CPU, "
                 "MULTI_GPU, ZERO; please answer again."));
  CHECK(contains(out, "expects a whole number, got 'two'; please answer again."));
  CHECK(contains(out, "5 is not below num_machines (2); please answer again."));
  CHECK(contains(out, "0 is not a process count (1 or more); please answer again."));
  CHECK(contains(out,
                 "3 processes do not divide evenly over num_machines (2); please answer again."));
  CHECK(c.num_machines == 2);
  CHECK(c.machine_rank == 1);
  CHECK(c.num_processes == 6);
  CHECK(c.cpu_communicator == "gloo");
}

TEST_CASE("input that ends early is an error") {
  CHECK_THROWS_WITH_AS(wizard_in_process(lines({"", "MULTI_CPU"}), Hardware{8, 0}),
                       doctest::Contains("the input ended before 'num_machines' was answered"),
                       ConfigError);
}

TEST_CASE("accel config with piped answers writes the expected YAML") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("out/cfg.yaml");
  const std::string answers = dir.file("answers.txt");
  write_file(answers, lines({"", "MULTI_CPU", "2", "static", "1", "10.1.2.3", "29600", "4", "2",
                             "mpi", "", ""}));
  const auto out = run_wizard_process(answers, {"--config_file", path});
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  CHECK(contains(out.output, "accel config: wrote " + path));

  const auto loaded = load_config_file(path);
  const Config& c = loaded.config;
  CHECK(c.distributed_type == DistributedType::MULTI_CPU);
  CHECK(c.num_machines == 2);
  CHECK(c.machine_rank == 1);
  CHECK(c.main_process_ip == "10.1.2.3");
  CHECK(c.main_process_port == 29600);
  CHECK(c.num_processes == 4);
  CHECK(c.mixed_precision == MixedPrecision::bf16);
  CHECK(c.cpu_communicator == "mpi");
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.use_cpu);
  for (const auto& spec : schema())
    if (is_written(c, spec.name)) CHECK(loaded.sources.at(spec.name) == Source::config_file);
}

TEST_CASE("accel config: a wrong answer is asked again, with the reason") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  const std::string answers = dir.file("answers.txt");

  write_file(answers, lines({"", "MULTI_GPU", "", "0", "2", "0,1,1", "1", "0,1", "fp16", ""}));
  auto out = run_wizard_process(answers, {"--config_file", path});
  INFO(out.output);
  REQUIRE(out.exit_code == 0);
  CHECK(contains(out.output, "0 is not a process count (1 or more); please answer again."));
  CHECK(contains(out.output, "GPU id 1 is listed twice; please answer again."));
  CHECK(contains(
      out.output,
      "lists 1 GPU(s) but 2 processes run on each machine, one GPU each; please answer again."));
  const Config c = load_config_file(path).config;
  CHECK(c.distributed_type == DistributedType::MULTI_GPU);
  CHECK(c.num_processes == 2);
  CHECK(c.gpu_ids == "0,1");
  CHECK(c.mixed_precision == MixedPrecision::fp16);
}

TEST_CASE("accel config: input ending before the last question exits 2 and keeps the old file") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  const std::string old_text = "distributed_type: MULTI_CPU\nnum_processes: 2\n";
  write_file(path, old_text);
  const std::string answers = dir.file("answers.txt");
  write_file(answers, lines({"", "MULTI_CPU", "1"}));
  const auto out = run_wizard_process(answers, {"--config_file", path});
  INFO(out.output);
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output,
                 "the input ended before 'num_processes' was answered; no config was written"));
  CHECK(read_file(path) == old_text);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path))
    names.push_back(e.path().filename().string());
  CHECK(names.size() == 2);  // cfg.yaml and answers.txt: no temporary file
}

TEST_CASE("on a pseudo-terminal: arrow keys and Enter pick choices, lines answer the rest") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  PtyProcess p({test::bin_path("accel"), "config", "--config_file", path});

  REQUIRE(p.expect("In which compute environment are you running?"));
  REQUIRE(p.expect("0) This machine"));
  p.send("\r");
  REQUIRE(p.expect("Which type of distributed training do you want?"));
  REQUIRE(p.expect("4) ZERO"));
  CHECK_FALSE(p.canonical_mode());  // raw while the menu is up
  // "0" jumps to NO whatever this machine's default is, then two steps down to MULTI_CPU.
  p.send("0");
  p.send("\x1b[B\x1b[B");
  p.send("\r");
  REQUIRE(p.expect("want?  MULTI_CPU"));  // the menu collapsed into the answer
  REQUIRE(p.expect("How many different machines"));
  CHECK(p.canonical_mode());  // restored for line input
  p.send("1\r");
  REQUIRE(p.expect("How many processes"));
  p.send("2\r");
  REQUIRE(p.expect("Do you wish to use mixed precision?"));
  REQUIRE(p.expect("2) bf16"));
  p.send("\x1b[B\x1bOB\r");  // CSI and SS3 spellings of the down arrow
  REQUIRE(p.expect("Which communicator should the CPU processes use?"));
  REQUIRE(p.expect("2) mpi"));
  p.send("\x1b[A\r");  // up from the first option (auto, the default) wraps to the last
  REQUIRE(p.expect("How many gradient accumulation steps?"));
  p.send("3\r");
  REQUIRE(p.expect("How many pipeline stages"));
  p.send("\r");
  REQUIRE(p.expect("accel config: wrote " + path));
  const int status = p.wait();
  INFO(p.output());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  const Config c = load_config_file(path).config;
  CHECK(c.distributed_type == DistributedType::MULTI_CPU);
  CHECK(c.num_machines == 1);
  CHECK(c.num_processes == 2);
  CHECK(c.mixed_precision == MixedPrecision::bf16);
  CHECK(c.cpu_communicator == "mpi");
  CHECK(c.gradient_accumulation_steps == 3);
}

TEST_CASE("on a pseudo-terminal: Ctrl-C in a menu restores the terminal and writes nothing") {
  TempDir dir;
  CleanEnvironment clean(dir);
  const std::string path = dir.file("cfg.yaml");
  const std::string old_text = "distributed_type: MULTI_CPU\nnum_processes: 2\n";
  write_file(path, old_text);
  PtyProcess p({test::bin_path("accel"), "config", "--config_file", path});
  REQUIRE(p.expect("0) This machine"));
  p.send("\r");
  REQUIRE(p.expect("4) ZERO"));
  CHECK_FALSE(p.canonical_mode());
  p.send("\x03");
  const int status = p.wait();
  INFO(p.output());
  CHECK(WIFSIGNALED(status));
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGINT);
  CHECK(p.canonical_mode());
  CHECK(read_file(path) == old_text);
}

TEST_CASE("the ZeRO stage menu offers only the stages the schema accepts") {
  // compute env, type, machines, use_cpu, stage 4 (refused), then stage 3, offload, stage 3's
  // persistence threshold, resharding and units, processes, communicator... the rest by
  // default.
  const auto [c, out] = wizard_in_process(
      lines({"", "ZERO", "1", "yes", "4", "3", "", "", "no", "NO_WRAP", "2", "", "", ""}),
      Hardware{8, 0});
  INFO(out);
  CHECK(c.zero_stage == 3);
  CHECK(c.zero3_param_persistence_threshold == 100000);
  CHECK_FALSE(c.reshard_after_forward);
  CHECK(c.auto_wrap_policy == config::AutoWrapPolicy::NO_WRAP);
  CHECK(c.num_processes == 2);
  CHECK(contains(out, "stage 3: shard optimizer state, gradients and parameters"));
  CHECK(contains(out, "'4' is not a choice: type 1-3"));
}

TEST_CASE("MULTI_CPU asks for pipeline stages, and their settings only when there are several") {
  const Hardware hw{8, 0};
  // compute env, type, machines, processes, precision, communicator, steps; stages 3 (refused:
  // 4 processes), 2; micro-batches, schedule, chunks (asked for INTERLEAVED_1F1B), split.
  const auto [c, out] = wizard_in_process(lines({"", "MULTI_CPU", "1", "4", "", "", "", "3", "2",
                                                 "8", "INTERLEAVED_1F1B", "2", "uniform"}),
                                          hw);
  INFO(out);
  CHECK(contains(out,
                 "num_processes 4 is not a multiple of pipeline_parallel_size 3 (each replica of "
                 "the pipeline runs 3 processes); please answer again."));
  CHECK(c.pipeline_parallel_size == 2);
  CHECK(c.num_microbatches == 8);
  CHECK(c.pipeline_schedule == "INTERLEAVED_1F1B");
  CHECK(c.pipeline_chunks == 2);
  CHECK(c.partition_method == "uniform");
  // One stage: none of the pipeline's other questions.
  const auto [one, one_out] =
      wizard_in_process(lines({"", "MULTI_CPU", "1", "4", "", "", "", "1"}), hw);
  INFO(one_out);
  CHECK(one.pipeline_parallel_size == 1);
  CHECK_FALSE(contains(one_out, "micro-batches"));
}

TEST_CASE("an elastic job: rdzv_backend c10d asks for the fewest machines, not a machine rank") {
  const Hardware hw{8, 0};
  // compute env, type, machines (the most), rendezvous, fewest machines, ip, port, processes,
  // precision, communicator, steps.
  const auto [c, out] = wizard_in_process(
      lines({"", "MULTI_CPU", "3", "c10d", "2", "10.1.2.3", "29600", "6", "", "gloo", "", ""}), hw);
  INFO(out);
  CHECK(c.num_machines == 3);
  CHECK(c.rdzv_backend == "c10d");
  CHECK(c.min_machines == 2);
  CHECK(c.machine_rank == 0);
  CHECK(c.num_processes == 6);
  CHECK(contains(out, "What rendezvous backend will you use?"));
  CHECK(contains(out, "the fewest machines the job may go on with"));
  CHECK_FALSE(contains(out, "What is the rank of this machine"));
  CHECK(is_elastic(c));
}
