#include "launch/restart_loop.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "foundation/error.hpp"

namespace accel::launch {
namespace {

void say(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const std::string line = "accel launch: " + text + "\n";
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

std::string signal_name(int sig) {
  return sig == SIGINT    ? "SIGINT"
         : sig == SIGTERM ? "SIGTERM"
         : sig == SIGHUP  ? "SIGHUP"
                          : "signal " + std::to_string(sig);
}

}  // namespace

int run_attempts(const AttemptPlan& plan) {
  const LaunchOptions& options = *plan.options;
  std::optional<Attempt> previous;
  for (int restarts = 0;;) {
    Attempt current;
    try {
      current = plan.join(previous ? &*previous : nullptr, restarts);
    } catch (const NodeRendezvous::Interrupted&) {
      say("interrupted by " + signal_name(plan.interrupt_signal()) +
          " while waiting for the other machines");
      return 128 + plan.interrupt_signal();
    } catch (const TimeoutError& e) {
      say(e.what());
      return 1;
    }
    previous = current;
    restarts = current.restarts;
    const int attempt = current.number;
    const int me = current.machine_rank;
    NodeRendezvous& rdzv = *current.rendezvous;

    const std::vector<WorkerSpec> specs = plan.workers(current);
    WorkerGroupOptions group;
    group.grace = options.grace;
    group.monitor_interval = options.monitor_interval;
    group.prefix_output = plan.prefix_output;
    group.log_append = attempt > 0;  // a restart continues each rank's log, marked
    if (attempt > 0)
      group.log_header =
          "=== accel launch: " +
          (attempt == restarts ? std::string() : "attempt " + std::to_string(attempt) + ", ") +
          "restart " + std::to_string(restarts) + " of " + std::to_string(options.max_restarts) +
          " ===";
    if (!options.log_dir.empty() && options.tee) group.echo_streams = *options.tee;
    group.stop_fd = plan.stop_fd;
    group.stop_signal = plan.interrupt_signal;
    group.own_all_children = true;
    std::string lost_store;  // set when machine 0's store stopped answering mid-run
    auto store_failed = [&](const std::exception& e) {
      if (lost_store.empty())
        lost_store =
            dynamic_cast<const MachineLost*>(&e)
                ? std::string(e.what())
                : "machine 0 is lost: its rendezvous store failed (" + std::string(e.what()) + ")";
    };
    MembershipWatch members(plan.store, attempt);
    group.on_success = [&](const WorkerSpec& worker) {
      try {
        if (worker.rank >= 0) members.ended(worker.rank, worker.label);
      } catch (const std::exception& e) {
        store_failed(e);
      }
    };
    group.should_stop = [&] {
      try {
        if (rdzv.failure_reported(attempt)) return true;
        if (plan.newcomer_waiting && plan.newcomer_waiting(current)) {
          Failure grow;
          grow.machine = me;
          grow.counts = false;
          grow.what = "a machine joined the job (" + std::to_string(current.num_machines) +
                      " were running): restarting at the new size";
          rdzv.report_failure(attempt, grow);
          return true;
        }
        const std::optional<std::string> stranded = members.stranded();
        if (!stranded) return false;
        Failure f;
        f.machine = me;
        f.what = *stranded;
        rdzv.report_failure(attempt, f);
        return true;
      } catch (const std::exception& e) {
        store_failed(e);
        return true;
      }
    };
    group.on_failure = [&](const WorkerExit& failure) {
      Failure f;
      f.machine = me;
      f.exit_code = failure.signal ? 128 + failure.signal : failure.exit_code;
      f.what = (current.num_machines > 1 ? current.label + ": " : std::string()) +
               describe_failure(failure);
      try {
        rdzv.report_failure(attempt, f);
      } catch (const std::exception& e) {
        store_failed(e);
      }
    };

    const GroupResult result = run_worker_group(specs, group);
    if (result.first_failure) say(result.failure_report());
    if (result.leftovers_killed)
      say("ended " + std::to_string(result.leftovers_killed) +
          " process(es) the workers left behind");
    if (!lost_store.empty()) {
      say("stopped: " + lost_store);
      return result.first_failure ? result.exit_code() : 1;
    }
    if (const int sig = plan.interrupt_signal()) {
      say("interrupted by " + signal_name(sig) + "; the workers were stopped");
      Failure f;
      f.machine = me;
      f.exit_code = 128 + sig;
      f.restartable = false;
      f.what =
          "machine " + std::to_string(me) + "'s launcher was interrupted by " + signal_name(sig);
      try {
        rdzv.report_failure(attempt, f);
        rdzv.finish(attempt, 128 + sig, 0);
      } catch (const std::exception&) {
        // Telling the others is a courtesy; they notice a silent launcher anyway.
      }
      return 128 + sig;
    }

    Outcome outcome;
    try {
      outcome = rdzv.finish(attempt, result.exit_code(), options.max_restarts - restarts);
    } catch (const std::exception& e) {
      say("lost the other machines: " + std::string(e.what()));
      return result.exit_code() ? result.exit_code() : 1;
    }
    switch (outcome.decision) {
      case Decision::success:
        return 0;
      case Decision::restart:
        if (!outcome.failure->counts) {
          say(outcome.failure->what + " (not counted as a restart)");
          continue;
        }
        ++restarts;
        say("restarting every worker (restart " + std::to_string(restarts) + " of " +
            std::to_string(options.max_restarts) + ") after " + outcome.failure->what);
        continue;
      case Decision::stop:
        break;
    }
    const Failure failure = outcome.failure.value_or(Failure{});
    if (failure.machine != me || !result.first_failure) say("stopped: " + failure.what);
    if (options.max_restarts > 0 && failure.restartable)
      say("no restarts left (--max_restarts " + std::to_string(options.max_restarts) + ")");
    return failure.exit_code != 0 ? failure.exit_code : 1;
  }
}

}  // namespace accel::launch
