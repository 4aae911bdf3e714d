#include "launch/elastic_rendezvous.hpp"

#include <algorithm>
#include <optional>
#include <thread>

#include "foundation/error.hpp"

namespace accel::launch {
namespace {

using Clock = std::chrono::steady_clock;

// How long the store's host waits for the others to read why the rendezvous gave up.
constexpr std::chrono::seconds kFarewell{5};

std::string seconds_text(std::chrono::milliseconds d) {
  return std::to_string(d.count() / 1000) + " s";
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(StorePtr store, ElasticRendezvousOptions options)
    : store_(std::move(store)), opt_(std::move(options)) {
  if (opt_.min_nodes < 1 || opt_.max_nodes < opt_.min_nodes)
    throw ConfigError("elastic rendezvous: --nnodes " + std::to_string(opt_.min_nodes) + ":" +
                      std::to_string(opt_.max_nodes) + " needs 1 <= MIN <= MAX");
  if (opt_.hosts_store) store_->set("elastic/host", opt_.node_name);
}

std::string ElasticRendezvous::key(int round, const std::string& what) const {
  return "elastic/" + std::to_string(round) + "/" + what;
}

int ElasticRendezvous::open_round() {
  return std::stoi(store_->compare_set("elastic/open", "", "0"));
}

int ElasticRendezvous::close(int round, int count) {
  const std::string closed = store_->compare_set(key(round, "closed"), "", std::to_string(count));
  // Whoever closed it, new agents now go to the next round (idempotent).
  store_->compare_set("elastic/open", std::to_string(round), std::to_string(round + 1));
  return std::stoi(closed);
}

ElasticRound ElasticRendezvous::next_round(int after) {
  const auto deadline = Clock::now() + opt_.join_timeout;
  if (after >= 0) store_->set(key(after, "ended"), "1");
  int round = after >= 0 ? std::max(after + 1, open_round()) : open_round();
  for (;; ++round) {
    const int order = int(store_->add(key(round, "joined"), 1));  // 1-based
    store_->set(key(round, "node/" + std::to_string(order - 1)), opt_.node_name);
    std::optional<Clock::time_point> min_since;  // when MIN agents were first seen
    int closed = 0;
    for (;;) {
      if (store_->check({key(round, "closed")})) {
        closed = std::stoi(store_->get(key(round, "closed"), opt_.join_timeout));
        break;
      }
      if (store_->check({key(round, "timed_out")})) give_up(round, "");
      const int joined = int(store_->add(key(round, "joined"), 0));
      // While the round before runs, its agents may still come: this one waits for them.
      const bool previous_over = round == 0 || store_->check({key(round - 1, "ended")});
      if (previous_over && joined >= opt_.max_nodes) {
        closed = close(round, opt_.max_nodes);
        break;
      }
      if (previous_over && joined >= opt_.min_nodes) {
        if (!min_since) min_since = Clock::now();
        if (Clock::now() - *min_since >= opt_.last_call_timeout) {
          closed = close(round, joined);
          break;
        }
      } else {
        min_since.reset();
      }
      if (opt_.interrupted && opt_.interrupted()) throw Interrupted{};
      if (Clock::now() > deadline)
        give_up(round, "elastic rendezvous: round " + std::to_string(round) + " has " +
                           std::to_string(joined) + " of at least " +
                           std::to_string(opt_.min_nodes) + " nodes (--nnodes " +
                           std::to_string(opt_.min_nodes) + ":" + std::to_string(opt_.max_nodes) +
                           ") after the join timeout of " + seconds_text(opt_.join_timeout) +
                           (previous_over && joined >= opt_.min_nodes
                                ? "; its last call (" + seconds_text(opt_.last_call_timeout) +
                                      ") is longer than the join timeout"
                                : std::string()) +
                           (previous_over
                                ? std::string()
                                : "; round " + std::to_string(round - 1) +
                                      " is still running at its full size and did not make room"));
      std::this_thread::sleep_for(opt_.poll_interval);
    }
    if (order > closed) continue;  // came too late (or beyond MAX): wait in the next round
    ElasticRound out;
    out.round = round;
    out.num_nodes = closed;
    for (int i = 0; i < closed; ++i)
      out.nodes.push_back(store_->get(key(round, "node/" + std::to_string(i)), opt_.join_timeout));
    // Join order, the store's host first.
    const std::string host =
        store_->check({"elastic/host"}) ? store_->get("elastic/host", opt_.join_timeout) : "";
    const auto at_host = std::find(out.nodes.begin(), out.nodes.end(), host);
    if (!host.empty() && at_host != out.nodes.end())
      std::rotate(out.nodes.begin(), at_host, at_host + 1);
    out.node_rank =
        int(std::find(out.nodes.begin(), out.nodes.end(), opt_.node_name) - out.nodes.begin());
    return out;
  }
}

void ElasticRendezvous::give_up(int round, const std::string& why) {
  // The first agent's reason is everyone's; the store's host, whose exit takes the store
  // away, waits a moment for the others in the round to read it.
  const std::string reason = store_->compare_set(key(round, "timed_out"), "", why);
  const std::int64_t seen = store_->add(key(round, "timed_out_seen"), 1);
  if (opt_.hosts_store) {
    const auto until = Clock::now() + kFarewell;
    std::int64_t now_seen = seen;
    while (now_seen < store_->add(key(round, "joined"), 0) && Clock::now() < until) {
      std::this_thread::sleep_for(opt_.poll_interval);
      now_seen = store_->add(key(round, "timed_out_seen"), 0);
    }
  }
  throw TimeoutError(reason);
}

bool ElasticRendezvous::newcomer_waiting(const ElasticRound& round) {
  return round.num_nodes < opt_.max_nodes && store_->add(key(round.round + 1, "joined"), 0) > 0;
}

}  // namespace accel::launch
