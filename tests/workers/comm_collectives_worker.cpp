// One rank of the collective test matrix: every collective x dtype x reduce op x count,
// checked element by element against a reference this rank computes for the whole world.
// Started as a real process by comm_collectives_test (or mpirun); prints each mismatch and
// exits 1 when there is any.
//
// Values are small integers, so sums over up to 4 ranks are exact in every dtype (f16 and
// bf16 included) and ring order cannot change a result; avg's division is rounded the way
// the communicator rounds it.

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "accelerate/process/process_group.hpp"
#include "backends/comm/registry.hpp"
#if ACCEL_TEST_HIERARCHICAL
#include "backends/comm/shm/hierarchical_communicator.hpp"
#endif
#include "foundation/error.hpp"
#include "foundation/host_cores.hpp"
#include "tests/support/fake_hosts.hpp"
#include "tests/support/staging.hpp"
#include "tests/support/typed_values.hpp"
#include "tests/support/worker.hpp"

#if ACCEL_TEST_MPI
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif

using namespace accel;
using accel::test::get_value;
using accel::test::OwnedBuffer;
using accel::test::set_value;
using accel::test::Staged;

namespace {

int g_checks = 0, g_failures = 0;

void expect_near(const std::string& what, const Buffer& got, std::size_t i, double want,
                 double tolerance) {
  ++g_checks;
  const double v = get_value(got, i);
  if (v == want || std::abs(v - want) <= tolerance * std::max(1.0, std::abs(want))) return;
  if (++g_failures <= 20)
    std::printf("FAIL %s: element %zu is %.9g, expected %.9g\n", what.c_str(), i, v, want);
}

void expect_equal(const std::string& what, const Buffer& got, std::size_t i, double want) {
  expect_near(what, got, i, want, 0.0);
}

// NCCL's native average scales each input by 1/n before summing, so it may round
// differently from sum-then-divide: allow a few units in the last place of the dtype.
double avg_tolerance(const Communicator& comm, DType dtype) {
  if (comm.backend_name() != "nccl" || comm.world_size() == 1) return 0.0;
  switch (dtype) {
    case DType::f16:
      return 4e-3;
    case DType::bf16:
      return 3e-2;
    case DType::f32:
      return 1e-6;
    case DType::f64:
      return 1e-14;
    default:
      return 1.0;  // integer average: truncation may differ by one
  }
}

// The value rank r contributes at element i: an integer in [-8, 8].
double input_value(int r, std::size_t i) { return double(int((r * 31 + i * 7) % 17) - 8); }

// What the communicator's avg produces from an exact sum: division in the dtype's arithmetic.
double average_as_dtype(double sum, int world, DType dtype) {
  OwnedBuffer tmp(dtype, 1);
  set_value(tmp.view, 0, sum);
  divide_elements(tmp.view.data, 1, dtype, world);
  return get_value(tmp.view, 0);
}

double reference_reduce(ReduceOp op, int world, std::size_t i, DType dtype) {
  double acc = input_value(0, i);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(r, i);
    if (op == ReduceOp::min)
      acc = std::min(acc, v);
    else if (op == ReduceOp::max)
      acc = std::max(acc, v);
    else
      acc += v;
  }
  return op == ReduceOp::avg ? average_as_dtype(acc, world, dtype) : acc;
}

std::string label(const char* op_name, DType dtype, std::size_t count, const std::string& extra) {
  return std::string(op_name) + "(" + std::string(dtype_name(dtype)) + ", count " +
         std::to_string(count) + (extra.empty() ? "" : ", " + extra) + ")";
}

void check_all_reduce(Communicator& comm, DType dtype, ReduceOp op, std::size_t count) {
  OwnedBuffer buf(dtype, count);
  for (std::size_t i = 0; i < count; ++i) set_value(buf.view, i, input_value(comm.rank(), i));
  Staged staged(comm, buf);
  staged.upload();
  comm.all_reduce(staged.view(), op)->wait();
  staged.download();
  const std::string what = label("all_reduce", dtype, count, std::string(reduce_op_name(op)));
  const double tolerance = op == ReduceOp::avg ? avg_tolerance(comm, dtype) : 0.0;
  for (std::size_t i = 0; i < count; ++i)
    expect_near(what, buf.view, i, reference_reduce(op, comm.world_size(), i, dtype), tolerance);
}

void check_broadcast(Communicator& comm, DType dtype, int root, std::size_t count) {
  OwnedBuffer buf(dtype, count);
  for (std::size_t i = 0; i < count; ++i) set_value(buf.view, i, input_value(comm.rank(), i));
  Staged staged(comm, buf);
  staged.upload();
  comm.broadcast(staged.view(), root)->wait();
  staged.download();
  const std::string what = label("broadcast", dtype, count, "root " + std::to_string(root));
  for (std::size_t i = 0; i < count; ++i) expect_equal(what, buf.view, i, input_value(root, i));
}

void check_all_gather(Communicator& comm, DType dtype, std::size_t total) {
  const Shard mine = shard_of(total, comm.world_size(), comm.rank());
  OwnedBuffer in(dtype, mine.count), out(dtype, total);
  // Element j of the result belongs to the rank whose shard holds it.
  for (std::size_t k = 0; k < mine.count; ++k)
    set_value(in.view, k, input_value(comm.rank(), mine.offset + k));
  for (std::size_t j = 0; j < total; ++j) set_value(out.view, j, -99);
  Staged staged_in(comm, in), staged_out(comm, out);
  staged_in.upload();
  staged_out.upload();
  comm.all_gather(staged_in.view(), staged_out.view())->wait();
  staged_out.download();
  const std::string what = label("all_gather", dtype, total, "");
  for (int r = 0; r < comm.world_size(); ++r) {
    const Shard s = shard_of(total, comm.world_size(), r);
    for (std::size_t k = 0; k < s.count; ++k)
      expect_equal(what, out.view, s.offset + k, input_value(r, s.offset + k));
  }
}

void check_reduce_scatter(Communicator& comm, DType dtype, ReduceOp op, std::size_t total) {
  const Shard mine = shard_of(total, comm.world_size(), comm.rank());
  OwnedBuffer in(dtype, total), out(dtype, mine.count);
  for (std::size_t i = 0; i < total; ++i) set_value(in.view, i, input_value(comm.rank(), i));
  Staged staged_in(comm, in), staged_out(comm, out);
  staged_in.upload();
  comm.reduce_scatter(staged_in.view(), staged_out.view(), op)->wait();
  staged_in.download();
  staged_out.download();
  const std::string what = label("reduce_scatter", dtype, total, std::string(reduce_op_name(op)));
  const double tolerance = op == ReduceOp::avg ? avg_tolerance(comm, dtype) : 0.0;
  for (std::size_t k = 0; k < mine.count; ++k)
    expect_near(what, out.view, k, reference_reduce(op, comm.world_size(), mine.offset + k, dtype),
                tolerance);
  // The input is left as it was.
  for (std::size_t i = 0; i < total; ++i)
    expect_equal(what + " input", in.view, i, input_value(comm.rank(), i));
}

// Where an overlap check puts this rank's part instead of at its own offset: shifted by half
// of it over a neighbour's part, after its own where there is room, before it otherwise. Every
// rank or none runs such a check (a rank alone in a collective would wait for the others): from
// 2 ranks and 8 elements per rank up every rank has room (checked for worlds 2-16 up to 20000
// elements); at world 1 the part is the whole buffer, so only in place is possible.
std::optional<std::size_t> shifted_offset(const Communicator& comm, std::size_t total) {
  if (comm.world_size() < 2 || total < 8 * std::size_t(comm.world_size())) return std::nullopt;
  const Shard mine = shard_of(total, comm.world_size(), comm.rank());
  const std::size_t shift = mine.count / 2 + 1;
  return mine.offset + shift + mine.count <= total ? mine.offset + shift : mine.offset - shift;
}

// The output inside the input but not as this rank's part (shifted_offset). The CPU
// communicators take any output, NCCL only in place; the result is as if it were separate.
void check_reduce_scatter_overlapping(Communicator& comm, DType dtype, std::size_t total) {
  const std::optional<std::size_t> shifted = shifted_offset(comm, total);
  if (!shifted) return;
  const std::size_t at = *shifted;
  const Shard mine = shard_of(total, comm.world_size(), comm.rank());
  OwnedBuffer in(dtype, total);
  for (std::size_t i = 0; i < total; ++i) set_value(in.view, i, input_value(comm.rank(), i));
  Staged staged_in(comm, in);
  staged_in.upload();
  comm.reduce_scatter(staged_in.view(), staged_in.view().slice(at, mine.count), ReduceOp::sum)
      ->wait();
  staged_in.download();
  const std::string what = label("reduce_scatter", dtype, total, "output elsewhere in the input");
  for (std::size_t k = 0; k < mine.count; ++k)
    expect_near(what, in.view, at + k,
                reference_reduce(ReduceOp::sum, comm.world_size(), mine.offset + k, dtype), 0.0);
}

// Parts the caller chooses (ZeRO's buckets and units): rank r's part grows with r, rank 0's is
// often empty.
std::vector<Shard> uneven_parts(std::size_t total, std::size_t world) {
  const auto boundary = [&](std::size_t r) {
    return total * (r * (r + 1) / 2) / (world * (world + 1) / 2);
  };
  std::vector<Shard> parts;
  for (std::size_t r = 0; r < world; ++r)
    parts.push_back({boundary(r), boundary(r + 1) - boundary(r)});
  return parts;
}

std::vector<std::size_t> counts_of(const std::vector<Shard>& parts) {
  std::vector<std::size_t> counts;
  for (const Shard& s : parts) counts.push_back(s.count);
  return counts;
}

// Out of place, and in place (the output is this rank's part of the input).
void check_reduce_scatter_parts(Communicator& comm, DType dtype, ReduceOp op, std::size_t total,
                                bool in_place) {
  const auto parts = uneven_parts(total, std::size_t(comm.world_size()));
  const std::vector<std::size_t> counts = counts_of(parts);
  const Shard mine = parts[std::size_t(comm.rank())];
  OwnedBuffer in(dtype, total), out(dtype, mine.count);
  for (std::size_t i = 0; i < total; ++i) set_value(in.view, i, input_value(comm.rank(), i));
  Staged staged_in(comm, in), staged_out(comm, out);
  staged_in.upload();
  const Buffer output =
      in_place ? staged_in.view().slice(mine.offset, mine.count) : staged_out.view();
  comm.reduce_scatter(staged_in.view(), output, op, counts)->wait();
  staged_in.download();
  staged_out.download();
  const Buffer result = in_place ? in.view.slice(mine.offset, mine.count) : out.view;
  const std::string what = label("reduce_scatter with parts", dtype, total,
                                 std::string(reduce_op_name(op)) + (in_place ? ", in place" : ""));
  const double tolerance = op == ReduceOp::avg ? avg_tolerance(comm, dtype) : 0.0;
  for (std::size_t k = 0; k < mine.count; ++k)
    expect_near(what, result, k, reference_reduce(op, comm.world_size(), mine.offset + k, dtype),
                tolerance);
}

// In place: the input is this rank's part of the output (ZeRO gathers its parameters so).
void check_all_gather_in_place(Communicator& comm, DType dtype, std::size_t total) {
  const Shard mine = shard_of(total, comm.world_size(), comm.rank());
  OwnedBuffer out(dtype, total);
  for (std::size_t j = 0; j < total; ++j)
    set_value(out.view, j,
              mine.offset <= j && j < mine.offset + mine.count ? input_value(comm.rank(), j) : -99);
  Staged staged_out(comm, out);
  staged_out.upload();
  comm.all_gather(staged_out.view().slice(mine.offset, mine.count), staged_out.view())->wait();
  staged_out.download();
  const std::string what = label("all_gather", dtype, total, "in place");
  for (int r = 0; r < comm.world_size(); ++r) {
    const Shard s = shard_of(total, comm.world_size(), r);
    for (std::size_t k = 0; k < s.count; ++k)
      expect_equal(what, out.view, s.offset + k, input_value(r, s.offset + k));
  }
}

// The input inside the output but not as this rank's part (shifted_offset). The CPU
// communicators take any input, NCCL only in place; the result is as if it were separate.
void check_all_gather_overlapping(Communicator& comm, DType dtype, std::size_t total) {
  const std::optional<std::size_t> shifted = shifted_offset(comm, total);
  if (!shifted) return;
  const std::size_t at = *shifted;
  const Shard mine = shard_of(total, comm.world_size(), comm.rank());
  OwnedBuffer out(dtype, total);
  for (std::size_t j = 0; j < total; ++j)
    set_value(
        out.view, j,
        at <= j && j < at + mine.count ? input_value(comm.rank(), mine.offset + j - at) : -99);
  Staged staged_out(comm, out);
  staged_out.upload();
  comm.all_gather(staged_out.view().slice(at, mine.count), staged_out.view())->wait();
  staged_out.download();
  const std::string what = label("all_gather", dtype, total, "input elsewhere in the output");
  for (int r = 0; r < comm.world_size(); ++r) {
    const Shard s = shard_of(total, comm.world_size(), r);
    for (std::size_t k = 0; k < s.count; ++k)
      expect_equal(what, out.view, s.offset + k, input_value(r, s.offset + k));
  }
}

// The same uneven parts gathered (ZeRO-3 gathers a unit so): out of place, and in place (the
// input is this rank's part of the output).
void check_all_gather_parts(Communicator& comm, DType dtype, std::size_t total, bool in_place) {
  const auto parts = uneven_parts(total, std::size_t(comm.world_size()));
  const Shard mine = parts[std::size_t(comm.rank())];
  OwnedBuffer in(dtype, mine.count), out(dtype, total);
  for (std::size_t k = 0; k < mine.count; ++k)
    set_value(in.view, k, input_value(comm.rank(), mine.offset + k));
  for (std::size_t j = 0; j < total; ++j)
    set_value(out.view, j,
              in_place && mine.offset <= j && j < mine.offset + mine.count
                  ? input_value(comm.rank(), j)
                  : -99);
  Staged staged_in(comm, in), staged_out(comm, out);
  staged_in.upload();
  staged_out.upload();
  const Buffer input =
      in_place ? staged_out.view().slice(mine.offset, mine.count) : staged_in.view();
  comm.all_gather(input, staged_out.view(), counts_of(parts))->wait();
  staged_out.download();
  const std::string what = label("all_gather with parts", dtype, total, in_place ? "in place" : "");
  for (int r = 0; r < comm.world_size(); ++r) {
    const Shard s = parts[std::size_t(r)];
    for (std::size_t k = 0; k < s.count; ++k)
      expect_equal(what, out.view, s.offset + k, input_value(r, s.offset + k));
  }
}

// Ring exchange: every rank sends to its right neighbour and receives from its left.
void check_send_recv(Communicator& comm, std::size_t count) {
  if (comm.world_size() == 1) return;
  const int right = (comm.rank() + 1) % comm.world_size();
  const int left = (comm.rank() + comm.world_size() - 1) % comm.world_size();
  OwnedBuffer out(DType::f32, count), in(DType::f32, count);
  for (std::size_t i = 0; i < count; ++i) set_value(out.view, i, input_value(comm.rank(), i));
  Staged staged_out(comm, out), staged_in(comm, in);
  staged_out.upload();
  // Operations run in call order, so even ranks send first and odd ranks receive first.
  if (comm.rank() % 2 == 0) {
    comm.send(staged_out.view(), right, 7)->wait();
    comm.recv(staged_in.view(), left, 7)->wait();
  } else {
    comm.recv(staged_in.view(), left, 7)->wait();
    comm.send(staged_out.view(), right, 7)->wait();
  }
  staged_in.download();
  const std::string what = label("send/recv", DType::f32, count, "");
  for (std::size_t i = 0; i < count; ++i) expect_equal(what, in.view, i, input_value(left, i));
}

// Several operations in flight at once complete in order with the right results. The first
// is large enough to go to the worker thread even where small ones may run inline on the
// caller's (shm): those must then queue behind it, not overtake it.
void check_async(Communicator& comm) {
  std::vector<OwnedBuffer> bufs;
  for (int k = 0; k < 8; ++k) {
    bufs.emplace_back(DType::f32, k == 0 ? 300000 : 1000 + k);
    for (std::size_t i = 0; i < bufs.back().view.count; ++i)
      set_value(bufs.back().view, i, input_value(comm.rank(), i));
  }
  std::vector<std::unique_ptr<Staged>> staged;
  for (auto& b : bufs) {
    staged.push_back(std::make_unique<Staged>(comm, b));
    staged.back()->upload();
  }
  std::vector<WorkPtr> works;
  for (auto& s : staged) works.push_back(comm.all_reduce(s->view(), ReduceOp::sum));
  for (auto& w : works) w->wait();
  for (auto& s : staged) s->download();
  for (auto& b : bufs)
    for (std::size_t i = 0; i < b.view.count; ++i)
      expect_equal("async all_reduce", b.view, i,
                   reference_reduce(ReduceOp::sum, comm.world_size(), i, DType::f32));
}

// --kill_rank R: after a first all_reduce together, every rank starts a large all_reduce and
// rank R kills itself (SIGKILL) while it is in flight. The others must fail naming rank R;
// each prints "survivor error: ..." and exits 3.
#if ACCEL_TEST_HIERARCHICAL
// Over hosts of equal size, a reduce_scatter and an all_gather of N elements put on the links
// between hosts what a bandwidth-optimal algorithm must: every host exchanges (H-1)/H of the
// buffer, spread over its L ranks, so (H-1) x N/(H x L) elements per rank. (A reduce_scatter
// done as the leaders' all-reduce puts 2(H-1)/H x N on each leader.)
void check_hierarchical_traffic(Communicator& comm, int hosts) {
  auto* hierarchical = dynamic_cast<HierarchicalCommunicator*>(&comm);
  const int world = comm.world_size();
  if (!hierarchical || hosts < 2 || world % hosts != 0) return;
  if (!hierarchical->has_rails()) {
    std::printf("rank %d: no rails\n", comm.rank());
    return;
  }
  const std::size_t total = std::size_t(world) * 1000;
  const std::uint64_t want = std::uint64_t(hosts - 1) * (total / std::size_t(world)) * 4;
  std::vector<float> full(total, 1.0f), part(total / std::size_t(world));
  const auto measure = [&](const char* what, const std::function<void()>& run) {
    const std::uint64_t before = hierarchical->between_hosts_bytes();
    run();
    const std::uint64_t moved = hierarchical->between_hosts_bytes() - before;
    ++g_checks;
    if (moved != want) {
      ++g_failures;
      std::printf("FAIL %s of %zu floats: rank %d put %llu bytes between hosts, expected %llu\n",
                  what, total, comm.rank(), (unsigned long long)moved, (unsigned long long)want);
    }
  };
  measure("reduce_scatter", [&] {
    comm.reduce_scatter(buffer_of(std::span(full)), buffer_of(std::span(part)), ReduceOp::sum)
        ->wait();
  });
  measure("all_gather",
          [&] { comm.all_gather(buffer_of(std::span(part)), buffer_of(std::span(full)))->wait(); });
}
#endif

// Symmetric memory (allocate_symmetric), where the communicator has it (shm, when
// ACCEL_SHM_SYMMETRIC=1): an all_reduce
// of such a buffer, whole or a slice at an offset, small or past the slot size, gives the same
// bits as the same all_reduce of private memory (values whose sums round, so a different
// order would show). Elsewhere the buffer comes back empty.
void check_symmetric(Communicator& comm) {
  const std::size_t count = (std::size_t(3) << 18) + 7;  // 3 MiB of f32: 3 slot-sized pieces
  DeviceBuffer symmetric = comm.allocate_symmetric(count, DType::f32);
  const char* on = std::getenv("ACCEL_SHM_SYMMETRIC");
  const bool expected =
      comm.backend_name() == "shm" && comm.world_size() > 1 && on && std::string(on) == "1";
  ++g_checks;
  if ((symmetric.view().data != nullptr) != expected) {
    ++g_failures;
    std::printf("FAIL allocate_symmetric: %s a buffer\n", expected ? "did not give" : "gave");
    return;
  }
  if (!expected) return;
  const auto value = [&](std::size_t i) {
    return float(std::sin(double(comm.rank()) * 1.3 + double(i) * 0.01) * 1000.0);
  };
  struct Part {
    std::size_t offset, count;
  };
  for (const Part part : {Part{0, count}, Part{5, count - 100}, Part{4096, 1000}})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      Buffer in_place = symmetric.view().slice(part.offset, part.count);
      std::vector<float> staged(part.count);
      for (std::size_t i = 0; i < part.count; ++i)
        staged[i] = static_cast<float*>(in_place.data)[i] = value(part.offset + i);
      comm.all_reduce(in_place, op)->wait();
      comm.all_reduce(buffer_of(std::span(staged)), op)->wait();
      ++g_checks;
      if (std::memcmp(in_place.data, staged.data(), in_place.bytes()) != 0) {
        ++g_failures;
        std::printf("FAIL all_reduce(%s) of symmetric memory [%zu, +%zu): not the staged bits\n",
                    std::string(reduce_op_name(op)).c_str(), part.offset, part.count);
      }
    }
}

// --symmetric_mismatch: rank 0 all-reduces its symmetric buffer, the others memory of their
// own. Every rank must fail naming both (the algorithms differ), print "mismatch error: ..."
// and exit 3.
int symmetric_mismatch(Communicator& comm) {
  const std::size_t count = std::size_t(1) << 16;
  DeviceBuffer symmetric = comm.allocate_symmetric(count, DType::f32);
  std::vector<float> own(count, 1.0f);
  try {
    comm.all_reduce(comm.rank() == 0 ? symmetric.view() : buffer_of(std::span(own)), ReduceOp::sum)
        ->wait();
  } catch (const CommError& e) {
    std::printf("mismatch error: %s\n", e.what());
    std::fflush(stdout);
    return 3;
  }
  std::printf("rank %d: no error for mismatched buffers\n", comm.rank());
  return 1;
}

int kill_mid_collective(Communicator& comm, int victim) {
  std::vector<float> small(1024, 1.0f);
  comm.all_reduce(buffer_of(std::span(small)), ReduceOp::sum)->wait();
  std::vector<float> big(std::size_t(16) << 20, 1.0f);  // 64 MiB: many chunks, seconds of work
  if (comm.rank() == victim) {
    auto work = comm.all_reduce(buffer_of(std::span(big)), ReduceOp::sum);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::raise(SIGKILL);
  }
  try {
    comm.all_reduce(buffer_of(std::span(big)), ReduceOp::sum)->wait();
    comm.barrier()->wait();  // in case the victim died after its part of the big one
  } catch (const std::exception& e) {
    std::printf("survivor error: %s\n", e.what());
    std::fflush(stdout);
    return 3;
  }
  std::printf("rank %d: no error although rank %d was killed\n", comm.rank(), victim);
  return 1;
}

// --absent_rank R: rank R never joins a small all_reduce (it waits past the others' timeout,
// then leaves). The others must end with a timeout, not wait forever: each prints
// "timeout error: ..." and exits 3 (mpi: its watchdog ends the process first, with exit code
// 124). Small enough to run on the caller's thread where the communicator runs small
// operations inline (shm, mpi).
int absent_from_collective(Communicator& comm, int absent) {
  comm.barrier()->wait();
  if (comm.rank() == absent) {
    std::this_thread::sleep_for(std::chrono::seconds(6));
    return 0;
  }
  std::vector<float> small(1024, 1.0f);
  try {
    comm.all_reduce(buffer_of(std::span(small)), ReduceOp::sum)->wait();
  } catch (const TimeoutError& e) {
    std::printf("timeout error: %s\n", e.what());
    std::fflush(stdout);
    return 3;
  }
  std::printf("rank %d: the all_reduce ended although rank %d never joined\n", comm.rank(), absent);
  return 1;
}

// --two_communicators (mpi): two more communicators of the same world, each driven by a thread
// of its own, started in opposite orders: even ranks begin on A, odd ranks on B, the other
// thread 200 ms later. Each blocking collective waits for its peers, so this completes only if
// one communicator's collective waiting for a peer does not hold up the other's (no
// process-wide lock held across them). Prints "two communicators: ok" and exits 0.
int two_communicators(Communicator& comm) {
  CommOptions o;
  o.rank = comm.rank();
  o.world_size = comm.world_size();
  o.timeout = std::chrono::seconds(20);
  const CommunicatorPtr a = create_communicator("mpi", o);
  const CommunicatorPtr b = create_communicator("mpi", o);
  const int world = comm.world_size();
  std::atomic<int> wrong{0};
  auto drive = [&](Communicator& c, float base, bool later) {
    if (later) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const float want = base * float(world) + float(world * (world - 1) / 2);
    for (int i = 0; i < 50; ++i) {
      std::vector<float> v(1024, base + float(c.rank()));
      c.all_reduce(buffer_of(std::span(v)), ReduceOp::sum)->wait();
      if (v.front() != want || v.back() != want) {
        std::printf("FAIL two communicators: all_reduce of %g gave %g, expected %g\n", base,
                    v.front(), want);
        ++wrong;
      }
    }
  };
  const bool even = comm.rank() % 2 == 0;
  std::thread on_a([&] { drive(*a, 10.0f, !even); });
  std::thread on_b([&] { drive(*b, 20.0f, even); });
  on_a.join();
  on_b.join();
  std::printf("rank %d: two communicators: %s\n", comm.rank(), wrong == 0 ? "ok" : "wrong");
  return wrong == 0 ? 0 : 1;
}

// --where_runs BYTES: one all_reduce of BYTES (f32), then prints "rank R: BYTES bytes ran
// inline" when the call returned the shared finished Work (it ran on this thread, work.hpp),
// else "... ran queued", and whether the worker could overlap here (foundation/host_cores.hpp).
int where_runs(Communicator& comm, std::size_t bytes) {
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  const WorkPtr work = comm.all_reduce(buffer_of(std::span(data)), ReduceOp::sum);
  const bool ran_inline = work == Work::completed();
  work->wait();
  std::printf("rank %d: %zu bytes ran %s; worker can overlap: %s\n", comm.rank(), bytes,
              ran_inline ? "inline" : "queued", worker_can_overlap() ? "yes" : "no");
  return data[0] == float(comm.world_size()) ? 0 : 1;
}

#if ACCEL_TEST_MPI
// --finalize_first (mpi): after an all_reduce together, the application calls MPI_Finalize
// itself, then asks for another. That one must fail with a CommError saying MPI is finalised,
// and the process must then exit cleanly (no MPI call from our watchdog or destructors).
// Prints "after MPI_Finalize: <error>" and exits 0.
int finalize_first(Communicator& comm) {
  std::vector<float> v(1024, 1.0f);
  comm.all_reduce(buffer_of(std::span(v)), ReduceOp::sum)->wait();
  MPI_Finalize();
  try {
    comm.all_reduce(buffer_of(std::span(v)), ReduceOp::sum)->wait();
  } catch (const CommError& e) {
    std::printf("rank %d: after MPI_Finalize: %s\n", comm.rank(), e.what());
    return 0;
  }
  std::printf("rank %d: an all_reduce after MPI_Finalize did not fail\n", comm.rank());
  return 1;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  ProcessGroupOptions options;
  const test::WorkerFlags flags(argc, argv);
  flags.only({"symmetric_mismatch", "two_communicators", "finalize_first", "backend", "kill_rank",
              "absent_rank", "where_runs", "fake_hosts", "fake_host_of"});
  const int kill_rank = int(flags.integer("kill_rank", -1));
  const int absent_rank = int(flags.integer("absent_rank", -1));
  const auto where_runs_bytes = std::size_t(flags.integer("where_runs", 0));
  const bool mismatch = flags.has("symmetric_mismatch"), two = flags.has("two_communicators");
  [[maybe_unused]] const bool finalize = flags.has("finalize_first");  // with MPI only
  if (flags.has("backend")) options.backend = flags.text("backend");
  int fake_hosts = 0;
  // --fake_hosts H: one machine looks like H hosts to the hierarchical communicator.
  if (flags.has("fake_hosts")) {
    fake_hosts = int(flags.integer("fake_hosts"));
    test::claim_fake_host(fake_hosts);
  }
  // --fake_host_of 0,0,1,1: rank r on the r-th host listed.
  if (flags.has("fake_host_of")) fake_hosts = test::claim_fake_host_of(flags.text("fake_host_of"));
  if (absent_rank >= 0) options.timeout = std::chrono::seconds(2);
  try {
    auto group = init_process_group(options);
    Communicator& comm = group->comm();
    if (kill_rank >= 0) return kill_mid_collective(comm, kill_rank);
    if (absent_rank >= 0) return absent_from_collective(comm, absent_rank);
    if (mismatch) return symmetric_mismatch(comm);
    if (two) return two_communicators(comm);
    if (where_runs_bytes > 0) return where_runs(comm, where_runs_bytes);
#if ACCEL_TEST_MPI
    if (finalize) return finalize_first(comm);
#endif
    const int world = comm.world_size();
    // Odd sizes, sizes smaller than the world, 0 and 1, and one past Gloo's 1 MiB segment.
    const std::vector<std::size_t> counts = {0, 1, 2, 3, 7, 1023, std::size_t(262144 + 3)};
    for (DType dtype : kAllDTypes) {
      for (std::size_t count : counts) {
        for (ReduceOp op : kAllReduceOps) check_all_reduce(comm, dtype, op, count);
        for (ReduceOp op : kAllReduceOps) check_reduce_scatter(comm, dtype, op, count);
        check_all_gather(comm, dtype, count);
        for (int root = 0; root < world; ++root) check_broadcast(comm, dtype, root, count);
      }
    }
    for (DType dtype : {DType::f32, DType::i32})
      for (std::size_t count : counts) {
        for (bool in_place : {false, true}) {
          check_reduce_scatter_parts(comm, dtype, ReduceOp::sum, count, in_place);
          check_reduce_scatter_parts(comm, dtype, ReduceOp::avg, count, in_place);
          check_all_gather_parts(comm, dtype, count, in_place);
        }
        check_all_gather_in_place(comm, dtype, count);
        if (comm.device() != DeviceKind::cuda) {
          check_all_gather_overlapping(comm, dtype, count);
          check_reduce_scatter_overlapping(comm, dtype, count);
        }
      }
    for (std::size_t count : {std::size_t(1), std::size_t(4097)}) check_send_recv(comm, count);
    check_async(comm);
    check_symmetric(comm);
#if ACCEL_TEST_HIERARCHICAL
    check_hierarchical_traffic(comm, fake_hosts);
    if (auto* h = dynamic_cast<HierarchicalCommunicator*>(&comm))
      std::printf("rank %d: between hosts: %s\n", comm.rank(),
                  std::string(h->between_hosts_backend()).c_str());
#endif
    comm.barrier()->wait();
    test::VerdictLog(comm.rank())
        .check(g_failures == 0, "every collective's result is the reference's",
               "world " + std::to_string(world) + " (" + std::string(comm.backend_name()) + "): " +
                   std::to_string(g_checks) + " checks, " + std::to_string(g_failures) + " failed");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}
