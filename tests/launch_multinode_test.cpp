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
#include <utility>
#include <vector>

#include "tests/support/files.hpp"
#include "tests/support/netns.hpp"
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

bool run(const std::string& command) { return run_quietly(command); }

// The two namespaces and their link, for the life of one test case. Names carry our pid, so
// concurrent test runs do not collide; the destructor removes everything even when a check
// failed (deleting a namespace deletes its end of the veth pair, and with it the other end).
class TwoMachines {
 public:
  TwoMachines() {
    ip_ = find_ip();
    why_not_ = netns_unavailable(ip_);
    if (!why_not_.empty()) return;
    // Namespaces of an earlier run killed before its destructors ran: removed.
    remove_stale_namespaces(ip_, "accel_t");
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

  const std::string& why_not() const { return why_not_; }

  // `accel launch` on machine `k` of 2, with `extra` flags and the program. With `disk`, the
  // machine has a filesystem of its own at disk.second: disk.first bind-mounted there in a
  // mount namespace of its own (unshare), which the other machine does not see.
  launch::WorkerSpec machine(int k, const std::vector<std::string>& args,
                             const std::pair<std::string, std::string>& disk = {}) const {
    launch::WorkerSpec spec;
    if (!disk.first.empty())
      spec.argv = {"unshare",
                   "--mount",
                   "--propagation",
                   "private",
                   "sh",
                   "-c",
                   "mount --bind \"$1\" \"$2\" && shift 2 && exec \"$@\"",
                   "sh",
                   disk.first,
                   disk.second};
    spec.argv.insert(spec.argv.end(),
                     {ip_, "netns", "exec", ns_[k], bin_path("accel"), "launch", "--num_machines",
                      "2", "--machine_rank", std::to_string(k), "--main_process_ip", kMachine0,
                      "--main_process_port", "29533", "--multi_cpu", "--monitor_interval", "0.05"});
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

// Whether this process may make a mount namespace and bind-mount in it (root, no seccomp
// filter against unshare).
bool can_bind_mount() {
  return run("unshare --mount --propagation private sh -c 'mount --bind / /mnt'");
}

// `during` is called every 50 ms while both launchers run (e.g. to cut the link mid-run).
// `disks`: each machine's own filesystem (TwoMachines::machine), or none.
launch::GroupResult run_both(const TwoMachines& machines, const std::vector<std::string>& args,
                             std::function<void()> during = {},
                             const std::vector<std::pair<std::string, std::string>>& disks = {}) {
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
  const auto disk = [&](int k) {
    return disks.empty() ? std::pair<std::string, std::string>{} : disks.at(std::size_t(k));
  };
  return launch::run_worker_group(
      {machines.machine(0, args, disk(0)), machines.machine(1, args, disk(1))}, options);
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

TEST_CASE(
    "save_on_each_node: two machines without a shared filesystem each keep a copy of their own "
    "ranks and resume from it exactly (ZeRO-2)") {
  TwoMachines machines;
  if (skip_unless(machines.ready(), machines.why_not())) return;
  if (skip_unless(can_bind_mount(), "cannot make a mount namespace (unshare --mount) here")) return;
  // Each machine sees its own disk (dir/machineK) at dir/disk; neither sees the other's.
  TempDir dir;
  const std::string view = dir.file("disk");
  for (const char* d : {"disk", "machine0", "machine1"})
    std::filesystem::create_directories(dir.file(d));
  const std::vector<std::pair<std::string, std::string>> disks = {{dir.file("machine0"), view},
                                                                  {dir.file("machine1"), view}};
  auto job = [&](const std::vector<std::string>& worker_args, bool on_each_node,
                 const std::vector<std::string>& launcher = {}) {
    std::vector<std::string> args = {"--num_processes",    "4",    "--grace_period", "1",
                                     "--distributed_type", "ZERO", "--zero_stage",   "2"};
    if (on_each_node) args.push_back("--save_on_each_node");
    args.insert(args.end(), launcher.begin(), launcher.end());
    args.push_back(bin_path("zero_resume_worker"));
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    const auto result = run_both(machines, args, {}, disks);
    INFO(describe(result));
    REQUIRE_FALSE(result.timed_out);
    return result;
  };
  // 20 steps straight; then 10, saved on each machine; then resumed to 20.
  CHECK(job({"--phase", "whole", "--out", view + "/whole.bin"}, false).exit_code() == 0);
  CHECK(job({"--phase", "save", "--dir", view + "/ck"}, true).exit_code() == 0);
  for (int k = 0; k < 2; ++k) {
    const std::string ck = dir.file("machine" + std::to_string(k) + "/ck");
    INFO("machine " << k << "'s copy " << ck);
    const std::string manifest = read_file(ck + "/MANIFEST");
    CHECK(contains(manifest, k == 0 ? "node_ranks: 0,1\n" : "node_ranks: 2,3\n"));
    // The shared files on both machines; each rank's own only on its machine.
    CHECK(std::filesystem::exists(ck + "/parameters.layout"));
    for (int r = 0; r < 4; ++r) {
      const bool here = r / 2 == k;
      CHECK(std::filesystem::exists(ck + "/optimizer.rank" + std::to_string(r)) == here);
      CHECK(std::filesystem::exists(ck + "/rng.rank" + std::to_string(r)) == here);
    }
  }
  // The same save in both copies.
  const auto save_id = [&](int k) {
    const std::string m = read_file(dir.file("machine" + std::to_string(k) + "/ck/MANIFEST"));
    const std::size_t at = m.find("save_id: ");
    return at == std::string::npos ? std::string() : m.substr(at, m.find('\n', at) - at);
  };
  CHECK(!save_id(0).empty());
  CHECK(save_id(0) == save_id(1));
  const auto resumed =
      job({"--phase", "resume", "--dir", view + "/ck", "--out", view + "/resumed.bin"}, true);
  INFO(describe(resumed));
  CHECK(resumed.exit_code() == 0);
  // Rank 0 (machine 0) wrote both results: the resumed run is the uninterrupted one, bit for bit
  // (the same ranks, data and arithmetic after the restore).
  const std::string whole = read_file(dir.file("machine0/whole.bin"));
  CHECK(!whole.empty());
  CHECK(read_file(dir.file("machine0/resumed.bin")) == whole);

  // The project's named checkpoints, saved twice on each machine (total_limit 1 keeps the
  // newest), then load_state() without a directory: the newest both machines have.
  const std::vector<std::string> project = {"--project_dir", view + "/project",
                                            "--automatic_checkpoint_naming", "--total_limit", "1"};
  for (int i = 0; i < 2; ++i)
    CHECK(job({"--phase", "save", "--dir", "project"}, true, project).exit_code() == 0);
  for (int k = 0; k < 2; ++k) {
    const std::string root = dir.file("machine" + std::to_string(k) + "/project/checkpoints");
    CHECK_FALSE(std::filesystem::exists(root + "/checkpoint_0"));  // total_limit 1
    CHECK(std::filesystem::exists(root + "/checkpoint_1/MANIFEST"));
  }
  const auto named =
      job({"--phase", "resume", "--dir", "project", "--out", view + "/named.bin"}, true, project);
  INFO(describe(named));
  CHECK(named.exit_code() == 0);
  CHECK(read_file(dir.file("machine0/named.bin")) == whole);

  // Without save_on_each_node the checkpoint needs one directory all ranks see: machine 1's
  // ranks do not see the one rank 0 made, say so, and the save fails on every rank.
  const auto shared = job({"--phase", "save", "--dir", view + "/ck2"}, false);
  INFO(describe(shared));
  CHECK(shared.exit_code() != 0);
  // Whichever machine's ranks exit first stop the other's, which may then not get to print:
  // machine 1's ranks name the cause, machine 0's name rank 2; at least one of them is there.
  const std::string all = shared.workers.at(0).output + shared.workers.at(1).output;
  CHECK((contains(all,
                  "does not see the directory its writer made: every rank must see the "
                  "checkpoint directory (a shared filesystem), or save with save_on_each_node") ||
         contains(all, "rank 2 could not write its part of the checkpoint")));
  CHECK_FALSE(std::filesystem::exists(dir.file("machine0/ck2")));  // nothing half-written
  CHECK_FALSE(std::filesystem::exists(dir.file("machine1/ck2")));
}
