// The rounds of an elastic job (launch/elastic_rendezvous.hpp): agents on threads, each with
// its own client of a real TCP store on loopback. A round closes at MAX at once, or at MIN
// after the last call; ranks 0..N-1 go out once each; an agent arriving while a round runs
// waits for the next one and the running agents see it; below MIN the wait ends at the join
// timeout with a message naming the round and the counts.

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "foundation/error.hpp"
#include "foundation/store/tcp_store.hpp"
#include "launch/elastic_rendezvous.hpp"

using namespace accel;
using namespace accel::launch;
using namespace std::chrono_literals;

namespace {

struct Job {
  TcpStoreServer server{"127.0.0.1", 0};

  ElasticRendezvous agent(const std::string& name, int min, int max,
                          std::chrono::milliseconds last_call = 200ms,
                          std::chrono::milliseconds join_timeout = 20s) {
    ElasticRendezvousOptions o;
    o.min_nodes = min;
    o.max_nodes = max;
    o.last_call_timeout = last_call;
    o.join_timeout = join_timeout;
    o.poll_interval = 10ms;
    o.node_name = name;
    return ElasticRendezvous(std::make_shared<TcpStore>("127.0.0.1", server.port()), o);
  }
};

// Each agent's next_round(after) on a thread of its own.
std::vector<ElasticRound> rounds_of(std::vector<ElasticRendezvous>& agents, int after = -1) {
  std::vector<std::future<ElasticRound>> futures;
  for (auto& a : agents)
    futures.push_back(std::async(std::launch::async, [&a, after] { return a.next_round(after); }));
  std::vector<ElasticRound> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

void check_ranks(const std::vector<ElasticRound>& rounds, int round, int nodes) {
  std::set<int> ranks;
  for (const ElasticRound& r : rounds) {
    CHECK(r.round == round);
    CHECK(r.num_nodes == nodes);
    CHECK(int(r.nodes.size()) == nodes);
    ranks.insert(r.node_rank);
  }
  CHECK(int(ranks.size()) == nodes);
  CHECK(*ranks.begin() == 0);
  CHECK(*ranks.rbegin() == nodes - 1);
}

}  // namespace

TEST_CASE("MAX agents close the round at once; each gets its own node rank and the names") {
  Job job;
  std::vector<ElasticRendezvous> agents;
  // A last call far beyond the test: only MAX can close this round.
  for (int i = 0; i < 3; ++i) agents.push_back(job.agent("m" + std::to_string(i), 2, 3, 600s));
  const auto rounds = rounds_of(agents);
  check_ranks(rounds, 0, 3);
  const std::set<std::string> names(rounds[0].nodes.begin(), rounds[0].nodes.end());
  CHECK(names == std::set<std::string>{"m0", "m1", "m2"});
}

TEST_CASE(
    "MIN agents close the round after the last call; a later agent waits, is seen, and "
    "the next round has everyone") {
  Job job;
  std::vector<ElasticRendezvous> first;
  for (int i = 0; i < 2; ++i) first.push_back(job.agent("m" + std::to_string(i), 2, 3));
  const auto round0 = rounds_of(first);
  check_ranks(round0, 0, 2);
  CHECK_FALSE(first[0].newcomer_waiting(round0[0]));

  // A third machine comes while round 0 runs: it must not start a round of its own.
  ElasticRendezvous late = job.agent("m2", 2, 3);
  auto waiting = std::async(std::launch::async, [&late] { return late.next_round(); });
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    seen = first[0].newcomer_waiting(round0[0]) && first[1].newcomer_waiting(round0[1]);
    std::this_thread::sleep_for(10ms);
  }
  CHECK(seen);
  CHECK(waiting.wait_for(500ms) == std::future_status::timeout);  // still waiting for room

  // Round 0's agents leave it (to restart bigger): round 1 has all three.
  auto again = rounds_of(first, 0);
  again.push_back(waiting.get());
  check_ranks(again, 1, 3);
}

TEST_CASE(
    "beyond MAX an agent waits for the next round; the running one is full, so no one "
    "is told to grow") {
  Job job;
  std::vector<ElasticRendezvous> agents;
  // A long last call: all three come at once, and MAX closes the round, not MIN's last call.
  for (int i = 0; i < 3; ++i) agents.push_back(job.agent("m" + std::to_string(i), 1, 2, 5s));
  std::vector<std::future<ElasticRound>> futures;
  for (auto& a : agents)
    futures.push_back(std::async(std::launch::async, [&a] { return a.next_round(); }));
  std::vector<ElasticRound> done;
  std::size_t left = 0;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (done.size() < 2 && std::chrono::steady_clock::now() < until)
    for (std::size_t i = 0; i < futures.size(); ++i)
      if (futures[i].valid() && futures[i].wait_for(10ms) == std::future_status::ready)
        done.push_back(futures[i].get());
  REQUIRE(done.size() == 2);
  for (std::size_t i = 0; i < futures.size(); ++i)
    if (futures[i].valid()) left = i;
  check_ranks(done, 0, 2);
  CHECK_FALSE(agents[0].newcomer_waiting(done[0]));
  // One of round 0's agents fails and leaves; the other and the waiting one make round 1.
  const std::size_t leaving = left == 0 ? 1 : 0;
  std::vector<ElasticRound> round1 = {agents[leaving].next_round(0), futures[left].get()};
  check_ranks(round1, 1, 2);
}

TEST_CASE("fewer than MIN: the join timeout ends the wait, naming the round and the counts") {
  Job job;
  ElasticRendezvous alone = job.agent("m0", 2, 3, 100ms, 500ms);
  std::string error;
  try {
    alone.next_round();
  } catch (const TimeoutError& e) {
    error = e.what();
  }
  CAPTURE(error);
  CHECK(error.find("round 0 has 1 of at least 2 nodes (--nnodes 2:3)") != std::string::npos);
  CHECK(error.find("join timeout") != std::string::npos);
}

TEST_CASE("MIN above MAX is refused") {
  Job job;
  CHECK_THROWS_AS(job.agent("m0", 3, 2), ConfigError);
}
