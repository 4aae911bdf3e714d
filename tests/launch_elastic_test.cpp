// Elastic jobs (`accel launch --nnodes MIN:MAX --rdzv_backend c10d`) on three simulated
// machines: network namespaces, each joined to a bridge in a fourth "switch" namespace by a
// veth pair, with link-local addresses 169.254.78.1-3 that exist only inside them. Each
// machine runs its own `accel launch`; machine 0's address is the rendezvous endpoint, so its
// agent hosts the store. Where namespaces cannot be made (not root, no `ip`), the tests say
// SKIPPED and why.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "tests/support/files.hpp"
#include "tests/support/netns.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/shm_segments.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;
namespace fs = std::filesystem;

namespace {

constexpr int kMachines = 3;
constexpr const char* kEndpoint = "169.254.78.1:29544";
constexpr const char* kStoreHost = "169.254.78.10";  // the switch's own address

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool run(const std::string& command) { return run_quietly(command); }

std::string output_of(const std::string& command) {
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  return out;
}

// The machines and their switch, for the life of one test case (names carry our pid; the
// destructor removes them, and with them every veth end).
class Machines {
 public:
  Machines() {
    ip_ = find_ip();
    why_not_ = netns_unavailable(ip_);
    if (!why_not_.empty()) return;
    remove_stale_namespaces(ip_, "accel_e");
    const std::string tag = std::to_string(getpid());
    switch_ = "accel_e" + tag + "_sw";
    // The switch has an address too (kStoreHost): a machine of its own for an external store.
    std::vector<std::string> steps = {
        ip_ + " netns add " + switch_, ip_ + " -n " + switch_ + " link add br0 type bridge",
        ip_ + " -n " + switch_ + " addr add " + kStoreHost + "/24 dev br0",
        ip_ + " -n " + switch_ + " link set br0 up"};
    for (int k = 0; k < kMachines; ++k) {
      ns_.push_back("accel_e" + tag + "_" + std::to_string(k));
      const std::string inside = "ae" + tag + std::to_string(k);  // <= 15 chars
      port_.push_back("be" + tag + std::to_string(k));
      const std::string address = "169.254.78." + std::to_string(k + 1) + "/24";
      steps.insert(steps.end(), {ip_ + " netns add " + ns_[k],
                                 ip_ + " link add " + inside + " type veth peer name " + port_[k],
                                 ip_ + " link set " + inside + " netns " + ns_[k],
                                 ip_ + " link set " + port_[k] + " netns " + switch_,
                                 ip_ + " -n " + switch_ + " link set " + port_[k] + " master br0",
                                 ip_ + " -n " + switch_ + " link set " + port_[k] + " up",
                                 ip_ + " -n " + ns_[k] + " addr add " + address + " dev " + inside,
                                 ip_ + " -n " + ns_[k] + " link set " + inside + " up",
                                 ip_ + " -n " + ns_[k] + " link set lo up"});
    }
    for (const auto& step : steps)
      if (!run(step)) {
        why_not_ = "could not set up network namespaces (`" + step + "` failed; no CAP_NET_ADMIN?)";
        return;
      }
  }
  ~Machines() {
    for (const auto& ns : ns_) run(ip_ + " netns del " + ns);
    if (!switch_.empty()) run(ip_ + " netns del " + switch_);
  }
  Machines(const Machines&) = delete;
  Machines& operator=(const Machines&) = delete;

  bool ready() const { return why_not_.empty(); }
  const std::string& why_not() const { return why_not_; }

  // Every process of machine k, killed at once: the machine dies.
  bool kill_machine(int k) const {
    return run(ip_ + " netns pids " + ns_[std::size_t(k)] + " | xargs -r kill -9");
  }
  // Pulls machine k's cable: its switch port goes down, and every packet to and from it stops.
  bool cut_link(int k) const {
    return run(ip_ + " -n " + switch_ + " link set " + port_[std::size_t(k)] + " down");
  }
  // `accel store` on the switch's address, its output in `log`; returns its pid (-1: failed).
  pid_t start_store(int port, const std::string& log) const {
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      setenv("ACCEL_STORE_TOKEN", "elastic-test-token", 1);
      const std::string accel = bin_path("accel"), p = std::to_string(port);
      execl(ip_.c_str(), ip_.c_str(), "netns", "exec", switch_.c_str(), accel.c_str(), "store",
            "--host", kStoreHost, "--port", p.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }
  // Processes still running on machine k (none once the job ended: no orphans).
  std::string processes(int k) const {
    return output_of(ip_ + " netns pids " + ns_[std::size_t(k)] + " 2>/dev/null");
  }

  // `accel launch` of an elastic job on machine k; with `restart_after`, the machine runs it a
  // second time once that file exists (it comes back after being killed).
  std::vector<std::string> agent(int k, const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {ip_,
                                     "netns",
                                     "exec",
                                     ns_[std::size_t(k)],
                                     bin_path("accel"),
                                     "launch",
                                     "--nnodes",
                                     "2:3",
                                     "--nproc_per_node",
                                     "1",
                                     "--rdzv_backend",
                                     "c10d",
                                     "--rdzv_endpoint",
                                     kEndpoint,
                                     "--multi_cpu",
                                     "--monitor_interval",
                                     "0.05",
                                     "--grace_period",
                                     "1",
                                     "--heartbeat_interval",
                                     "0.5",
                                     "--heartbeat_misses",
                                     "4"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  launch::WorkerSpec machine(int k, const std::vector<std::string>& args,
                             const std::string& restart_after = "") const {
    launch::WorkerSpec spec;
    const std::vector<std::string> argv = agent(k, args);
    if (restart_after.empty()) {
      spec.argv = argv;
    } else {
      spec.argv = {"sh", "-c",
                   "\"$@\"; while [ ! -e '" + restart_after +
                       "' ]; do sleep 0.05; done; echo 'machine is back'; exec \"$@\"",
                   "sh"};
      spec.argv.insert(spec.argv.end(), argv.begin(), argv.end());
    }
    spec.label = "machine " + std::to_string(k);
    spec.unset_env = {"ACCEL_CONFIG_FILE",   "ACCEL_COMM_BACKEND", "ACCEL_GLOO_HOSTNAME",
                      "ACCEL_NUM_PROCESSES", "ACCEL_NUM_MACHINES", "ACCEL_MACHINE_RANK"};
    spec.env = {{"XDG_CONFIG_HOME", "/nonexistent-accel-test-config"},
                {"ACCEL_STORE_TOKEN", "elastic-test-token"},
                {"ACCEL_HOST_ID", "elastic-machine-" + std::to_string(k)},
                {"OMP_NUM_THREADS", "1"}};
    return spec;
  }

 private:
  std::string ip_, switch_, why_not_;
  std::vector<std::string> ns_, port_;
};

template <typename T>
std::vector<T> read_values(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<T> out;
  T v{};
  while (in.read(reinterpret_cast<char*>(&v), sizeof v)) out.push_back(v);
  return out;
}

template <typename T>
double max_difference(const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(double(a[i] - b[i])));
  return diff;
}

bool any_file_like(const fs::path& dir, const std::string& suffix, const std::string& but = "") {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename() != but && e.path().filename().string().ends_with(suffix)) return true;
  return false;
}

// Whether the checkpoint in `ck` was last written by `world` processes (its MANIFEST says so).
bool saved_by(const fs::path& ck, int world) {
  std::ifstream manifest(ck / "MANIFEST");
  const std::string text((std::istreambuf_iterator<char>(manifest)),
                         std::istreambuf_iterator<char>());
  return contains(text, "\nworld_size: " + std::to_string(world) + "\n");
}

// The scenario of the issue, on the three machines at --nnodes 2:3: machine 2 is killed once
// world 3 trains and saved; once the other two train at world 2 and saved, it comes back. The
// program (`train`) touches progress/attempt<A>_world<W> when it trains and saves to `ck`.
struct ElasticRun {
  launch::GroupResult result;
  int phase = 0;                          // 4: every step of the scenario happened
  double to_world2 = -1, to_world3 = -1;  // seconds from the kill
};

ElasticRun run_scenario(const Machines& machines, const TempDir& dir, int per_machine,
                        const std::vector<std::string>& launch_flags,
                        const std::vector<std::string>& train) {
  const std::string world3 = "_world" + std::to_string(3 * per_machine),
                    world2 = "_world" + std::to_string(2 * per_machine);
  const fs::path progress = dir / "progress", back = dir / "machine2_back", ck = dir / "ck";
  fs::create_directories(progress);
  std::vector<std::string> args = {"--max_restarts",   "3",
                                   "--rdzv_conf",      "join_timeout=60,last_call_timeout=1",
                                   "--nproc_per_node", std::to_string(per_machine)};
  args.insert(args.end(), launch_flags.begin(), launch_flags.end());
  args.insert(args.end(), train.begin(), train.end());
  using Clock = std::chrono::steady_clock;
  ElasticRun run;
  Clock::time_point killed_at;
  const auto since_kill = [&] {
    return std::chrono::duration<double>(Clock::now() - killed_at).count();
  };
  launch::WorkerGroupOptions options;
  options.monitor_interval = std::chrono::milliseconds(50);
  options.capture = true;
  options.echo = false;
  options.timeout = std::chrono::seconds(240);  // anti-hang only
  options.stop_on_failure = false;
  options.should_stop = [&] {
    if (run.phase == 0 && fs::exists(progress / ("attempt0" + world3)) &&
        saved_by(ck, 3 * per_machine)) {
      machines.kill_machine(2);  // mid-epoch: after a save, with batches still to run
      killed_at = Clock::now();
      run.phase = 1;
    } else if (run.phase == 1 && any_file_like(progress, world2)) {
      run.to_world2 = since_kill();
      run.phase = 2;
    } else if (run.phase == 2 && saved_by(ck, 2 * per_machine)) {
      std::ofstream{back};  // the machine comes back
      run.phase = 3;
    } else if (run.phase == 3 && any_file_like(progress, world3, "attempt0" + world3)) {
      run.to_world3 = since_kill();
      run.phase = 4;
    }
    return false;
  };
  run.result = launch::run_worker_group(
      {machines.machine(0, args), machines.machine(1, args), machines.machine(2, args, back)},
      options);
  return run;
}

void check_scenario(const Machines& machines, const ElasticRun& run) {
  INFO(describe(run.result));
  REQUIRE_FALSE(run.result.timed_out);
  REQUIRE(run.phase == 4);
  for (int k = 0; k < kMachines; ++k) CHECK(run.result.workers.at(std::size_t(k)).exit_code == 0);
  const std::string& m0 = run.result.workers.at(0).output;
  CHECK(contains(m0, "round 0: 3 machines"));
  CHECK(contains(m0, "round 1: 2 machines"));
  CHECK(contains(m0, "restarting every worker (restart 1 of 3)"));
  CHECK(contains(m0,
                 "a machine joined the job (2 were running): restarting at the new size "
                 "(not counted as a restart)"));
  CHECK(contains(m0, "round 2: 3 machines"));
  CHECK(contains(run.result.workers.at(2).output, "machine is back"));
  // No process left on any machine.
  for (int k = 0; k < kMachines; ++k) CHECK(machines.processes(k).empty());
}

// fp32 parameters: a gradient element (its norm clipped to 2 or less) averaged over the ranks
// in another order differs by a few ulps, 2 x 4 x 2^-24 ~ 5e-7; times the learning rate (0.05
// at most) and up to 10x through momentum: 2.4e-7 per step. Over the 48 steps of these runs:
// 1.2e-5 if every error had the same sign, 1.7e-6 as a random walk. The bound, 1e-5,
// lies between. (A checkpoint holds the values exactly.)
constexpr double kLimit = 1e-5;

}  // namespace

TEST_CASE(
    "--nnodes 2:3, DDP: a machine killed mid-epoch, the other two go on at world 2 from the "
    "last checkpoint, it comes back and the job grows to 3; the parameters are one process's") {
  Machines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  TempDir dir("accel_elastic_ddp");
  // 6 epochs of 8 global batches of 12 samples: 2 per rank at 3 machines, 3 at 2; a save
  // every 2 batches, so the kill comes mid-epoch.
  const std::vector<std::string> common = {"--epochs", "6", "--samples", "96", "--no_noise"};
  std::vector<std::string> train = {bin_path("checkpoint_worker"),
                                    "--save_every",
                                    "2",
                                    "--sleep_ms",
                                    "150",
                                    "--resume",
                                    "--checkpoint",
                                    dir / "ck",
                                    "--progress",
                                    dir / "progress",
                                    "--out",
                                    dir / "elastic.bin"};
  train.insert(train.end(), common.begin(), common.end());
  // Two processes per machine: shared memory inside each, Gloo between them; a killed machine
  // leaves no segment (each is unlinked once every rank mapped it).
  const std::set<std::string> leaked_before = leaked_shm_segments();
  const ElasticRun run = run_scenario(machines, dir, 2, {"--global_batch_size", "12"}, train);
  check_scenario(machines, run);
  CHECK(new_shm_leaks(leaked_before).empty());
  MESSAGE("DDP: from the kill to training on 2 machines: "
          << run.to_world2 << " s; to 3 machines again (after 2 saved): " << run.to_world3 << " s");

  // The same 48 global batches in one process, without a launcher.
  RanksOptions one;
  one.env = {{"ACCEL_GLOBAL_BATCH_SIZE", "12"}};
  std::vector<std::string> plain = {"--out", dir / "one.bin"};
  plain.insert(plain.end(), common.begin(), common.end());
  REQUIRE(run_ranks(1, "checkpoint_worker", plain, one).exit_code() == 0);
  const double diff =
      max_difference(read_values<float>(dir / "elastic.bin"), read_values<float>(dir / "one.bin"));
  MESSAGE("DDP: max |elastic - one process| " << diff << " (limit " << kLimit << ")");
  CHECK(diff <= kLimit);
}

TEST_CASE("--nnodes 2:3, ZeRO-2: the same scenario reshards the optimizer state 3 -> 2 -> 3") {
  Machines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  TempDir dir("accel_elastic_zero2");
  // AdamW, two groups, clipping; global batches of 24 (8 per rank at 3, 12 at 2), 48 steps.
  const std::vector<std::string> train = {bin_path("zero_resume_worker"),
                                          "--phase",
                                          "elastic",
                                          "--steps",
                                          "48",
                                          "--save_every",
                                          "2",
                                          "--sleep_ms",
                                          "150",
                                          "--dir",
                                          dir / "ck",
                                          "--progress",
                                          dir / "progress",
                                          "--out",
                                          dir / "elastic.bin"};
  const ElasticRun run = run_scenario(machines, dir, 1, {"--use_zero", "--zero_stage", "2"}, train);
  check_scenario(machines, run);
  MESSAGE("ZeRO-2: from the kill to training on 2 machines: "
          << run.to_world2 << " s; to 3 machines again (after 2 saved): " << run.to_world3 << " s");

  // Uninterrupted at a fixed size: ZeRO-2 at world 2 (the test's own ranks, no machines).
  RanksOptions two;
  two.env = {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"}, {"ACCEL_ZERO_STAGE", "2"}};
  REQUIRE(run_ranks(2, "zero_resume_worker",
                    {"--phase", "whole", "--steps", "48", "--out", dir / "fixed.bin"}, two)
              .exit_code() == 0);
  // AdamW's update lr x m / sqrt(v) is scale-free in the gradient: gradients a few ulps apart
  // (relative 5e-7) change it by about as much, 5e-7 x lr 3e-3 = 1.5e-9 per step, 7e-8 over
  // 48 steps; the bound is 1e-5.
  const double diff = max_difference(read_values<double>(dir / "elastic.bin"),
                                     read_values<double>(dir / "fixed.bin"));
  MESSAGE("ZeRO-2: max |elastic - uninterrupted world 2| " << diff << " (limit " << kLimit << ")");
  CHECK(diff <= kLimit);
}

namespace {

// Three machines train (DDP, checkpoint_worker) until world 3 saved; then `fault` strikes
// machine 2 and the job runs to its end. Returns the machines' results and the seconds from
// the fault to training at world 2 (-1: never).
struct FaultRun {
  launch::GroupResult result;
  bool struck = false;
  double to_world2 = -1;
};

FaultRun run_fault(const Machines& machines, const TempDir& dir,
                   const std::vector<std::string>& launch_flags,
                   const std::function<bool()>& fault) {
  const fs::path progress = dir / "progress", ck = dir / "ck";
  fs::create_directories(progress);
  std::vector<std::string> args = {"--global_batch_size", "12"};
  args.insert(args.end(), launch_flags.begin(), launch_flags.end());
  args.insert(args.end(), {bin_path("checkpoint_worker"), "--epochs", "3", "--samples", "96",
                           "--no_noise", "--save_every", "2", "--sleep_ms", "150", "--resume",
                           "--checkpoint", ck, "--progress", progress});
  using Clock = std::chrono::steady_clock;
  FaultRun run;
  Clock::time_point struck_at;
  launch::WorkerGroupOptions options;
  options.monitor_interval = std::chrono::milliseconds(50);
  options.capture = true;
  options.echo = false;
  options.timeout = std::chrono::seconds(240);  // anti-hang only
  options.stop_on_failure = false;
  options.should_stop = [&] {
    if (!run.struck && fs::exists(progress / "attempt0_world3") && saved_by(ck, 3)) {
      run.struck = fault();
      struck_at = Clock::now();
    } else if (run.struck && run.to_world2 < 0 && any_file_like(progress, "_world2")) {
      run.to_world2 = std::chrono::duration<double>(Clock::now() - struck_at).count();
    }
    return false;
  };
  run.result = launch::run_worker_group(
      {machines.machine(0, args), machines.machine(1, args), machines.machine(2, args)}, options);
  return run;
}

}  // namespace

TEST_CASE(
    "--nnodes 2:3: a cut link is noticed within the heartbeat window; the other two finish at "
    "world 2 and the cut-off machine stops naming the store's endpoint") {
  Machines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  TempDir dir("accel_elastic_cut");
  // Heartbeat 0.5 s x 4 misses: a silent machine is lost after 2 s.
  const FaultRun run = run_fault(
      machines, dir, {"--max_restarts", "1", "--rdzv_conf", "join_timeout=30,last_call_timeout=1"},
      [&] { return machines.cut_link(2); });
  INFO(describe(run.result));
  REQUIRE(run.struck);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(run.result.workers.at(0).exit_code == 0);
  CHECK(run.result.workers.at(1).exit_code == 0);
  CHECK(run.result.workers.at(2).exit_code != 0);
  CHECK(contains(run.result.workers.at(0).output, "round 1: 2 machines"));
  CHECK(contains(run.result.workers.at(2).output,
                 "the rendezvous store at 169.254.78.1:29544 did not answer"));
  // Whichever came first: a survivor's worker losing its connection, or the heartbeat.
  MESSAGE("from the cut to training at world 2: " << run.to_world2
                                                  << " s (heartbeat window 2 s, last call 1 s)");
  CHECK(run.to_world2 > 0);
  for (int k = 0; k < kMachines; ++k) CHECK(machines.processes(k).empty());
}

TEST_CASE(
    "--nnodes 2:3 with no restarts left, and --nnodes 3:3 with a machine gone: every agent "
    "exits non-zero with a summary naming what failed") {
  Machines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  {
    TempDir dir("accel_elastic_norestart");
    const FaultRun run =
        run_fault(machines, dir, {"--max_restarts", "0", "--rdzv_conf", "last_call_timeout=1"},
                  [&] { return machines.kill_machine(2); });
    INFO(describe(run.result));
    REQUIRE(run.struck);
    REQUIRE_FALSE(run.result.timed_out);
    for (int k = 0; k < 2; ++k) {
      const std::string& out = run.result.workers.at(std::size_t(k)).output;
      CHECK(run.result.workers.at(std::size_t(k)).exit_code != 0);
      // The root cause, named by machine and host:pid: a rank and its exit code (a survivor's
      // rank losing its peer), or the killed machine's silence.
      CHECK((contains(out, "exited with code 2") || contains(out, "stopped responding")));
    }
    CHECK(run.to_world2 < 0);
    for (int k = 0; k < kMachines; ++k) CHECK(machines.processes(k).empty());
  }
  {
    TempDir dir("accel_elastic_below_min");
    const FaultRun run = run_fault(
        machines, dir, {"--nnodes", "3:3", "--max_restarts", "2", "--rdzv_conf", "join_timeout=3"},
        [&] { return machines.kill_machine(2); });
    INFO(describe(run.result));
    REQUIRE(run.struck);
    REQUIRE_FALSE(run.result.timed_out);
    for (int k = 0; k < 2; ++k) {
      const std::string& out = run.result.workers.at(std::size_t(k)).output;
      CHECK(run.result.workers.at(std::size_t(k)).exit_code != 0);
      CHECK(contains(out, "restarting every worker (restart 1 of 2)"));
      CHECK(contains(out,
                     "round 1 has 2 of at least 3 nodes (--nnodes 3:3) after the join "
                     "timeout of 3 s"));
    }
    for (int k = 0; k < kMachines; ++k) CHECK(machines.processes(k).empty());
  }
}

TEST_CASE("the agent hosting the store dies: the others stop, naming the store's endpoint") {
  Machines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  TempDir dir("accel_elastic_host");
  // Machine 0's address is the endpoint: killing it takes the store (no new host is elected).
  const FaultRun run =
      run_fault(machines, dir, {"--max_restarts", "3", "--rdzv_conf", "last_call_timeout=1"},
                [&] { return machines.kill_machine(0); });
  INFO(describe(run.result));
  REQUIRE(run.struck);
  REQUIRE_FALSE(run.result.timed_out);
  for (int k = 1; k < kMachines; ++k) {
    CHECK(run.result.workers.at(std::size_t(k)).exit_code != 0);
    CHECK(contains(run.result.workers.at(std::size_t(k)).output, "169.254.78.1:29544"));
  }
  CHECK(run.to_world2 < 0);
  for (int k = 0; k < kMachines; ++k) CHECK(machines.processes(k).empty());
}

TEST_CASE(
    "an external store (accel store on a fourth address): machine 0 dies and the other two go "
    "on at world 2") {
  Machines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  TempDir dir("accel_elastic_external");
  const std::string log = dir / "store.log";
  const pid_t store = machines.start_store(29545, log);
  REQUIRE(store > 0);
  // No agent can bind the endpoint: all three connect to it; ranks go by join order, so
  // machine 0 is any node, and its loss leaves the store (and the job) alive.
  const FaultRun run =
      run_fault(machines, dir,
                {"--rdzv_endpoint", std::string(kStoreHost) + ":29545", "--max_restarts", "2",
                 "--rdzv_conf", "join_timeout=30,last_call_timeout=1"},
                [&] { return machines.kill_machine(0); });
  kill(store, SIGTERM);
  int status = 0;
  waitpid(store, &status, 0);
  INFO(describe(run.result));
  std::ifstream store_log(log);
  const std::string said((std::istreambuf_iterator<char>(store_log)),
                         std::istreambuf_iterator<char>());
  INFO(said);
  REQUIRE(run.struck);
  REQUIRE_FALSE(run.result.timed_out);
  CHECK(contains(said, std::string("accel store: serving on ") + kStoreHost + ":29545"));
  CHECK(contains(said, "accel store: stopped by SIGTERM"));
  CHECK(WIFEXITED(status));
  CHECK(run.to_world2 > 0);
  for (int k = 1; k < kMachines; ++k) {
    const std::string& out = run.result.workers.at(std::size_t(k)).output;
    CHECK(run.result.workers.at(std::size_t(k)).exit_code == 0);
    CHECK(contains(out, "round 1: 2 machines"));
    CHECK_FALSE(contains(out, "(hosted here)"));
  }
  MESSAGE("external store, machine 0 killed: training on 2 machines after " << run.to_world2
                                                                            << " s");
  for (int k = 0; k < kMachines; ++k) CHECK(machines.processes(k).empty());
}
