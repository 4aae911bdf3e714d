#pragma once
// Starts a group of worker processes and watches them: each in its own process group, its
// output read line by line (prefixed with its rank, copied to its log file, a tail of its
// stderr kept for the failure report); the first worker to fail brings the others down
// (SIGTERM, then SIGKILL after a grace period). Used by `accel launch` and by the tests that
// run ranks as real processes.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accel::launch {

struct WorkerSpec {
  std::vector<std::string> argv;                         // argv[0] is looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;  // added to (or overriding) ours
  std::vector<std::string> unset_env;                    // removed from ours
  std::string label;                                     // "rank 2": output prefix, reports
  std::string log_file;                                  // every line it writes; "" = none
  int rank = -1;  // the job rank it runs; -1 when it is not one rank (mpirun)
};

// Which of a worker's streams are copied to ours (torchrun's --tee numbering).
enum class Streams : unsigned { none = 0, out = 1, err = 2, both = 3 };

struct WorkerExit {
  std::string label;
  int exit_code = 0;  // valid when signal == 0
  int signal = 0;     // the signal that ended it, if any
  std::string stderr_tail;
  std::string output;          // stdout+stderr interleaved, when captured
  bool stopped_by_us = false;  // ended because we terminated the group
};

struct WorkerGroupOptions {
  std::chrono::milliseconds grace{5000};  // SIGTERM -> SIGKILL
  std::chrono::milliseconds timeout{0};   // whole group; 0 = none
  // How often exits are checked and should_stop is asked, at the latest (output is read as
  // soon as it arrives either way).
  std::chrono::milliseconds monitor_interval{100};
  bool prefix_output = true;             // "[rank 2] " before each line we print
  bool echo = true;                      // copy worker output to our stdout/stderr...
  Streams echo_streams = Streams::both;  // ...these streams of it
  bool capture = false;                  // keep all output in WorkerExit::output
  bool log_append = false;               // append to log files (a restart) instead of truncating
  std::string log_header;                // written first to each log file when not empty
  std::size_t tail_lines = 20;           // stderr lines kept for the failure report
  // Readable = stop the group (signal forwarding); each byte written is one request, and a
  // request while the group is already being stopped kills it at once (a second Ctrl-C).
  int stop_fd = -1;
  // The signal the workers get first when stop_fd fires (the one the launcher received, so
  // a Ctrl-C reaches them as SIGINT); SIGTERM when unset. SIGKILL follows after the grace.
  std::function<int()> stop_signal;
  bool stop_on_failure = true;  // false: let the others run on (a test judging each)
  // Asked every monitor_interval; true = stop the group (e.g. another node's worker failed).
  std::function<bool()> should_stop;
  // Called once, as soon as the root-cause failure is seen (before the others are stopped),
  // so it can be told to other nodes without waiting for the grace period. Its stderr_tail
  // holds what the worker wrote before it exited.
  std::function<void(const WorkerExit& failure)> on_failure;
  // Called for each worker that exited with code 0 while the group was not being stopped.
  std::function<void(const WorkerSpec& worker)> on_success;
  // The caller is the parent of every process it has (the launcher, a child subreaper):
  // exited orphans are reaped as they come, and at the end every remaining descendant is
  // ended too, not only the members of the workers' process groups.
  bool own_all_children = false;
};

struct GroupResult {
  std::vector<WorkerExit> workers;
  std::optional<std::size_t> first_failure;  // index into workers: the root cause
  bool timed_out = false;
  bool stopped = false;              // stop_fd fired or should_stop said so
  std::size_t leftovers_killed = 0;  // processes still alive after the workers exited
  // 0 when all succeeded; else the root cause's exit code (128 + signal when signalled).
  int exit_code() const;
  // "rank 1 exited with code 3; last lines of rank 1's stderr: ..." or "" when all succeeded.
  std::string failure_report() const;
};

// Runs the workers to completion. Never leaves a process behind: on return every worker has
// been reaped and what remained in their process groups (and, with own_all_children, every
// descendant) has been ended. Every wait is bounded by grace plus a few seconds once a stop
// was decided.
GroupResult run_worker_group(const std::vector<WorkerSpec>& workers,
                             const WorkerGroupOptions& options);

// "exited with code 3" / "was killed by signal 11 (Segmentation fault)".
std::string describe_exit(int exit_code, int signal);

// The root cause a failed worker stands for: "rank 0 exited with code 1", or, when its stderr
// says a collective timed out on ranks it did not hear from (the communicator's "ranks not
// heard from: [1]"), those ranks: "rank 1 stopped answering (rank 0 timed out waiting for it
// and exited with code 1)". A healthy rank's timeout is not the cause.
std::string describe_failure(const WorkerExit& failure);

}  // namespace accel::launch
