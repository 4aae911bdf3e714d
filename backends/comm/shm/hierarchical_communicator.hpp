#pragma once
// Ranks on several hosts: shared memory inside each host, another communicator between them
// (the registry's choice: MPI when the job is an MPI world, Gloo otherwise;
// ACCEL_HIERARCHICAL_BETWEEN_HOSTS=gloo|mpi overrides).
//   all_reduce      host sum over shm -> leaders all-reduce -> host broadcast from the leader
//   broadcast       to the root's leader over shm -> leaders -> every host over shm
//   reduce_scatter  every host the same number of ranks L ("rails"): host reduce_scatters
//                   over shm (local rank l gets the host sum of the parts of every host's
//                   l-th rank) -> reduce_scatter over rail l (the l-th rank of every host)
//                   -> this rank's part. Each byte crosses shm and the network once, as in a
//                   flat ring: bandwidth-optimal. Nothing is staged: the host reduce_scatters
//                   read the caller's buffer in place, one per run of hosts (HostRun), so
//                   hosts must number their ranks in blocks (0-3 on one host, 4-7 on the
//                   next, as `accel launch` does) or round robin (0, 2 on one, 1, 3 on the
//                   other), or runs of either. Other numberings, and hosts of unequal sizes:
//                   all_reduce on a copy, keep this rank's part
//   all_gather      the reverse: all_gather over rail l into scratch, host all_gathers
//                   straight into the caller's output. Without rails: host all_gather into
//                   a per-host block (parts padded to the largest) -> leaders all_gather
//                   the blocks -> host broadcast -> unpack
//   barrier         host, leaders, host
//   send/recv       over shm inside a host; across hosts over a third communicator of the
//                   whole world made by the same factory (made at construction, because
//                   making one is collective)
// all_reduce, broadcast and barrier cross hosts through the leaders only, so the TCP links
// carry 1/ranks-per-host of what a flat Gloo ring would; reduce_scatter and all_gather cross
// them on every rail at once, each rail with 1/ranks-per-host of the bytes. Error messages of the
// inner groups name their own ranks; the message adds which global ranks they are.

#include <functional>

#include "backends/comm/communicator.hpp"

namespace accel {

class HierarchicalCommunicator final : public Communicator {
 public:
  // Makes a communicator between hosts; members[i] is the global rank of its rank i.
  using Factory =
      std::function<CommunicatorPtr(const CommOptions&, const std::vector<int>& members)>;

  // host_of[r]: host index of global rank r (shm::exchange_hosts). make_between_hosts makes the
  // leaders' communicator, the rails' and the whole world's one for send/recv across hosts
  // (Gloo, or MPI when the job is an MPI world: the registry chooses).
  HierarchicalCommunicator(const CommOptions& options, std::vector<int> host_of,
                           const Factory& make_between_hosts);
  ~HierarchicalCommunicator() override;
  std::string_view backend_name() const override { return "hierarchical"; }
  // Bytes this rank has put on the communicators between hosts (counted as bus_bytes counts
  // them), so a test can hold reduce_scatter and all_gather to the bandwidth-optimal volume.
  std::uint64_t between_hosts_bytes() const;
  // Whether reduce_scatter and all_gather take the rails (hosts of equal size numbering their
  // ranks in blocks, round robin, or runs of either: see the top of this file).
  bool has_rails() const { return !runs_.empty(); }
  // What carries the traffic between hosts ("gloo", "mpi"); "" with one host.
  std::string_view between_hosts_backend() const;

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
  // Waits for an inner operation, adding which group it ran in to its error.
  void inner(const WorkPtr& work, Milliseconds timeout, bool between_hosts) const;
  void all_reduce_sum(Buffer data, ReduceOp wire, Milliseconds timeout);
  // The rail of this rank's local index (the leaders' communicator for local index 0); null
  // without rails (runs_ empty).
  Communicator* rail() const;
  // Scratch for the rails' buffers, grown on demand and kept: operations run one at a time,
  // and fresh pages cost more than the copy.
  char* scratch(std::size_t bytes);
  // Hosts [first_host, first_host + hosts) numbering their ranks local index first: the rank
  // of local index j on host h is first_rank + j x hosts + (h - first_host). Local rank j's
  // share of the run is then the parts of its rail's ranks there, contiguous in the buffer,
  // so one host reduce_scatter (all_gather) covers the run, reading (writing) the caller's
  // buffer in place.
  struct HostRun {
    int first_host, hosts, first_rank;
  };
  // The runs covering every host in order, each as long as it can be; empty when some host's
  // ranks fit no run.
  std::vector<HostRun> host_runs() const;
  // This rank's rail's parts (those of the l-th rank of every host), in host order, and a
  // buffer of scratch that holds them all.
  struct RailBuffer {
    std::vector<std::size_t> counts;
    Buffer data;
  };
  RailBuffer rail_buffer(const Parts& parts, const Buffer& like);
  // visit(region, mine, counts) for each run, in order: the run's region of `data` (the
  // caller's buffer), this rank's piece of `rail` for it (consecutive pieces, in run order),
  // and each local rank's elements of the region.
  template <typename Visit>
  void for_each_run(const Parts& parts, Buffer data, Buffer rail, Visit visit) const;
  void rail_reduce_scatter(Buffer input, Buffer output, ReduceOp op, const Parts& parts,
                           Milliseconds timeout);
  void rail_all_gather(Buffer input, Buffer output, const Parts& parts, Milliseconds timeout);
  void leaders_all_gather(Buffer input, Buffer output, const Parts& parts, Milliseconds timeout);

  std::vector<int> host_of_, local_index_;
  std::vector<std::vector<int>> members_;  // global ranks of each host, ascending
  int host_ = 0, hosts_ = 1, widest_host_ = 1;
  CommunicatorPtr local_;      // this host's ranks, over shm
  CommunicatorPtr leaders_;    // one rank per host; null on the others
  CommunicatorPtr world_;      // everyone, for send/recv across hosts
  CommunicatorPtr rail_;       // the l-th rank of every host, for l > 0 (rail())
  bool uniform_ = false;       // every host has widest_host_ ranks
  std::vector<HostRun> runs_;  // empty: no rails (one host, unequal hosts, other numberings)
  std::vector<char> scratch_;
};

}  // namespace accel
