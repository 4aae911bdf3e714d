// Two machines, simulated: two network namespaces joined by a veth pair, made (and removed)
// by this test. The addresses (169.254.77.1/30 and .2, link-local) exist only inside these
// namespaces, so no traffic leaves them. Each namespace runs `accel launch --num_machines 2
// --machine_rank K --main_process_ip 169.254.77.1`, as each machine of a real job would.
// Where namespaces cannot be made (not root, no CAP_NET_ADMIN, no `ip`), the tests say
// SKIPPED and why.

#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;

namespace {

constexpr const char* kMachine0 = "169.254.77.1";
constexpr const char* kMachine1 = "169.254.77.2";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string find_ip() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// Runs a command quietly; true when it exited 0.
bool run(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

// The two namespaces and their link, for the life of one test case. Names carry our pid, so
// concurrent test runs do not collide; the destructor removes everything even when a check
// failed (deleting a namespace deletes its end of the veth pair, and with it the other end).
class TwoMachines {
 public:
  TwoMachines() {
    ip_ = find_ip();
    if (ip_.empty()) {
      why_not_ = "the `ip` command (iproute2) is not installed";
      return;
    }
    if (geteuid() != 0) {
      why_not_ = "creating network namespaces needs root (CAP_NET_ADMIN)";
      return;
    }
    remove_stale_namespaces();
    const std::string tag = std::to_string(getpid());
    ns_[0] = "accel_t" + tag + "_0";
    ns_[1] = "accel_t" + tag + "_1";
    veth0_ = "acv" + tag + "a";  // <= 15 chars
    const std::string veth0 = veth0_, veth1 = "acv" + tag + "b";
    const std::string steps[] = {
        ip_ + " netns add " + ns_[0],
        ip_ + " netns add " + ns_[1],
        ip_ + " link add " + veth0 + " type veth peer name " + veth1,
        ip_ + " link set " + veth0 + " netns " + ns_[0],
        ip_ + " link set " + veth1 + " netns " + ns_[1],
        ip_ + " -n " + ns_[0] + " addr add " + kMachine0 + "/30 dev " + veth0,
        ip_ + " -n " + ns_[1] + " addr add " + kMachine1 + "/30 dev " + veth1,
        ip_ + " -n " + ns_[0] + " link set " + veth0 + " up",
        ip_ + " -n " + ns_[1] + " link set " + veth1 + " up",
        // Machine 0's launcher talks to its own store over loopback.
        ip_ + " -n " + ns_[0] + " link set lo up",
        ip_ + " -n " + ns_[1] + " link set lo up",
    };
    for (const auto& step : steps)
      if (!run(step)) {
        why_not_ = "could not set up network namespaces (`" + step + "` failed; no CAP_NET_ADMIN?)";
        // A half-made veth pair outside the namespaces would outlive them.
        run(ip_ + " link del " + veth0);
        return;
      }
  }
  ~TwoMachines() {
    for (const auto& ns : ns_)
      if (!ns.empty()) run(ip_ + " netns del " + ns);
  }
  TwoMachines(const TwoMachines&) = delete;
  TwoMachines& operator=(const TwoMachines&) = delete;

  bool ready() const { return why_not_.empty(); }

  // Pulls the cable: the veth pair goes (both ends), and with it every packet between the two.
  bool cut_link() const { return run(ip_ + " -n " + ns_[0] + " link del " + veth0_); }

  // Namespaces of an earlier run that was killed before its destructors ran (the pid in
  // their name is gone): removed, so they do not pile up.
  void remove_stale_namespaces() const {
    FILE* list = popen((ip_ + " netns list 2>/dev/null").c_str(), "r");
    if (!list) return;
    char line[256];
    while (std::fgets(line, sizeof(line), list)) {
      int pid = 0, k = 0;
      char name[64] = {};
      if (std::sscanf(line, "%63s", name) == 1 &&
          std::sscanf(name, "accel_t%d_%d", &pid, &k) == 2 && pid > 0 && kill(pid, 0) != 0 &&
          errno == ESRCH)
        run(ip_ + " netns del " + name);
    }
    pclose(list);
  }
  const std::string& why_not() const { return why_not_; }

  // `accel launch` on machine `k` of 2, with `extra` flags and the program.
  launch::WorkerSpec machine(int k, const std::vector<std::string>& args) const {
    launch::WorkerSpec spec;
    spec.argv = {ip_,
                 "netns",
                 "exec",
                 ns_[k],
                 bin_path("accel"),
                 "launch",
                 "--num_machines",
                 "2",
                 "--machine_rank",
                 std::to_string(k),
                 "--main_process_ip",
                 kMachine0,
                 "--main_process_port",
                 "29533",
                 "--multi_cpu",
                 "--monitor_interval",
                 "0.05"};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.label = "machine " + std::to_string(k);
    spec.unset_env = {"ACCEL_CONFIG_FILE",   "ACCEL_COMM_BACKEND", "ACCEL_GLOO_HOSTNAME",
                      "ACCEL_NUM_PROCESSES", "ACCEL_NUM_MACHINES", "ACCEL_MACHINE_RANK"};
    // The namespaces share this kernel and its /dev/shm, so shared memory would work between
    // them; the host identity says they are two machines, so `auto` (the default) takes the
    // multi-host path: shared memory inside each, Gloo between them over the veth pair.
    spec.env = {{"XDG_CONFIG_HOME", "/nonexistent-accel-test-config"},
                {"ACCEL_STORE_TOKEN", "two-machine-test-token"},
                {"ACCEL_HOST_ID", "test-machine-" + std::to_string(k)},
                {"OMP_NUM_THREADS", "1"}};
    return spec;
  }

 private:
  std::string ip_;
  std::string ns_[2];
  std::string veth0_;
  std::string why_not_;
};

// `during` is called every 50 ms while both launchers run (e.g. to cut the link mid-run).
launch::GroupResult run_both(const TwoMachines& machines, const std::vector<std::string>& args,
                             std::function<void()> during = {}) {
  launch::WorkerGroupOptions options;
  options.monitor_interval = std::chrono::milliseconds(50);
  if (during)
    options.should_stop = [during] {
      during();
      return false;
    };
  options.capture = true;
  options.echo = false;
  options.timeout = std::chrono::seconds(120);  // anti-hang only
  // A failed machine must not take the other down before it reports: we judge both.
  options.stop_on_failure = false;
  return launch::run_worker_group({machines.machine(0, args), machines.machine(1, args)}, options);
}

}  // namespace

TEST_CASE("two machines run a 2-node all-reduce (shm inside, Gloo between) through accel launch") {
  TwoMachines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  const auto result = run_both(machines, {"--num_processes", "4", bin_path("allreduce_demo")});
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code() == 0);
  const std::string& m0 = result.workers.at(0).output;
  const std::string& m1 = result.workers.at(1).output;
  // Global ranks: machine K runs K * 2 + local rank.
  CHECK(contains(m0,
                 "[rank 0] rank 0 of 4 (hierarchical): all_reduce of 1048576 floats: 10 (expected "
                 "10), 0 wrong"));
  CHECK(contains(m0, "[rank 1] rank 1 of 4 (hierarchical)"));
  CHECK(contains(m1,
                 "[rank 2] rank 2 of 4 (hierarchical): all_reduce of 1048576 floats: 10 (expected "
                 "10), 0 wrong"));
  CHECK(contains(m1, "[rank 3] rank 3 of 4 (hierarchical)"));
  // Gloo was told which address reaches the other machine.
  CHECK(contains(m1, std::string("ACCEL_GLOO_HOSTNAME=") + kMachine1));
}

TEST_CASE("a worker failing on machine 1 stops machine 0's workers; both exit with its status") {
  TwoMachines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  // Rank 3 dies before joining; ranks 0-2 would wait in the Gloo rendezvous for 30 minutes.
  const auto result = run_both(
      machines, {"--num_processes", "4", "--grace_period", "1", "sh", "-c",
                 "if [ \"$RANK\" = 3 ]; then echo 'rank 3 gives up' >&2; exit 3; fi; exec " +
                     bin_path("allreduce_demo")});
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.workers.at(0).exit_code == 3);
  CHECK(result.workers.at(1).exit_code == 3);
  CHECK(contains(result.workers.at(1).output, "rank 3 exited with code 3"));
  CHECK(contains(result.workers.at(1).output, "rank 3 gives up"));
  CHECK(contains(result.workers.at(0).output, "stopped: machine 1: rank 3 exited with code 3"));
}

TEST_CASE("--max_restarts restarts the workers of both machines together") {
  TwoMachines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  const std::string marker = (std::filesystem::temp_directory_path() /
                              ("accel_multinode_marker_" + std::to_string(getpid())))
                                 .string();
  std::filesystem::remove(marker);
  const auto result = run_both(
      machines, {"--num_processes", "4", "--max_restarts", "1", "--grace_period", "1", "sh", "-c",
                 "if [ \"$RANK\" = 2 ] && [ ! -e " + marker + " ]; then touch " + marker +
                     "; exit 9; fi; exec " + bin_path("allreduce_demo")});
  std::filesystem::remove(marker);
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code() == 0);
  CHECK(contains(
      result.workers.at(0).output,
      "restarting every worker (restart 1 of 1) after machine 1: rank 2 exited with code 9"));
  CHECK(contains(result.workers.at(1).output, "restarting every worker (restart 1 of 1)"));
  CHECK(contains(result.workers.at(0).output,
                 "[rank 0] rank 0 of 4 (hierarchical): all_reduce of 1048576 floats: 10 (expected "
                 "10), 0 wrong"));
  CHECK(contains(result.workers.at(1).output,
                 "[rank 2] rank 2 of 4 (hierarchical): all_reduce of 1048576 floats: 10 (expected "
                 "10), 0 wrong"));
}

TEST_CASE("a machine cut off mid-run is noticed by the heartbeat: both launchers stop naming it") {
  TwoMachines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  TempDir dir;
  // Every worker says it runs, then runs for far longer than the test may take. The link
  // goes once all four run; without the heartbeat machine 0 would wait for machine 1's
  // workers until they end (600 s), and machine 1 until its store requests time out.
  bool cut = false;
  auto all_running = [&] {
    for (int r = 0; r < 4; ++r)
      if (!std::filesystem::exists(dir / ("running_" + std::to_string(r)))) return false;
    return true;
  };
  const auto result =
      run_both(machines,
               {"--num_processes", "4", "--grace_period", "1", "--heartbeat_interval", "0.5",
                "--heartbeat_misses", "4", "sh", "-c",
                "touch " + dir.path.string() + "/running_$RANK; exec sleep 600"},
               [&] {
                 if (!cut && all_running()) cut = machines.cut_link();
               });
  INFO(describe(result));
  REQUIRE(cut);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.workers.at(0).exit_code == 1);
  CHECK(result.workers.at(1).exit_code == 1);
  CHECK(contains(result.workers.at(0).output,
                 "stopped: machine 1's launcher stopped responding (no heartbeat for 2 s)"));
  CHECK(contains(result.workers.at(1).output,
                 "stopped: machine 0 is lost: its rendezvous store did not answer"));
}
