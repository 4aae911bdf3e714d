// call_overhead_bench: what the Communicator front end itself costs per call. Its backend
// moves nothing and runs every operation inline, so the time per `op(...)->wait()` is ours
// alone: argument checks, the sequence number and label, the Work, the inline hand-off. It is
// the part of a small collective that comm_bench's raw baselines do not pay (bench/README,
// "The front end's cost per call"). One process, no peers; prints a table.
//
// In a tight loop the front end's code and data stay in the core's caches. Between two real
// collectives they do not (the library's own work evicts them): --evict BYTES writes that
// much other memory before each call and times each call on its own, less the clock's own
// cost, to show what a call costs from colder caches.
//
//   call_overhead_bench [--calls N] [--rounds R] [--world W] [--evict BYTES]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backends/comm/communicator.hpp"
#include "tests/support/communicator_double.hpp"

namespace {

using namespace accel;

// The unit tests' double (every operation succeeds and moves nothing), inline at any size.
class NullCommunicator : public test::CommunicatorDouble {
 public:
  NullCommunicator(int rank, int world) : CommunicatorDouble(rank, world, kDefaultCommTimeout) {
    set_inline_max_bytes(std::numeric_limits<std::size_t>::max());
  }
};

struct Options {
  long calls = 1'000'000;
  int rounds = 7;
  int world = 2;
  long evict = 0;  // bytes written between calls (0: a tight loop)
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "call_overhead_bench: %s\nusage: call_overhead_bench [--calls N] "
               "[--rounds R] [--world W] [--evict BYTES]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (i + 1 >= argc) usage((std::string(argv[i]) + " needs a value").c_str());
    const std::string flag = argv[i];
    const long value = std::strtol(argv[++i], nullptr, 10);
    if (value <= 0) usage((flag + " must be a positive integer").c_str());
    if (flag == "--calls")
      o.calls = value;
    else if (flag == "--rounds")
      o.rounds = int(value);
    else if (flag == "--world")
      o.world = int(value);
    else if (flag == "--evict")
      o.evict = value;
    else
      usage(("unknown flag " + flag).c_str());
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  NullCommunicator comm(0, o.world);
  // 4 KiB of f32 as the whole buffer, this rank's part as the other (comm_bench's shapes).
  const std::size_t full_count = 1024 - 1024 % std::size_t(o.world);
  std::vector<float> full(full_count), part(full_count / std::size_t(o.world));
  const Buffer f{full.data(), full.size(), DType::f32, DeviceKind::cpu};
  const Buffer p{part.data(), part.size(), DType::f32, DeviceKind::cpu};

  struct Row {
    const char* name;
    void (*call)(Communicator&, Buffer, Buffer);
  };
  const Row rows[] = {
      {"all_reduce",
       [](Communicator& c, Buffer f, Buffer) { c.all_reduce(f, ReduceOp::sum)->wait(); }},
      {"all_gather", [](Communicator& c, Buffer f, Buffer p) { c.all_gather(p, f)->wait(); }},
      {"reduce_scatter",
       [](Communicator& c, Buffer f, Buffer p) { c.reduce_scatter(f, p, ReduceOp::sum)->wait(); }},
      {"broadcast", [](Communicator& c, Buffer f, Buffer) { c.broadcast(f, 0)->wait(); }},
      {"barrier", [](Communicator& c, Buffer, Buffer) { c.barrier()->wait(); }},
  };

  using Clock = std::chrono::steady_clock;
  const auto nanos = [](Clock::duration d) {
    return std::chrono::duration<double, std::nano>(d).count();
  };
  std::vector<unsigned char> scrub(std::size_t(o.evict));
  unsigned char stamp = 0;
  // Writes every cache line of `scrub`: the front end's lines leave the core's caches.
  const auto evict = [&] {
    ++stamp;
    for (std::size_t i = 0; i < scrub.size(); i += 64) scrub[i] = stamp;
  };
  // The clock ticks in steps of ~10 ns here: the mean of the middle 80% of many timings
  // resolves less than a step, and leaves out interrupts.
  const auto middle_mean = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t cut = v.size() / 10;
    double sum = 0;
    for (std::size_t i = cut; i < v.size() - cut; ++i) sum += v[i];
    return sum / double(v.size() - 2 * cut);
  };
  // One call timed on its own after an eviction, less the clock's own time (an empty interval).
  double clock_ns = 0;
  if (o.evict > 0) {
    std::vector<double> empty(10000);
    for (double& e : empty) {
      const auto t0 = Clock::now();
      e = nanos(Clock::now() - t0);
    }
    clock_ns = middle_mean(std::move(empty));
  }

  if (o.evict > 0)
    std::printf(
        "# the front end's time per call, a backend that moves nothing, inline; world %d,"
        " %ld calls a round, each after writing %ld bytes elsewhere and timed alone (the"
        " clock's own %.1f ns taken off), %d rounds taking turns\n",
        o.world, o.calls, o.evict, clock_ns, o.rounds);
  else
    std::printf(
        "# the front end's time per call, a backend that moves nothing, inline; world %d,"
        " %ld calls a round, %d rounds taking turns\n",
        o.world, o.calls, o.rounds);
  std::printf("# %-16s %10s %10s\n", "op", "median_ns", "min_ns");
  std::vector<std::vector<double>> ns(std::size(rows));
  for (int round = 0; round < o.rounds; ++round) {
    for (std::size_t r = 0; r < std::size(rows); ++r) {
      if (o.evict > 0) {  // each call alone
        std::vector<double> calls;
        calls.reserve(std::size_t(o.calls));
        for (long i = 0; i < o.calls; ++i) {
          evict();
          const auto t0 = Clock::now();
          rows[r].call(comm, f, p);
          calls.push_back(nanos(Clock::now() - t0) - clock_ns);
        }
        ns[r].push_back(middle_mean(std::move(calls)));
        continue;
      }
      const auto start = Clock::now();
      for (long i = 0; i < o.calls; ++i) rows[r].call(comm, f, p);
      ns[r].push_back(nanos(Clock::now() - start) / double(o.calls));
    }
  }
  for (std::size_t r = 0; r < std::size(rows); ++r) {
    std::vector<double> v = ns[r];
    std::sort(v.begin(), v.end());
    std::printf("  %-16s %10.1f %10.1f\n", rows[r].name, v[v.size() / 2], v.front());
  }
  return 0;
}
