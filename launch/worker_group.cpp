#include "launch/worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "foundation/error.hpp"
#include "launch/reaper.hpp"

extern char** environ;

namespace accel::launch {
namespace {

using Clock = std::chrono::steady_clock;

// One stream (stdout or stderr) of one worker, split into lines as it arrives.
struct Stream {
  int fd = -1;
  bool is_stderr = false;
  std::string partial;
};

struct Worker {
  const WorkerSpec* spec = nullptr;
  pid_t pid = -1;
  bool running = false;
  bool exit_seen = false;  // its exit was judged (on_success / on_failure)
  Stream out, err;
  std::deque<std::string> tail;
  std::unique_ptr<std::ofstream> log;
  WorkerExit exit;
};

std::vector<std::string> build_environment(const WorkerSpec& spec) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& name : spec.unset_env) env.erase(name);
  for (const auto& [k, v] : spec.env) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own output is gone (closed pipe): nothing better to do
    done += std::size_t(n);
  }
}

void start(Worker& w) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) throw Error("launch: pipe failed: " + errno_text(errno));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    throw Error("launch: pipe failed: " + errno_text(errno));
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe
  // calls are allowed.
  std::vector<std::string> env_strings = build_environment(*w.spec);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = w.spec->argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    throw Error("launch: fork failed: " + errno_text(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);  // own process group: signals reach the worker's children too
    // If the launcher itself is killed outright (SIGKILL, OOM killer), its workers must not
    // run on unsupervised. (The signal fires when the forking *thread* exits: we fork from
    // the thread that runs the group.)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // it died before prctl took effect
    // Handlers are reset by exec, but a blocked mask is inherited: give the program a clean one.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    const char msg[] = "launch: could not execute the worker program: ";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    const char* why = strerror(errno);
    (void)!write(STDERR_FILENO, why, strlen(why));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so kill(-pid) works before the child runs
  close(out_pipe[1]);
  close(err_pipe[1]);
  w.pid = pid;
  w.running = true;
  w.out = Stream{out_pipe[0], false, {}};
  w.err = Stream{err_pipe[0], true, {}};
}

void emit_line(Worker& w, const WorkerGroupOptions& opt, const std::string& line, bool is_err) {
  const unsigned wanted = is_err ? unsigned(Streams::err) : unsigned(Streams::out);
  if (opt.echo && (unsigned(opt.echo_streams) & wanted)) {
    // A line that names its worker already (an uncaught error's) is not prefixed twice.
    const std::string prefix = "[" + w.spec->label + "] ";
    const bool prefixed = !opt.prefix_output || line.compare(0, prefix.size(), prefix) == 0;
    write_all(is_err ? STDERR_FILENO : STDOUT_FILENO, (prefixed ? "" : prefix) + line + "\n");
  }
  if (w.log) *w.log << line << '\n' << std::flush;
  if (opt.capture) w.exit.output += line + "\n";
  if (is_err) {
    w.tail.push_back(line);
    if (w.tail.size() > opt.tail_lines) w.tail.pop_front();
  }
}

// Reads what is available; returns false at end of stream.
bool pump(Worker& w, Stream& s, const WorkerGroupOptions& opt) {
  char buf[65536];
  const ssize_t n = read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!s.partial.empty()) emit_line(w, opt, s.partial, s.is_stderr);
    s.partial.clear();
    close(s.fd);
    s.fd = -1;
    return false;
  }
  s.partial.append(buf, std::size_t(n));
  std::size_t start = 0, nl;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    emit_line(w, opt, s.partial.substr(start, nl - start), s.is_stderr);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  return true;
}

// Reads what a worker's streams hold now, without waiting for more (its last words, once it
// exited: a child may keep the pipes open).
void pump_available(Worker& w, const WorkerGroupOptions& opt) {
  for (Stream* s : {&w.out, &w.err})
    for (int i = 0; i < 1024 && s->fd >= 0; ++i) {
      pollfd p{s->fd, POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) break;
      pump(w, *s, opt);
    }
}

std::string tail_text(const Worker& w) {
  std::string out;
  for (const auto& line : w.tail) out += line + "\n";
  return out;
}

// Reads whatever is still buffered in a stream without waiting for more, then closes it.
void drain(Worker& w, Stream& s, const WorkerGroupOptions& opt) {
  if (s.fd < 0) return;
  fcntl(s.fd, F_SETFL, fcntl(s.fd, F_GETFL) | O_NONBLOCK);
  for (int i = 0; i < 1024 && s.fd >= 0; ++i) {
    pollfd p{s.fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) break;
    pump(w, s, opt);
  }
  if (!s.partial.empty()) emit_line(w, opt, s.partial, s.is_stderr);
  s.partial.clear();
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
}

void signal_all(std::vector<Worker>& workers, int sig) {
  for (auto& w : workers)
    if (w.running) {
      kill(-w.pid, sig);
      // A stopped worker (SIGSTOP, a debugger let go) acts on SIGTERM only once it runs again,
      // instead of waiting out the grace period for SIGKILL.
      if (sig != SIGKILL) kill(-w.pid, SIGCONT);
      w.exit.stopped_by_us = true;
    }
}

void record_status(Worker& w, int status) {
  w.running = false;
  if (WIFSIGNALED(status))
    w.exit.signal = WTERMSIG(status);
  else
    w.exit.exit_code = WEXITSTATUS(status);
}

// Collects exited workers. With own_all_children every child is reaped, orphans included
// (reparented to us as a subreaper, they would otherwise stay zombies until we exit).
void reap(std::vector<Worker>& workers, bool own_all_children) {
  if (!own_all_children) {
    for (auto& w : workers) {
      int status = 0;
      if (w.running && waitpid(w.pid, &status, WNOHANG) == w.pid) record_status(w, status);
    }
    return;
  }
  int status = 0;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
    for (auto& w : workers)
      if (w.running && w.pid == pid) record_status(w, status);
}

bool failed(const WorkerExit& e) { return e.signal != 0 || e.exit_code != 0; }

std::vector<pid_t> process_groups(const std::vector<Worker>& workers) {
  std::vector<pid_t> groups;
  for (const auto& w : workers)
    if (w.pid > 0) groups.push_back(w.pid);
  return groups;
}

// Last resort when something threw while workers run: nothing may be left behind.
void kill_everything(std::vector<Worker>& workers, const WorkerGroupOptions& opt) noexcept {
  try {
    signal_all(workers, SIGKILL);
    for (auto& w : workers)
      if (w.running) {
        int status = 0;
        if (waitpid(w.pid, &status, 0) == w.pid) record_status(w, status);
      }
    end_leftovers(process_groups(workers), opt.own_all_children, std::chrono::milliseconds(0));
    for (auto& w : workers)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          close(s->fd);
          s->fd = -1;
        }
  } catch (...) {
  }
}

// One Worker per spec, its log file open (created with its directory, or appended to on a
// restart) before any process starts, so a log that cannot be written starts nothing.
std::vector<Worker> prepare_workers(const std::vector<WorkerSpec>& specs,
                                    const WorkerGroupOptions& opt) {
  std::vector<Worker> workers(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    workers[i].spec = &specs[i];
    workers[i].exit.label = specs[i].label;
    if (specs[i].log_file.empty()) continue;
    const std::filesystem::path path(specs[i].log_file);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    workers[i].log =
        std::make_unique<std::ofstream>(path, opt.log_append ? std::ios::app : std::ios::trunc);
    if (!*workers[i].log) throw Error("launch: cannot write the log file " + path.string());
    if (!opt.log_header.empty()) *workers[i].log << opt.log_header << '\n' << std::flush;
  }
  return workers;
}

// Watches started workers until every one has exited and its output is read: their output as
// it arrives, stop requests, exits (the first failure is the root cause and stops the rest),
// the group's timeout, and SIGKILL once a stop's grace period is over.
class GroupMonitor {
 public:
  GroupMonitor(std::vector<Worker>& workers, const WorkerGroupOptions& opt, GroupResult& result)
      : workers_(workers),
        opt_(opt),
        result_(result),
        started_(Clock::now()),
        interval_(std::max(opt.monitor_interval, std::chrono::milliseconds(1))),
        next_check_(started_ + interval_) {}

  void run() {
    for (;;) {
      read_output_and_stop_requests();
      const auto now = Clock::now();
      const bool check_now = now >= next_check_;
      if (check_now) next_check_ = now + interval_;
      if (check_now && opt_.should_stop && !kill_at_ && opt_.should_stop()) {
        result_.stopped = true;
        stop_group();
      }
      reap(workers_, opt_.own_all_children);
      const bool any_running = judge_exits();
      if (finished(any_running, now)) return;
      if (opt_.timeout.count() > 0 && !kill_at_ && now - started_ > opt_.timeout) {
        result_.timed_out = true;
        stop_group();
      }
      if (kill_at_ && !killed_ && now >= *kill_at_) {
        signal_all(workers_, SIGKILL);
        killed_ = true;
      }
    }
  }

 private:
  // Asks every worker to stop (once); SIGKILL follows when the grace period is over.
  void stop_group(int sig = SIGTERM) {
    if (kill_at_) return;
    signal_all(workers_, sig);
    kill_at_ = Clock::now() + opt_.grace;
  }

  // Waits until output arrives, stop_fd fires or the next check (or kill) is due, and handles
  // what came.
  void read_output_and_stop_requests() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> owners;
    for (auto& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
    const bool watch_stop = opt_.stop_fd >= 0 && !killed_;
    if (watch_stop) fds.push_back({opt_.stop_fd, POLLIN, 0});
    auto wake = next_check_;
    if (kill_at_ && !killed_) wake = std::min(wake, *kill_at_);
    const auto wait_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count();
    poll(fds.data(), fds.size(), int(std::clamp<long long>(wait_ms, 0, interval_.count())));
    for (std::size_t i = 0; i < owners.size(); ++i)
      if (fds[i].revents) pump(*owners[i].first, *owners[i].second, opt_);
    if (watch_stop && fds.back().revents) handle_stop_request();
  }

  void handle_stop_request() {
    char requests[64];
    (void)!read(opt_.stop_fd, requests, sizeof(requests));  // one byte per request
    result_.stopped = true;
    if (!kill_at_) {
      const int sig = opt_.stop_signal ? opt_.stop_signal() : 0;
      stop_group(sig > 0 ? sig : SIGTERM);
    } else {
      // Asked again while the workers are being stopped (a second Ctrl-C): no more grace.
      signal_all(workers_, SIGKILL);
      killed_ = true;
    }
  }

  // Judges each exit once (on_success; the first failure is the root cause, told through
  // on_failure, and stops the others); returns whether any worker still runs.
  bool judge_exits() {
    bool any_running = false;
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = workers_[i];
      if (!w.running && !w.exit_seen) {
        w.exit_seen = true;
        if (!failed(w.exit) && !kill_at_ && opt_.on_success) opt_.on_success(*w.spec);
      }
      if (!w.running && failed(w.exit) && !result_.first_failure && !kill_at_) {
        result_.first_failure = i;  // the root cause; the others are collateral
        if (opt_.on_failure) {
          pump_available(w, opt_);
          WorkerExit failure = w.exit;
          failure.stderr_tail = tail_text(w);
          opt_.on_failure(failure);
        }
        if (opt_.stop_on_failure) stop_group();
      }
      any_running |= w.running;
    }
    return any_running;
  }

  // Done when every worker exited and its streams closed, or 200 ms after the last exit: a
  // worker that exited may leave a child holding its pipes (it is ended afterwards).
  bool finished(bool any_running, Clock::time_point now) {
    bool streams_open = false;
    for (auto& w : workers_) streams_open |= (w.out.fd >= 0 || w.err.fd >= 0);
    if (!any_running && !streams_open) return true;
    if (any_running) return false;
    if (!all_exited_at_) all_exited_at_ = now;
    return now - *all_exited_at_ > std::chrono::milliseconds(200);
  }

  std::vector<Worker>& workers_;
  const WorkerGroupOptions& opt_;
  GroupResult& result_;
  const Clock::time_point started_;
  const std::chrono::milliseconds interval_;
  Clock::time_point next_check_;
  std::optional<Clock::time_point> kill_at_;  // set once we asked everyone to stop
  bool killed_ = false;
  std::optional<Clock::time_point> all_exited_at_;
};

}  // namespace

std::string describe_exit(int exit_code, int signal) {
  if (signal)
    return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exited with code " + std::to_string(exit_code);
}

namespace {
// The uncaught accel::Error a worker reported last (its kind and message's first line), or "".
std::string uncaught_error_in(const std::string& tail) {
  const auto at = tail.rfind(kUncaughtTag);
  if (at == std::string::npos) return "";
  const auto from = at + std::strlen(kUncaughtTag);
  return tail.substr(from, tail.find('\n', from) - from);
}
}  // namespace

std::string describe_failure(const WorkerExit& e) {
  std::string what = e.label + " " + describe_exit(e.exit_code, e.signal);
  if (const std::string error = uncaught_error_in(e.stderr_tail); !error.empty())
    what += ": " + error;
  // The communicator's words (communicator.cpp), the last time they were said.
  static const std::string kTag = "ranks not heard from: [";
  const auto at = e.stderr_tail.rfind(kTag);
  if (at == std::string::npos) return what;
  const auto from = at + kTag.size(), to = e.stderr_tail.find(']', from);
  if (to == std::string::npos || to == from) return what;
  const std::string ranks = e.stderr_tail.substr(from, to - from);  // "1" or "1, 3"
  const bool several = ranks.find(',') != std::string::npos;
  return (several ? "ranks " : "rank ") + ranks + " stopped answering (" + e.label +
         " timed out waiting for " + (several ? "them" : "it") + " and " +
         describe_exit(e.exit_code, e.signal) + ")";
}

int GroupResult::exit_code() const {
  if (!first_failure) return (timed_out || stopped) ? 1 : 0;
  const WorkerExit& e = workers[*first_failure];
  return e.signal ? 128 + e.signal : e.exit_code;
}

std::string GroupResult::failure_report() const {
  if (!first_failure) {
    if (timed_out) return "the worker group did not finish within its timeout";
    if (stopped) return "the worker group was stopped";
    return "";
  }
  const WorkerExit& e = workers[*first_failure];
  std::string report = describe_failure(e);
  if (!e.stderr_tail.empty())
    report += "; last lines of " + e.label + "'s stderr:\n" + e.stderr_tail;
  return report;
}

GroupResult run_worker_group(const std::vector<WorkerSpec>& specs, const WorkerGroupOptions& opt) {
  std::vector<Worker> workers = prepare_workers(specs, opt);
  GroupResult result;
  try {
    for (auto& w : workers) start(w);
    GroupMonitor(workers, opt, result).run();
    // Whatever the workers left running (a child holding their output, a daemon that left the
    // process group) is part of the job, and the job is over.
    result.leftovers_killed =
        leftover_processes(process_groups(workers), opt.own_all_children).size();
    end_leftovers(process_groups(workers), opt.own_all_children, opt.grace);
  } catch (...) {
    kill_everything(workers, opt);
    throw;
  }
  for (auto& w : workers) {
    drain(w, w.out, opt);
    drain(w, w.err, opt);
    w.exit.stderr_tail = tail_text(w);
    result.workers.push_back(std::move(w.exit));
  }
  return result;
}

}  // namespace accel::launch
