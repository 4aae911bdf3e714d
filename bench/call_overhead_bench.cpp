// call_overhead_bench: what the Communicator front end itself costs per call. Its backend
// moves nothing and runs every operation inline, so the time per `op(...)->wait()` is ours
// alone: argument checks, the sequence number and label, the Work, the inline hand-off. It is
// the part of a small collective that comm_bench's raw baselines do not pay (bench/README,
// "The front end's cost per call"). One process, no peers; prints a table.
//
//   call_overhead_bench [--calls N] [--rounds R] [--world W]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
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
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "call_overhead_bench: %s\nusage: call_overhead_bench [--calls N] "
               "[--rounds R] [--world W]\n",
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

  std::printf(
      "# the front end's time per call, a backend that moves nothing, inline; world %d,"
      " %ld calls a round, %d rounds taking turns\n",
      o.world, o.calls, o.rounds);
  std::printf("# %-16s %10s %10s\n", "op", "median_ns", "min_ns");
  std::vector<std::vector<double>> ns(std::size(rows));
  for (int round = 0; round < o.rounds; ++round) {
    for (std::size_t r = 0; r < std::size(rows); ++r) {
      const auto start = std::chrono::steady_clock::now();
      for (long i = 0; i < o.calls; ++i) rows[r].call(comm, f, p);
      const std::chrono::duration<double, std::nano> took =
          std::chrono::steady_clock::now() - start;
      ns[r].push_back(took.count() / double(o.calls));
    }
  }
  for (std::size_t r = 0; r < std::size(rows); ++r) {
    std::vector<double> v = ns[r];
    std::sort(v.begin(), v.end());
    std::printf("  %-16s %10.1f %10.1f\n", rows[r].name, v[v.size() / 2], v.front());
  }
  return 0;
}
