#pragma once
// Starts a group of worker processes and watches them: each in its own process group, its
// output read line by line (prefixed with its rank, kept in a per-rank log, a tail of its
// stderr kept for the failure report); the first worker to fail brings the others down
// (SIGTERM, then SIGKILL after a grace period). Used by `accel launch` and by the tests that
// run ranks as real processes.

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace accel::launch {

struct WorkerSpec {
  std::vector<std::string> argv;                             // argv[0] is looked up in PATH
  std::vector<std::pair<std::string, std::string>> env;      // added to (or overriding) ours
  std::string label;                                         // "rank 2": output prefix, reports
};

struct WorkerGroupOptions {
  std::chrono::milliseconds grace{5000};    // SIGTERM -> SIGKILL
  std::chrono::milliseconds timeout{0};     // whole group; 0 = none
  bool prefix_output = true;                // "[rank 2] " before each line we print
  bool echo = true;                         // copy worker output to our stdout/stderr
  bool capture = false;                     // keep all output in WorkerExit::output
  std::string log_dir;                      // when set: LOG_DIR/<label>.log per worker
  std::size_t tail_lines = 20;              // stderr lines kept for the failure report
  int stop_fd = -1;                         // readable = stop the group (signal forwarding)
};

struct WorkerExit {
  std::string label;
  int exit_code = 0;    // valid when signal == 0
  int signal = 0;       // the signal that ended it, if any
  std::string stderr_tail;
  std::string output;   // stdout+stderr interleaved, when captured
  bool stopped_by_us = false;  // ended because we terminated the group
};

struct GroupResult {
  std::vector<WorkerExit> workers;
  std::optional<std::size_t> first_failure;  // index into workers: the root cause
  bool timed_out = false;
  bool stopped = false;                      // stop_fd fired
  // 0 when all succeeded; else the root cause's exit code (128 + signal when signalled).
  int exit_code() const;
  // "rank 1 exited with code 3; last lines of its stderr: ..." or "" when all succeeded.
  std::string failure_report() const;
};

// Runs the workers to completion. Never leaves a child behind: on return every worker has
// been reaped.
GroupResult run_worker_group(const std::vector<WorkerSpec>& workers,
                             const WorkerGroupOptions& options);

}  // namespace accel::launch
