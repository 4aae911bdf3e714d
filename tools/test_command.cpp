// `accel test [launch options]`: a built-in distributed self-check under the current config.
// It launches itself (`accel launch [options] <accel> test --worker`), and every worker joins
// the process group the config describes and checks the collectives, the agreement of random
// seeds and the data sharding rule. Rank 0 prints one PASS/FAIL line per check (each check's
// verdict is agreed by all ranks); the exit status is 0 only when every check passed.

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "accelerate/process/process_group.hpp"
#include "foundation/error.hpp"
#include "foundation/reduce.hpp"
#include "tools/commands.hpp"

#if ACCEL_TOOLS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace accel::tools {
namespace {

// A host vector and, for a CUDA communicator, its device mirror: the checks fill and read the
// host side; the collective runs on whichever the communicator wants.
template <typename T>
class Staged {
 public:
  Staged(const Communicator& comm, std::size_t count, T fill = T{})
      : host_(count, fill), cuda_(comm.device() == DeviceKind::cuda) {
#if ACCEL_TOOLS_HAVE_CUDA
    if (cuda_ && cudaMalloc(&device_, std::max<std::size_t>(count, 1) * sizeof(T)) != cudaSuccess)
      throw Error("accel test: cudaMalloc failed");
#else
    if (cuda_)
      throw Error(
          "accel test: this accel was built without CUDA but the communicator wants CUDA buffers");
#endif
  }
  ~Staged() {
#if ACCEL_TOOLS_HAVE_CUDA
    if (device_) cudaFree(device_);
#endif
  }
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;

  std::vector<T>& host() { return host_; }
  Buffer view() {
    Buffer b = buffer_of(std::span(host_));
    if (cuda_) {
      b.data = device_;
      b.device = DeviceKind::cuda;
    }
    return b;
  }
  void upload() { copy(true); }
  void download() { copy(false); }

 private:
  void copy([[maybe_unused]] bool to_device) {
#if ACCEL_TOOLS_HAVE_CUDA
    if (!cuda_) return;
    const auto rc =
        to_device
            ? cudaMemcpy(device_, host_.data(), host_.size() * sizeof(T), cudaMemcpyHostToDevice)
            : cudaMemcpy(host_.data(), device_, host_.size() * sizeof(T), cudaMemcpyDeviceToHost);
    if (rc != cudaSuccess)
      throw Error(std::string("accel test: cudaMemcpy: ") + cudaGetErrorString(rc));
#endif
  }

  std::vector<T> host_;
  bool cuda_ = false;
  void* device_ = nullptr;
};

// Each check returns "" when it passed, else what was wrong on this rank.
using Check = std::function<std::string(Communicator&)>;

std::string mismatch(const char* what, std::size_t i, double got, double want) {
  return std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(got) +
         ", expected " + std::to_string(want);
}

std::string check_all_reduce(Communicator& comm) {
  const int w = comm.world_size(), r = comm.rank();
  Staged<float> data(comm, 4099);
  for (std::size_t i = 0; i < data.host().size(); ++i)
    data.host()[i] = float((r + 1) * (i % 97 + 1));
  data.upload();
  comm.all_reduce(data.view(), ReduceOp::sum)->wait();
  data.download();
  for (std::size_t i = 0; i < data.host().size(); ++i) {
    const double want = double(w) * (w + 1) / 2 * double(i % 97 + 1);
    if (data.host()[i] != float(want)) return mismatch("sum", i, data.host()[i], want);
  }
  Staged<float> top(comm, 3, float(r));
  top.upload();
  comm.all_reduce(top.view(), ReduceOp::max)->wait();
  top.download();
  if (top.host()[0] != float(w - 1)) return mismatch("max", 0, top.host()[0], w - 1);
  return "";
}

std::string check_broadcast(Communicator& comm) {
  const int root = comm.world_size() - 1;
  Staged<double> data(comm, 1001, 0.0);
  if (comm.rank() == root)
    for (std::size_t i = 0; i < data.host().size(); ++i) data.host()[i] = 42.0 + double(i);
  data.upload();
  comm.broadcast(data.view(), root)->wait();
  data.download();
  for (std::size_t i = 0; i < data.host().size(); ++i)
    if (data.host()[i] != 42.0 + double(i))
      return mismatch("broadcast", i, data.host()[i], 42.0 + double(i));
  return "";
}

// A total that does not divide by the world size, so uneven shards are covered.
std::size_t uneven_total(int world) { return std::size_t(1000 * world + world / 2 + 1); }

std::string check_all_gather(Communicator& comm) {
  const int w = comm.world_size();
  const std::size_t total = uneven_total(w);
  const Shard mine = shard_of(total, w, comm.rank());
  Staged<double> in(comm, mine.count);
  for (std::size_t i = 0; i < mine.count; ++i) in.host()[i] = comm.rank() * 1e6 + double(i);
  Staged<double> out(comm, total, -1.0);
  in.upload();
  out.upload();
  comm.all_gather(in.view(), out.view())->wait();
  out.download();
  for (int r = 0; r < w; ++r) {
    const Shard s = shard_of(total, w, r);
    for (std::size_t i = 0; i < s.count; ++i)
      if (out.host()[s.offset + i] != r * 1e6 + double(i))
        return mismatch("all_gather", s.offset + i, out.host()[s.offset + i], r * 1e6 + double(i));
  }
  return "";
}

std::string check_reduce_scatter(Communicator& comm) {
  const int w = comm.world_size();
  const std::size_t total = uneven_total(w);
  const Shard mine = shard_of(total, w, comm.rank());
  Staged<double> in(comm, total);
  for (std::size_t j = 0; j < total; ++j) in.host()[j] = double(comm.rank() + 1) + double(j);
  Staged<double> out(comm, mine.count, -1.0);
  in.upload();
  out.upload();
  comm.reduce_scatter(in.view(), out.view(), ReduceOp::sum)->wait();
  out.download();
  for (std::size_t i = 0; i < mine.count; ++i) {
    const double j = double(mine.offset + i);
    const double want = double(w) * (w + 1) / 2 + double(w) * j;
    if (out.host()[i] != want) return mismatch("reduce_scatter", i, out.host()[i], want);
  }
  return "";
}

// Rank 0 draws a seed and broadcasts it; every rank seeds its generator with it; the first
// numbers drawn must then be the same everywhere (as `set_seed` promises training code).
std::string check_seed_agreement(Communicator& comm) {
  Staged<std::int64_t> seed(comm, 1, 0);
  if (comm.rank() == 0) seed.host()[0] = std::int64_t(std::random_device{}() & 0x7fffffff);
  seed.upload();
  comm.broadcast(seed.view(), 0)->wait();
  seed.download();
  std::mt19937_64 gen(std::uint64_t(seed.host()[0]));
  constexpr std::size_t kDraws = 4;
  const int w = comm.world_size();
  Staged<std::int64_t> draws(comm, kDraws * std::size_t(w), 0);
  Staged<std::int64_t> mine(comm, kDraws);
  for (auto& d : mine.host()) d = std::int64_t(gen() >> 1);
  mine.upload();
  draws.upload();
  comm.all_gather(mine.view(), draws.view())->wait();
  draws.download();
  for (int r = 1; r < w; ++r)
    for (std::size_t i = 0; i < kDraws; ++i)
      if (draws.host()[std::size_t(r) * kDraws + i] != draws.host()[i])
        return "rank " + std::to_string(r) + " drew a different number " + std::to_string(i) +
               " from seed " + std::to_string(seed.host()[0]);
  return "";
}

// Every index of a dataset must be owned by exactly one rank (shard_of, the rule the data
// loader and ZeRO use): the ranks' ownership counts, summed, are 1 everywhere.
std::string check_sharding(Communicator& comm) {
  const int w = comm.world_size();
  for (std::size_t total :
       {std::size_t(0), std::size_t(1), std::size_t(w - 1 > 0 ? w - 1 : 1), uneven_total(w)}) {
    Staged<std::int32_t> owned(comm, std::max<std::size_t>(total, 1), 0);
    const Shard s = shard_of(total, w, comm.rank());
    for (std::size_t i = 0; i < s.count; ++i) owned.host()[s.offset + i] = 1;
    owned.upload();
    comm.all_reduce(owned.view(), ReduceOp::sum)->wait();
    owned.download();
    for (std::size_t i = 0; i < total; ++i)
      if (owned.host()[i] != 1)
        return "index " + std::to_string(i) + " of " + std::to_string(total) + " is owned by " +
               std::to_string(owned.host()[i]) + " ranks";
  }
  return "";
}

int run_worker() {
  ProcessGroupOptions options;
  // A self-check that hangs is worse than one that fails: a minute unless the user says.
  if (std::getenv("ACCEL_COMM_TIMEOUT") == nullptr) options.timeout = std::chrono::seconds(60);
  auto group = init_process_group(options);
  Communicator& comm = group->comm();
  const std::vector<std::pair<const char*, Check>> checks = {
      {"all_reduce (sum, max)", check_all_reduce},
      {"broadcast", check_broadcast},
      {"all_gather (uneven shards)", check_all_gather},
      {"reduce_scatter (uneven shards)", check_reduce_scatter},
      {"random seed agreement", check_seed_agreement},
      {"data sharding covers every index once", check_sharding},
  };
  if (comm.rank() == 0)
    std::printf("accel test: %d process(es), communicator %s\n", comm.world_size(),
                std::string(comm.backend_name()).c_str());
  int failed = 0;
  for (const auto& [name, check] : checks) {
    std::string problem;
    try {
      problem = check(comm);
    } catch (const std::exception& e) {
      // A communicator that failed refuses every later operation: report and stop here.
      std::fprintf(stderr, "accel test: %s: %s\n", name, e.what());
      if (comm.rank() == 0) std::printf("FAIL  %s\n", name);
      return 1;
    }
    if (!problem.empty()) std::fprintf(stderr, "accel test: %s: %s\n", name, problem.c_str());
    // Every rank's verdict counts: the check passed only if it passed everywhere.
    Staged<std::int32_t> bad(comm, 1, problem.empty() ? 0 : 1);
    bad.upload();
    comm.all_reduce(bad.view(), ReduceOp::sum)->wait();
    bad.download();
    if (comm.rank() == 0)
      std::printf(
          "%s  %s%s\n", bad.host()[0] == 0 ? "PASS" : "FAIL", name,
          bad.host()[0] == 0 ? "" : (" (" + std::to_string(bad.host()[0]) + " rank(s))").c_str());
    failed += bad.host()[0] != 0;
  }
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

}  // namespace

int run_test_command(int argc, char** argv, const char* self) {
  if (argc >= 1 && std::strcmp(argv[0], "--worker") == 0) return run_worker();
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::puts(
          "usage: accel test [accel launch options]\n"
          "Runs a distributed self-check (collectives, seed agreement, data sharding) under\n"
          "the config in effect, as `accel launch [options] accel test --worker`.");
      return 0;
    }
  // This process becomes the launcher of the check: same flags, same config, same output.
  std::vector<std::string> args(argv, argv + argc);
  args.insert(args.end(), {self, "test", "--worker"});
  std::vector<char*> raw;
  for (auto& a : args) raw.push_back(a.data());
  const int status = run_launch_command(int(raw.size()), raw.data());
  std::fprintf(stderr, "accel test: %s\n", status == 0 ? "all checks passed" : "FAILED");
  return status == 0 ? 0 : 1;
}

}  // namespace accel::tools
