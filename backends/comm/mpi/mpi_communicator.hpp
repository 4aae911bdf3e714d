#pragma once
// The Communicator over MPI (OpenMPI, MPICH), for jobs started with mpirun/srun or any
// launcher that MPI can wire up. MPI brings its own world and rendezvous, so the store in
// CommOptions is not used; rank and world size come from MPI_COMM_WORLD.
//
// Threading: MPI is initialised (if nobody has) with MPI_THREAD_MULTIPLE on the thread that
// constructs the first MpiCommunicator -- construct it on the main thread, since MPI wants
// MPI_Finalize on the thread that initialised it and we finalise from an atexit handler.
// Each communicator runs its collectives on its worker thread (or the caller's, inline), and
// communicators run theirs at once, so one waiting for a late peer never holds up another.
// If the application initialised MPI itself, it must have asked for MPI_THREAD_MULTIPLE, and
// it stays in charge of MPI_Finalize.
//
// Timeouts: every collective is MPI's blocking one, which cannot be abandoned once entered.
// A watchdog thread per communicator (mpi_watchdog.hpp) ends the process (exit code 124) when
// a collective has not completed within options.timeout, after asking the other ranks'
// watchdogs and printing one line that names the operation and the ranks that had not
// entered it -- what PyTorch's NCCL watchdog does. Point-to-point operations are nonblocking
// requests polled against the timeout and end in TimeoutError. A send or receive given up
// while MPI still holds a request that could not be cancelled leaves its buffer to MPI: keep
// it alive or end the process (the communicator refuses further operations either way, and
// MPI_Finalize is then skipped at exit so exit cannot hang).
//
// Operations of at most kInlineBytes run on the caller's thread (communicator.hpp's inline
// execution; MPI_THREAD_MULTIPLE makes that safe): handing a collective to the worker thread
// and waking the caller again costs tens of microseconds, more than a small collective. Measured
// with comm_bench at world 2 (bench/README): a 4 KiB all-reduce 16.6 us queued, 8.2 us inline;
// at 512 KiB to 2 MiB, queued ran at 0.64-0.88 of raw MPI's speed, inline at 0.89-1.00. Above
// 4 MiB the hand-off is a few percent of the operation, and a caller that goes on computing
// (DDP's buckets during backward) keeps the overlap -- where the worker has a core to run on
// beside the caller (foundation/host_cores.hpp, worker_can_overlap). Where it has none (as many
// ranks on the host as cores, or a rank bound to one core), every operation runs inline:
// measured on 2 cores at world 2 and 4, the slowest cells from 8 to 256 MiB went from 0.75
// to 0.92 of raw MPI, and DDP's step did not change (bench/journal/2026-12-06, "MPI on the caller's
// thread when no core is spare"). ACCEL_MPI_INLINE_BYTES overrides the limit (0: only
// barriers), for experiments.
//
// Counts above INT_MAX (MPI counts are int) are not rejected: all_reduce and broadcast run
// as several MPI calls of at most INT_MAX elements; all_gather and reduce_scatter fall back
// to one broadcast / reduce per rank's part, chunked alike; send and recv stay one message,
// described by a derived datatype, so a size mismatch is still detected.

#include <memory>
#include <string>
#include <vector>

#include "backends/comm/communicator.hpp"

namespace accel {

class MpiCommunicator final : public Communicator {
 public:
  // Joins MPI_COMM_WORLD (a duplicate of it), initialising MPI if needed. options.rank and
  // options.world_size, when >= 0, must equal this process's rank and size in MPI_COMM_WORLD
  // (InvalidArgument naming both otherwise); pass -1 to take MPI's. options.timeout bounds
  // every operation and the join itself. Throws TimeoutError when not every rank joins.
  explicit MpiCommunicator(const CommOptions& options);

  // A group of some of MPI_COMM_WORLD's ranks: members[i] is the MPI rank of group rank i
  // (options.rank is this process's). The members meet on options.store first, so one that
  // never comes is a TimeoutError naming it, then MPI_Comm_create_group makes the group
  // among them alone (the hierarchical communicator's leaders and rails between hosts).
  MpiCommunicator(const CommOptions& options, const std::vector<int>& members);

  // Rank and world size taken from MPI_COMM_WORLD.
  static std::unique_ptr<MpiCommunicator> from_world(Milliseconds timeout = kDefaultCommTimeout);

  ~MpiCommunicator() override;

  std::string_view backend_name() const override { return "mpi"; }
  static constexpr std::size_t kInlineBytes = 4u << 20;

 protected:
  void run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) override;
  void run_broadcast(Buffer data, int root, Milliseconds timeout) override;
  void run_all_gather(Buffer input, Buffer output, const Parts& parts,
                      Milliseconds timeout) override;
  void run_reduce_scatter(Buffer input, Buffer output, ReduceOp op, const Parts& parts,
                          Milliseconds timeout) override;
  void run_barrier(Milliseconds timeout) override;
  void run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) override;
  void run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) override;

 private:
  struct World {
    int rank = 0;
    int size = 1;
  };
  // Initialises MPI if needed; this process's rank and size in MPI_COMM_WORLD.
  static World mpi_world();
  // The same, checking options against MPI_COMM_WORLD; runs before the base
  // class is constructed, which needs rank and size.
  static World join_world(const CommOptions& options);
  MpiCommunicator(const CommOptions& options, World world);
  // Takes the two MPI_Comm (passed by address: no <mpi.h> here) it is made of, `internal`
  // for its own messages: error handling, names, the watchdog, inline execution.
  void adopt(void* comm, void* internal);

  // reduce_scatter as a ring of MPI_Sendrecv (where it beats MPI's own: the .cpp). `wire`:
  // avg already turned into sum. Every part at most INT_MAX elements.
  void ring_reduce_scatter(Buffer input, Buffer output, ReduceOp wire, const Parts& parts);

  struct State;      // MPI handles; kept out of this header so users need no <mpi.h>
  class Collective;  // around each blocking collective (the .cpp)
  std::unique_ptr<State> state_;
};

// The MPI library's own description of itself (MPI_Get_library_version, which MPI allows
// before MPI_Init): "Open MPI v4.1.4, package: ...". For `accel env`.
std::string mpi_library_version();

}  // namespace accel
