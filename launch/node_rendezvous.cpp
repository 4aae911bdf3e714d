#include "launch/node_rendezvous.hpp"

#include <thread>
#include <vector>

#include "foundation/error.hpp"

namespace accel::launch {
namespace {

using Clock = std::chrono::steady_clock;

// How long machine 0 keeps the store up for the others to read a final verdict.
constexpr std::chrono::seconds kAckLimit{30};

std::string machines_text(const std::vector<int>& machines) {
  std::string out;
  for (int m : machines) out += (out.empty() ? "" : ", ") + std::to_string(m);
  return (machines.size() == 1 ? "machine " : "machines ") + out;
}

}  // namespace

std::string Failure::encode() const {
  return std::to_string(machine) + "|" + std::to_string(exit_code) + "|" +
         (restartable ? (counts ? "1" : "g") : "0") + "|" + what;
}

Failure Failure::decode(const std::string& text) {
  Failure f;
  const auto a = text.find('|'), b = text.find('|', a + 1), c = text.find('|', b + 1);
  if (a == std::string::npos || b == std::string::npos || c == std::string::npos) {
    f.what = text;
    return f;
  }
  try {
    f.machine = std::stoi(text.substr(0, a));
    f.exit_code = std::stoi(text.substr(a + 1, b - a - 1));
  } catch (const std::exception&) {
  }
  const std::string restart = text.substr(b + 1, c - b - 1);
  f.restartable = restart == "1" || restart == "g";
  f.counts = restart != "g";
  f.what = text.substr(c + 1);
  return f;
}

NodeRendezvous::NodeRendezvous(StorePtr store, StorePtr heartbeat_store,
                               NodeRendezvousOptions options)
    : store_(std::move(store)),
      opt_(std::move(options)),
      heartbeat_(heartbeat_store ? std::move(heartbeat_store) : store_,
                 HeartbeatOptions{opt_.num_machines, opt_.machine_rank, opt_.heartbeat_interval,
                                  opt_.heartbeat_misses, opt_.alive_prefix}) {}

std::string NodeRendezvous::key(int attempt, const std::string& what) const {
  return "launcher/" + std::to_string(attempt) + "/" + what;
}

std::string NodeRendezvous::key(int attempt, const std::string& what, int machine) const {
  return key(attempt, what) + "/" + std::to_string(machine);
}

Failure NodeRendezvous::lost_failure(int machine) const {
  Failure f;
  f.machine = machine;
  f.restartable = opt_.lost_restartable;
  const bool named = std::size_t(machine) < opt_.machine_names.size();
  f.what = "machine " + std::to_string(machine) +
           (named ? " (" + opt_.machine_names[std::size_t(machine)] + ")" : std::string()) +
           "'s launcher stopped responding (no heartbeat for " + heartbeat_.limit_text() + ")";
  return f;
}

std::string NodeRendezvous::store_lost_text() const {
  return opt_.store_name.empty() ? "machine 0 is lost: its rendezvous store" : opt_.store_name;
}

void NodeRendezvous::throw_if_store_lost() const {
  if (auto why = heartbeat_.store_lost())
    throw MachineLost(store_lost_text() + " did not answer for " + heartbeat_.limit_text() + " (" +
                      *why + ")");
}

int NodeRendezvous::interrupted() const {
  return opt_.interrupt_signal ? opt_.interrupt_signal() : 0;
}

void NodeRendezvous::join(int attempt) {
  store_->set(key(attempt, "ready", opt_.machine_rank), "1");
  std::vector<std::string> keys;
  for (int m = 0; m < opt_.num_machines; ++m) keys.push_back(key(attempt, "ready", m));
  const auto deadline = Clock::now() + opt_.join_timeout;
  std::vector<int> others;
  for (int m = 0; m < opt_.num_machines; ++m)
    if (m != opt_.machine_rank) others.push_back(m);
  for (;;) {
    throw_if_store_lost();
    if (store_->check(keys)) return;
    if (interrupted()) throw Interrupted{};
    if (auto m = heartbeat_.lost(others))
      throw TimeoutError(lost_failure(*m).what + " while the machines were joining attempt " +
                         std::to_string(attempt));
    if (Clock::now() > deadline) {
      std::vector<int> missing;
      for (int m = 0; m < opt_.num_machines; ++m)
        if (!store_->check({keys[std::size_t(m)]})) missing.push_back(m);
      throw TimeoutError(machines_text(missing) + " of " + std::to_string(opt_.num_machines) +
                         " did not join within " +
                         std::to_string(opt_.join_timeout.count() / 1000) +
                         " s (each runs `accel launch --machine_rank K` with the same "
                         "--main_process_ip, --main_process_port and --num_machines)");
    }
    std::this_thread::sleep_for(opt_.poll_interval);
  }
}

bool NodeRendezvous::failure_reported(int attempt) {
  throw_if_store_lost();
  std::vector<int> others;
  for (int m = 0; m < opt_.num_machines; ++m)
    if (m != opt_.machine_rank) others.push_back(m);
  try {
    if (auto m = heartbeat_.lost(others)) {
      report_failure(attempt, lost_failure(*m));
      return true;
    }
    return store_->check({key(attempt, "failure")});
  } catch (const Error& e) {
    // Our request may give up before the heartbeat does: the same verdict.
    throw MachineLost(store_lost_text() + " did not answer (" + std::string(e.what()) + ")");
  }
}

Failure NodeRendezvous::report_failure(int attempt, const Failure& failure) {
  return Failure::decode(store_->compare_set(key(attempt, "failure"), "", failure.encode()));
}

Outcome NodeRendezvous::finish(int attempt, int local_exit, int restarts_left) {
  store_->set(key(attempt, "done", opt_.machine_rank), std::to_string(local_exit));
  const std::string failure_key = key(attempt, "failure");
  const std::string decision_key = key(attempt, "decision");
  bool reported_interrupt = false;
  auto read_failure = [&]() -> std::optional<Failure> {
    if (!store_->check({failure_key})) return std::nullopt;
    return Failure::decode(store_->get(failure_key));
  };
  auto note_interrupt = [&] {
    if (reported_interrupt || !interrupted()) return;
    reported_interrupt = true;
    Failure f;
    f.machine = opt_.machine_rank;
    f.restartable = false;
    f.what = "machine " + std::to_string(opt_.machine_rank) + "'s launcher was interrupted";
    f.exit_code = 128 + interrupted();
    report_failure(attempt, f);
  };

  if (opt_.machine_rank != 0) {
    // Machine 0 decides; we wait for its verdict, as long as machine 0 is alive.
    for (;;) {
      throw_if_store_lost();
      if (store_->check({decision_key})) {
        const std::string d = store_->get(decision_key);
        store_->set(key(attempt, "ack", opt_.machine_rank), "1");
        Outcome out;
        out.decision = d == "success"   ? Decision::success
                       : d == "restart" ? Decision::restart
                                        : Decision::stop;
        out.failure = read_failure();
        return out;
      }
      note_interrupt();
      if (heartbeat_.lost({0})) {
        // Machine 0 decides no more. An elastic job whose store lives elsewhere goes on
        // without it (every survivor sees the same loss and the same restarts left).
        const Failure lost = lost_failure(0);
        return {lost.restarts(restarts_left) ? Decision::restart : Decision::stop, lost};
      }
      std::this_thread::sleep_for(opt_.poll_interval);
    }
  }

  // Machine 0: a verdict once some machine failed, or every machine is done.
  Outcome out;
  for (;;) {
    if (auto f = read_failure()) {
      out.failure = f;
      out.decision = f->restarts(restarts_left) ? Decision::restart : Decision::stop;
      break;
    }
    std::vector<int> pending;
    for (int m = 0; m < opt_.num_machines; ++m)
      if (!store_->check({key(attempt, "done", m)})) pending.push_back(m);
    if (pending.empty()) {
      out.decision = Decision::success;
      for (int m = 0; m < opt_.num_machines && !out.failure; ++m) {
        // A machine whose workers failed reports that before it says done; this only
        // guards against a launcher that could not.
        const std::string code = store_->get(key(attempt, "done", m));
        if (code != "0") {
          Failure f;
          f.machine = m;
          f.exit_code = std::atoi(code.c_str());
          f.what = "machine " + std::to_string(m) + "'s workers failed";
          out = {Decision::stop, report_failure(attempt, f)};
        }
      }
      break;
    }
    note_interrupt();
    if (auto m = heartbeat_.lost(pending)) {
      report_failure(attempt, lost_failure(*m));
      continue;  // read back whichever failure counts
    }
    std::this_thread::sleep_for(opt_.poll_interval);
  }
  store_->set(decision_key, out.decision == Decision::success   ? "success"
                            : out.decision == Decision::restart ? "restart"
                                                                : "stop");
  if (out.decision == Decision::restart) return out;  // the next join waits for everyone

  // The store goes away when we exit: give the others a bounded moment to read the verdict.
  std::vector<std::string> acks;
  for (int m = 1; m < opt_.num_machines; ++m) acks.push_back(key(attempt, "ack", m));
  const auto ack_deadline = Clock::now() + kAckLimit;
  std::vector<int> waiting;
  for (int m = 1; m < opt_.num_machines; ++m) waiting.push_back(m);
  while (!acks.empty() && !store_->check(acks) && Clock::now() < ack_deadline) {
    std::vector<int> still;
    for (int m : waiting)
      if (!store_->check({key(attempt, "ack", m)})) still.push_back(m);
    if (heartbeat_.lost(still)) break;  // a lost launcher will never read it
    std::this_thread::sleep_for(opt_.poll_interval);
  }
  return out;
}

}  // namespace accel::launch
