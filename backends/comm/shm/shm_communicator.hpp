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
// Symmetric memory (allocate_symmetric): each allocation is a segment of its own, one slot per
// rank. A bigger all_reduce on such a buffer stages nothing: each rank reduces its share
// reading the others' buffers in place, then copies their reduced shares from them; three
// barriers in all (in_place_all_reduce). DDP keeps its gradient buckets there when it is on
// (ACCEL_SHM_SYMMETRIC=1, below).
//
// Waiting is wait.hpp's (short spin, then futex). Operations of at most kInlineBytes run on the
// caller's thread (the base class's inline execution). A rank that dies is noticed by the
// others within milliseconds and named: "shm: rank 2 (pid 4711) exited while this rank waited
// ...". Send/recv go through a mailbox per ordered pair of ranks.
//
// Environment (for experiments; the sizes are rank 0's, read when the segment is made):
//   ACCEL_SHM_SLOT_BYTES   bytes per rank and chunk (default 1 MiB)
//   ACCEL_SHM_SPIN_US      busy-wait before sleeping (default 200, 2 when ranks outnumber cores)
//   ACCEL_SHM_YIELD        1 (default): sched_yield while spinning; 2: pure spin
//   ACCEL_SHM_INLINE_BYTES the inline limit (default kInlineBytes). Unlike mpi's, it stays
//                          when the worker has no core of its own: DDP's step over shm was
//                          slower with every bucket inline (bench/journal/2026-12-06, "MPI on the
//                          caller's thread when no core is spare")
//   ACCEL_SHM_SYMMETRIC    0 (default): allocate_symmetric gives nothing (callers stage);
//                          1: it gives symmetric memory. Off by default because DDP, its one
//                          user, did not gain on the 2-core AMD VM (bench/journal/2026-12-04,
//                          "Symmetric memory"): the in-place all-reduce is faster on buffers that
//                          are not in cache, but the step as a whole was not.

#include <memory>
#include <mutex>
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
  // One segment per call, through the store (collective); empty at world 1, and unless
  // ACCEL_SHM_SYMMETRIC=1.
  DeviceBuffer allocate_symmetric(std::size_t count, DType dtype) override;

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
  std::vector<int> ranks_not_heard_from(std::uint64_t seq) override;

 private:
  // RankInfo::buffer_tag: the symmetric segment's index + 1 above this bit, the offset below.
  static constexpr int kTagIndexShift = 48;
  static std::size_t tag_offset(std::uint64_t tag) {
    return tag & ((std::uint64_t(1) << kTagIndexShift) - 1);
  }
  static std::size_t tag_index(std::uint64_t tag) { return (tag >> kTagIndexShift) - 1; }
  static constexpr std::size_t kMaxSymmetric = 0xffff;

  // Marks this rank as in the current operation; returns its deadline.
  shm::Clock::time_point begin(Milliseconds timeout);
  // Arrives at the next group barrier and waits for every rank to arrive there.
  void barrier(shm::Clock::time_point deadline, const char* phase);
  // all_reduce of at most kSmallBytes.
  void small_all_reduce(Buffer data, ReduceOp op, shm::Clock::time_point deadline);
  // all_reduce of a symmetric buffer in `segment`, `tag` its RankInfo::buffer_tag.
  void in_place_all_reduce(Buffer data, ReduceOp op, const shm::Segment& segment, std::uint64_t tag,
                           shm::Clock::time_point deadline);
  // RankInfo::buffer_tag for `data`, and its segment: 0 unless it lies in this rank's slot of
  // a symmetric segment.
  std::uint64_t buffer_tag(const Buffer& data, std::shared_ptr<shm::Segment>& segment) const;
  // After a barrier: throws CommError unless every rank published `tag`.
  void expect_same_buffer_tag(std::uint64_t tag) const;
  // Waits for one peer (send/recv).
  void wait_for_peer(int peer, const std::function<bool()>& ready, shm::Clock::time_point deadline,
                     const std::string& what);
  // "rank 2 (pid 4711) exited" for the first of `ranks` that no longer runs, or "".
  std::string dead_among(const std::vector<int>& ranks) const;

  StorePtr store_;  // the group's namespace in the rendezvous store
  std::unique_ptr<shm::Segment> segment_;
  // Symmetric segments, in allocation order (the same index on every rank), owned by the
  // buffers handed out. Appended by the caller's thread, read by whichever thread runs an
  // operation.
  mutable std::mutex symmetric_mutex_;
  std::vector<std::weak_ptr<shm::Segment>> symmetric_;
  shm::WaitPolicy policy_;
  std::uint64_t barriers_ = 0;   // barriers this rank has arrived at
  std::uint64_t small_ops_ = 0;  // small all-reduces so far (which half of the small slots)
  std::vector<std::uint64_t> start_times_;  // each rank's process start time, when visible
  bool symmetric_enabled_ = true;           // ACCEL_SHM_SYMMETRIC
  bool pids_visible_ = true;  // every peer's /proc entry can be read (one pid namespace)
  std::vector<std::uint64_t> sent_, taken_;  // per peer: pieces sent to / taken from it
};

}  // namespace accel
