#pragma once
// Collectives between ranks on one host through one shared-memory segment (segment.hpp),
// without sockets or a library. Every collective is a sequence of chunks; each chunk has three
// phases separated by group barriers:
//   write   each rank copies what the others need from it into its own slot
//   reduce  each rank reduces (or copies) its share, reading the others' slots, and
//           publishes it in the result slot
//   read    each rank copies the others' published shares out
// So every rank works on its own 1/N of each chunk at the same time. Slots are only read in
// a reduce phase and the result slot only in a read phase, both closed by a barrier before
// anyone writes them again, so the read phase of one chunk needs no barrier of its own before
// the next chunk's (or operation's) write phase: all_reduce costs two barriers per chunk.
// An all_reduce of at most 32 KiB costs one (small_all_reduce).
//
// Waiting is wait.hpp's (short spin, then futex). Operations of at most kInlineBytes run on the
// caller's thread (the base class's inline execution). A rank that dies is noticed by the
// others within milliseconds and named: "shm: rank 2 (pid 4711) exited while this rank waited
// ...". Send/recv go through a mailbox per ordered pair of ranks.
//
// Environment (read by rank 0 when the segment is made, for experiments):
//   ACCEL_SHM_SLOT_BYTES   bytes per rank and chunk (default 1 MiB)
//   ACCEL_SHM_SPIN_US      busy-wait before sleeping (default 200, 2 when ranks outnumber cores)
//   ACCEL_SHM_YIELD        1 (default): sched_yield while spinning; 2: pure spin

#include <memory>
#include <vector>

#include "backends/comm/communicator.hpp"
#include "backends/comm/shm/segment.hpp"
#include "backends/comm/shm/wait.hpp"

namespace accel {

class ShmCommunicator final : public Communicator {
 public:
  // Payload up to this runs inline on the caller's thread.
  static constexpr std::size_t kInlineBytes = 256 * 1024;

  // Joins the group (collective): creates or maps the segment through options.store under
  // "shm/<group_name>/". Throws TimeoutError naming ranks that did not join.
  explicit ShmCommunicator(const CommOptions& options);
  ~ShmCommunicator() override;
  std::string_view backend_name() const override { return "shm"; }

 protected:
  void run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) override;
  void run_broadcast(Buffer data, int root, Milliseconds timeout) override;
  void run_all_gather(Buffer input, Buffer output, const std::vector<Shard>& parts,
                      Milliseconds timeout) override;
  void run_reduce_scatter(Buffer input, Buffer output, ReduceOp op, const std::vector<Shard>& parts,
                          Milliseconds timeout) override;
  void run_barrier(Milliseconds timeout) override;
  void run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) override;
  void run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) override;
  std::vector<int> ranks_not_heard_from(std::uint64_t seq) override;

 private:
  // Marks this rank as in the current operation; returns its deadline.
  shm::Clock::time_point begin(Milliseconds timeout);
  // Arrives at the next group barrier and waits for every rank to arrive there.
  void barrier(shm::Clock::time_point deadline, const char* phase);
  // all_reduce of at most kSmallBytes.
  void small_all_reduce(Buffer data, ReduceOp op, shm::Clock::time_point deadline);
  // Waits for one peer (send/recv).
  void wait_for_peer(int peer, const std::function<bool()>& ready, shm::Clock::time_point deadline,
                     const std::string& what);
  // "rank 2 (pid 4711) exited" for the first of `ranks` that no longer runs, or "".
  std::string dead_among(const std::vector<int>& ranks) const;

  std::unique_ptr<shm::Segment> segment_;
  shm::WaitPolicy policy_;
  std::uint64_t barriers_ = 0;   // barriers this rank has arrived at
  std::uint64_t small_ops_ = 0;  // small all-reduces so far (which half of the small slots)
  std::vector<std::uint64_t> start_times_;  // each rank's process start time, when visible
  bool pids_visible_ = true;  // every peer's /proc entry can be read (one pid namespace)
  std::vector<std::uint64_t> sent_, taken_;  // per peer: pieces sent to / taken from it
};

}  // namespace accel
