// `accel launch` and the worker group under it, with real processes: the environment each
// worker gets, rank-prefixed output and log files, a failing worker stopping the rest,
// restarts, signals to the launcher leaving nothing behind, and the flags.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "config/config.hpp"
#include "foundation/host_cores.hpp"
#include "foundation/store/tcp_store.hpp"
#include "launch/worker_env.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"

using namespace accel;
using namespace accel::test;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// `accel ARGS...` in a clean environment (test::run_accel); its one process's exit and output.
launch::WorkerExit accel_command(const std::vector<std::string>& args,
                                 const std::vector<std::pair<std::string, std::string>>& env = {}) {
  auto result = test::run_accel(args, env);
  REQUIRE_FALSE(result.timed_out);
  return result.workers.at(0);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Alive = exists and is not a zombie waiting to be reaped.
bool alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto close = text.rfind(')');
  return close == std::string::npos || text.size() < close + 3 || text[close + 2] != 'Z';
}

// Waits up to `timeout` for `pid` (a child) to exit, then kills it; true when it exited by
// itself, with its wait status in *status.
bool wait_exit(pid_t pid, std::chrono::seconds timeout, int* status) {
  pid_t done = 0;
  const auto deadline = Clock::now() + timeout;
  while ((done = waitpid(pid, status, WNOHANG)) == 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (done == pid) return true;
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return false;
}

}  // namespace

TEST_CASE("every worker gets its own rank and the shared job environment") {
  const auto out = accel_command(
      {"launch", "--num_processes", "4", "--main_process_port", "0", "--multi_cpu", "sh", "-c",
       "echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD=$WORLD_SIZE "
       "LOCAL_WORLD=$LOCAL_WORLD_SIZE NODE=$NODE_RANK STORE=$ACCEL_LAUNCHER_STORE "
       "BACKEND=$ACCEL_COMM_BACKEND TYPE=$ACCEL_DISTRIBUTED_TYPE "
       "RESTART=$ACCEL_RESTART_COUNT/$TORCHELASTIC_RESTART_COUNT "
       "ADDR=$MASTER_ADDR TOKEN=${ACCEL_STORE_TOKEN:+set}"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  for (int r = 0; r < 4; ++r) {
    const std::string line = "[rank " + std::to_string(r) + "] RANK=" + std::to_string(r) +
                             " LOCAL_RANK=" + std::to_string(r) +
                             " WORLD=4 LOCAL_WORLD=4 NODE=0 STORE=1 BACKEND=auto TYPE=MULTI_CPU "
                             "RESTART=0/0 ADDR=127.0.0.1 TOKEN=set";
    CHECK(contains(out.output, line));
  }
  // The settings are printed once, with where each came from.
  CHECK(contains(out.output, "num_processes"));
  CHECK(contains(out.output, "command line --num_processes"));
}

TEST_CASE("torchrun's rendezvous flags: --standalone, --rdzv_endpoint, --rdzv_id, --rdzv_conf") {
  // --standalone: one machine, its store on a free local port; --rdzv_id reaches the workers
  // as TORCHELASTIC_RUN_ID, beside torchrun's other names.
  const auto standalone = accel_command(
      {"launch", "--standalone", "--nproc_per_node", "2", "--multi_cpu", "--rdzv_id", "job7",
       "--rdzv_backend", "static", "--rdzv_conf", "join_timeout=30,last_call_timeout=5", "sh", "-c",
       "echo RUN=$TORCHELASTIC_RUN_ID MAX=$TORCHELASTIC_MAX_RESTARTS GROUP=$GROUP_RANK "
       "ADDR=$MASTER_ADDR WORLD=$WORLD_SIZE PORT=$MASTER_PORT"});
  INFO(standalone.output);
  CHECK(standalone.exit_code == 0);
  for (int r = 0; r < 2; ++r)
    CHECK(contains(standalone.output, "[rank " + std::to_string(r) +
                                          "] RUN=job7 MAX=0 GROUP=0 ADDR=127.0.0.1 WORLD=2 PORT="));
  CHECK_FALSE(contains(standalone.output, "PORT=29500\n"));  // a free port, not the default
  // --rdzv_endpoint HOST:PORT is main_process_ip and main_process_port; --nnodes 1:1 is 1.
  const auto endpoint = accel_command({"launch", "--nnodes", "1:1", "--rdzv_endpoint",
                                       "127.0.0.1:0", "--num_processes", "1", "--multi_cpu", "sh",
                                       "-c", "echo ADDR=$MASTER_ADDR RUN=$TORCHELASTIC_RUN_ID"});
  INFO(endpoint.output);
  CHECK(endpoint.exit_code == 0);
  CHECK(contains(endpoint.output, "[rank 0] ADDR=127.0.0.1 RUN=none"));
  CHECK(contains(endpoint.output, "command line --main_process_ip"));
}

TEST_CASE(
    "worker environment defaults are printed, yield to the user's values and can be switched off") {
  const std::vector<std::string> show = {
      "sh", "-c",
      "echo OMP=${OMP_NUM_THREADS:-unset} GT=${GLIBC_TUNABLES:-unset} "
      "CVD=${CUDA_VISIBLE_DEVICES:-unset}"};
  auto with = [&](std::vector<std::string> flags) {
    std::vector<std::string> args = {"launch", "--num_processes", "2", "--main_process_port",
                                     "0",      "--multi_cpu"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), show.begin(), show.end());
    return args;
  };
  const int cores = usable_cores();  // what the launcher divides
  const std::string omp = std::to_string(std::max(1, cores / 2));

  auto out = accel_command(with({}));
  INFO(out.output);
  CHECK(contains(out.output, "[rank 1] OMP=" + omp + " GT=" +
                                 std::string(launch::kWorkerMallocTunables) + " CVD=unset"));
  CHECK(contains(out.output, "OMP_NUM_THREADS=" + omp + "  ("));  // the printed default
  CHECK(contains(out.output, "--no_malloc_hugetlb"));             // ...and how to stop it

  out = accel_command(with({"--no_default_env", "--gpu_ids", "1"}));
  CHECK(contains(out.output, "[rank 0] OMP=unset GT=unset CVD=1"));

  out = accel_command(with({"--num_cpu_threads_per_process=3", "--no_malloc_hugetlb"}));
  CHECK(contains(out.output, "[rank 0] OMP=3 GT=unset"));

  out = accel_command(with({}),
                      {{"OMP_NUM_THREADS", "7"}, {"GLIBC_TUNABLES", "glibc.malloc.check=0"}});
  CHECK(contains(out.output, "[rank 0] OMP=7 GT=glibc.malloc.check=0"));
}

TEST_CASE("flags take --flag=value and everything after the program is the program's") {
  const auto out =
      accel_command({"launch", "--num_processes=2", "--main-process-port=0", "-q", "--multi_cpu",
                     "sh", "-c", "echo args: \"$@\"", "sh", "--num_processes", "9", "-q"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "[rank 1] args: --num_processes 9 -q"));
  CHECK_FALSE(contains(out.output, "settings"));  // -q
}

TEST_CASE("a failing worker stops the others and its exit code and stderr are reported") {
  const auto started = Clock::now();
  const auto out = accel_command(
      {"launch", "--num_processes", "4", "--main_process_port", "0", "--multi_cpu", "sh", "-c",
       "if [ \"$RANK\" = 1 ]; then echo 'disk on fire' >&2; exit 3; fi; exec sleep 600"});
  const auto took = Clock::now() - started;
  INFO(out.output);
  CHECK(out.exit_code == 3);
  CHECK(contains(out.output, "rank 1 exited with code 3"));
  CHECK(contains(out.output, "disk on fire"));
  // The sleepers were stopped rather than waited for (they would take 600 s).
  CHECK(took < std::chrono::seconds(60));
}

TEST_CASE("a worker killed by a signal is reported with the signal") {
  const auto out =
      accel_command({"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu",
                     "sh", "-c", "if [ \"$RANK\" = 0 ]; then kill -SEGV $$; fi; sleep 600"});
  INFO(out.output);
  CHECK(out.exit_code == 128 + 11);
  CHECK(contains(out.output, "rank 0 was killed by signal 11"));
}

TEST_CASE("a worker that fails once is restarted under --max_restarts and the job succeeds") {
  TempDir dir;
  const std::string marker = dir / "failed_once";
  const auto out =
      accel_command({"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu",
                     "--max_restarts", "1", "--log_dir", dir / "logs", "sh", "-c",
                     "if [ \"$RANK\" = 1 ] && [ ! -e " + marker + " ]; then touch " + marker +
                         "; exit 5; fi; echo ok restart=$ACCEL_RESTART_COUNT"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "rank 1 exited with code 5"));
  CHECK(contains(out.output, "restarting every worker (restart 1 of 1)"));
  CHECK(contains(out.output, "[rank 0] ok restart=1"));
  CHECK(contains(out.output, "[rank 1] ok restart=1"));
  // Each rank's log holds both attempts, the restart marked.
  // (Rank 0 may or may not have printed in the first attempt before it was stopped.)
  const std::string log = read_file(dir / "logs/rank_0.log");
  CHECK(log.ends_with("=== accel launch: restart 1 of 1 ===\nok restart=1\n"));
}

TEST_CASE("a restarted job rendezvouses afresh: stale keys of the failed attempt do not matter") {
  // The first attempt completes a whole Gloo rendezvous (every rank's address is in the
  // store) before rank 1 fails; the second attempt must not read those addresses of dead
  // processes, or it would try to connect to them.
  const auto out = accel_command(
      {"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu",
       "--cpu_communicator", "gloo", "--max_restarts", "1", "--grace_period", "1", "sh", "-c",
       // In the second attempt rank 0 comes late, so rank 1 finds only the first
       // attempt's keys at first.
       "if [ \"$ACCEL_RESTART_COUNT\" = 1 ] && [ \"$RANK\" = 0 ]; then sleep 1; fi; " +
           bin_path("allreduce_demo") +
           " || exit $?; echo attempt $ACCEL_RESTART_COUNT done; "
           "if [ \"$ACCEL_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 7; fi"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "rank 1 exited with code 7"));
  CHECK(contains(out.output, "[rank 0] attempt 1 done"));
  CHECK(contains(out.output, "[rank 1] attempt 1 done"));
}

TEST_CASE("when the restarts are spent the launcher exits with the failure") {
  const auto out = accel_command({"launch", "--num_processes", "2", "--main_process_port", "0",
                                  "--multi_cpu", "--max_restarts", "1", "sh", "-c",
                                  "if [ \"$RANK\" = 0 ]; then exit 4; fi; exec sleep 600"});
  INFO(out.output);
  CHECK(out.exit_code == 4);
  CHECK(contains(out.output, "restart 1 of 1"));
  CHECK(contains(out.output, "no restarts left"));
}

TEST_CASE("--log_dir writes one file per rank; --tee picks what reaches the console") {
  TempDir dir;
  const auto out = accel_command({"launch", "--num_processes", "2", "--main_process_port", "0",
                                  "--multi_cpu", "--log_dir", dir / "logs", "--tee", "2", "sh",
                                  "-c", "echo out of $RANK; echo err of $RANK >&2"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  for (int r = 0; r < 2; ++r) {
    const std::string log = read_file(dir / ("logs/rank_" + std::to_string(r) + ".log"));
    INFO(log);
    CHECK(contains(log, "out of " + std::to_string(r) + "\n"));
    CHECK(contains(log, "err of " + std::to_string(r) + "\n"));
    CHECK_FALSE(contains(log, "[rank"));  // the file is the rank's own output, unprefixed
    // --tee 2: stderr also on the console, stdout only in the file.
    CHECK(contains(out.output, "[rank " + std::to_string(r) + "] err of " + std::to_string(r)));
    CHECK_FALSE(contains(out.output, "out of " + std::to_string(r)));
  }
}

TEST_CASE("a busy rendezvous port is a clear error naming host and port") {
  TcpStoreServer squatter("127.0.0.1", 0);
  const std::string port = std::to_string(squatter.port());
  const auto out = accel_command(
      {"launch", "--num_processes", "2", "--main_process_port", port, "--multi_cpu", "true"});
  INFO(out.output);
  CHECK(out.exit_code == 1);
  CHECK(contains(out.output, "127.0.0.1:" + port));
  CHECK(contains(out.output, "--main_process_port"));
}

TEST_CASE("bad launcher flags exit 2 naming the flag") {
  auto out = accel_command({"launch", "--num_processes", "two", "true"});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "--num_processes"));
  CHECK(contains(out.output, "'two'"));
  out = accel_command({"launch", "--no_such_flag", "1", "true"});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "unknown option --no_such_flag"));
  out = accel_command({"launch", "--max_restart", "1", "true"});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "did you mean --max_restarts?"));
  out = accel_command({"launch", "--num_processes", "2"});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "no program"));
  out = accel_command({"launch", "--num_processes", "2", "no_such_program_for_accel_test"});
  CHECK(out.exit_code == 2);
  CHECK(contains(out.output, "cannot run 'no_such_program_for_accel_test': not found in PATH"));
}

TEST_CASE("SIGTERM to the launcher ends every worker and everything they started") {
  TempDir dir;
  constexpr int kWorkers = 3;
  // Each worker leaves three processes: a child in its process group, a child that left it
  // (setsid), and a daemon whose parent exits at once (so it is reparented away from the
  // worker). Each writes its pid to a file; then the worker waits.
  const std::string script = "d=" + dir.path.string() +
                             "; echo $$ > $d/w_$RANK; "
                             "sleep 600 & echo $! > $d/g_$RANK; "
                             "setsid sleep 600 & echo $! > $d/s_$RANK; "
                             "(setsid sh -c \"echo \\$\\$ > $d/d_$RANK; exec sleep 600\" &); "
                             "wait";
  const std::string log = dir / "launcher.out";
  const pid_t launcher = fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const std::string accel = bin_path("accel");
    execl(accel.c_str(), accel.c_str(), "launch", "--num_processes",
          std::to_string(kWorkers).c_str(), "--main_process_port", "0", "--multi_cpu",
          "--grace_period", "2", "sh", "-c", script.c_str(), nullptr);
    _exit(127);
  }
  auto pid_files = [&] {
    std::vector<pid_t> pids;
    for (const char* kind : {"w_", "g_", "s_", "d_"})
      for (int r = 0; r < kWorkers; ++r) {
        std::ifstream in(dir / (kind + std::to_string(r)));
        pid_t pid = 0;
        if (in >> pid) pids.push_back(pid);
      }
    return pids;
  };
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (pid_files().size() < 4 * kWorkers && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::vector<pid_t> pids = pid_files();
  INFO(read_file(log));
  REQUIRE(pids.size() == 4 * kWorkers);
  for (pid_t pid : pids) CHECK(alive(pid));

  kill(launcher, SIGTERM);
  int status = 0;
  const bool exited = wait_exit(launcher, std::chrono::seconds(30), &status);
  INFO(read_file(log));
  REQUIRE(exited);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  int left = 0;
  for (pid_t pid : pids)
    if (alive(pid)) {
      ++left;
      kill(pid, SIGKILL);  // don't leave them to the next test either
    }
  CHECK(left == 0);
  CHECK(contains(read_file(log), "interrupted by SIGTERM"));
}

TEST_CASE("children a successful worker left running are ended with the job") {
  TempDir dir;
  const auto out = accel_command(
      {"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu", "sh", "-c",
       "setsid sleep 600 & echo $! > " + dir.path.string() + "/left_$RANK"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  for (int r = 0; r < 2; ++r) {
    pid_t pid = 0;
    std::ifstream(dir / ("left_" + std::to_string(r))) >> pid;
    REQUIRE(pid > 0);
    CHECK_FALSE(alive(pid));
  }
}

TEST_CASE("the 2-process all-reduce demo runs under accel launch, over shared memory by default") {
  const auto out = accel_command({"launch", "--num_processes", "2", "--main_process_port", "0",
                                  "--multi_cpu", bin_path("allreduce_demo")});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(
      out.output,
      "[rank 0] rank 0 of 2 (shm): all_reduce of 1048576 floats: 3 (expected 3), 0 wrong"));
  CHECK(contains(out.output, "[rank 1] rank 1 of 2 (shm)"));
  // A setting forces Gloo.
  const auto gloo =
      accel_command({"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu",
                     "--cpu_communicator", "gloo", bin_path("allreduce_demo")});
  INFO(gloo.output);
  CHECK(contains(gloo.output, "[rank 1] rank 1 of 2 (gloo)"));
}

TEST_CASE("accel test passes its self-check (auto: shared memory on one machine)") {
  const auto out =
      accel_command({"test", "--num_processes", "3", "--main_process_port", "0", "--multi_cpu"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  for (const char* check : {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                            "random seed agreement", "data sharding"})
    CHECK(contains(out.output, std::string("[rank 0] PASS  ") + check));
  CHECK(contains(out.output, "all checks passed"));
}

TEST_CASE("accel env names the versions and the config in effect") {
  const auto out = accel_command({"env", "--config_file", "/nonexistent/accel.yaml"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "accelerate-cpp version"));
  CHECK(contains(out.output, "Compiler"));
  CHECK(contains(out.output, "CPU cores"));
  CHECK(contains(out.output, "Config in effect"));
  CHECK(
      contains(out.output, "/nonexistent/accel.yaml"));  // the broken config is reported, not fatal
}

TEST_CASE(
    "a rank that exits 0 before joining ends the job naming it; ranks that never join succeed") {
  // ACCEL_COMM_TIMEOUT bounds the wait should the launcher not notice (it would say timeout).
  const std::vector<std::pair<std::string, std::string>> env = {{"ACCEL_COMM_TIMEOUT", "30"}};
  const std::string demo = bin_path("allreduce_demo");
  // Rank 1 leaves at once; rank 0 joins only later (the rule is judged again as ranks join).
  auto out =
      accel_command({"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu",
                     "sh", "-c", "[ $RANK = 1 ] && exit 0; sleep 1; exec " + demo},
                    env);
  INFO(out.output);
  CHECK(out.exit_code == 1);
  CHECK(contains(out.output,
                 "stopped: rank 1 exited with code 0 before joining the process group while "
                 "other ranks joined it"));
  CHECK_FALSE(contains(out.output, "timed out"));

  // A rank whose program asks for another communicator fails at once, naming both.
  out = accel_command(
      {"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu", "sh", "-c",
       "[ $RANK = 1 ] && sleep 1 && export ACCEL_COMM_BACKEND=gloo; exec " + demo},
      env);
  INFO(out.output);
  CHECK(out.exit_code == 1);
  CHECK(contains(out.output,
                 "rank 1 asks for the 'gloo' communicator, but rank 0 joined the "
                 "process group with 'auto'"));

  // Ranks ending at different times after leaving their process group, and ranks that never
  // join one, are a job that succeeded.
  out = accel_command({"launch", "--num_processes", "3", "--main_process_port", "0", "--multi_cpu",
                       "sh", "-c", demo + " && sleep $RANK"},
                      env);
  INFO(out.output);
  CHECK(out.exit_code == 0);
  out = accel_command({"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu",
                       "sh", "-c", "[ $RANK = 1 ] && exit 0; sleep 1; echo hi"},
                      env);
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "[rank 0] hi"));
}

TEST_CASE(
    "a rank that stops answering (SIGSTOP) is named as the root cause, not the rank that timed "
    "out") {
  TempDir dir;
  const std::string log = dir / "launcher.out";
  const std::string script = "echo $$ > " + dir.path.string() + "/pid_$RANK; exec " +
                             bin_path("raw_mlp") +
                             " --epochs 100000 --train_samples 256 --test_samples 32";
  const pid_t launcher = fork();
  REQUIRE(launcher >= 0);
  if (launcher == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("ACCEL_COMM_TIMEOUT", "3", 1);
    unsetenv("ACCEL_COMM_BACKEND");
    const std::string accel = bin_path("accel");
    execl(accel.c_str(), accel.c_str(), "launch", "-q", "--num_processes", "3",
          "--main_process_port", "0", "--multi_cpu", "--grace_period", "1", "sh", "-c",
          script.c_str(), nullptr);
    _exit(127);
  }
  // Rank 1 stops once training runs (rank 0 has finished an epoch, so all three met).
  pid_t rank1 = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline &&
         (!contains(read_file(log), "epoch 2/") || !(std::ifstream(dir / "pid_1") >> rank1)))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(rank1 > 0);
  kill(rank1, SIGSTOP);
  int status = 0;
  const bool exited = wait_exit(launcher, std::chrono::seconds(60), &status);
  kill(rank1, SIGKILL);  // whatever happened, it must not stay stopped
  const std::string output = read_file(log);
  INFO(output);
  REQUIRE(exited);
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(contains(output, "accel launch: rank 1 stopped answering (rank "));
  CHECK_FALSE(alive(rank1));
}
