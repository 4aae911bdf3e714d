#pragma once
// The shared-memory segment one group of same-host ranks works in, and how it comes to exist:
// rank 0 creates it under a name no earlier job can have used (its pid namespace, its pid and
// 64 random bits), sizes and allocates it (posix_fallocate), initialises it, and publishes the
// name through the rendezvous store; every rank maps it and says so in the store; as soon as all
// have, rank 0 unlinks the name. From then on the memory lives only as long as some rank maps it,
// so a crash leaves nothing in /dev/shm. A name left by a creator that was killed before unlinking
// is removed by the next creator on the host (its pid no longer runs).
//
// Layout: a control region (header, one RankInfo per rank, one Channel per ordered pair of
// ranks for send/recv), padded to 2 MiB so the data behind it can sit on huge pages; then
// world slots of slot_bytes, one result slot, world x world mailboxes, and two halves of world
// small slots (kSmallBytes each) for one-barrier small all-reduces.
// A symmetric segment (SegmentKind::symmetric) has the same control region, then only the
// world slots: slot r is rank r's symmetric buffer, which every other rank reads in place.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "foundation/error.hpp"
#include "foundation/store/store.hpp"

namespace accel::shm {

inline constexpr std::uint64_t kMagic = 0x6d68732d6c656363ULL;  // "ccel-shm"
inline constexpr std::uint32_t kVersion = 2;
inline constexpr std::size_t kControlAlign = 2u << 20;  // a huge page
inline constexpr std::size_t kSmallBytes = 32u << 10;

enum class SegmentKind : std::uint32_t {
  collectives,  // the communicator's own: slots, result slot, mailboxes, small slots
  symmetric,    // one slot per rank and nothing else (ShmCommunicator::allocate_symmetric)
};

struct alignas(64) Header {
  std::uint64_t magic;
  std::uint64_t nonce;  // published with the name; a rank checks it after mapping
  std::uint32_t version;
  std::uint32_t world;
  SegmentKind kind;
  std::uint64_t slot_bytes;
  std::uint64_t mailbox_bytes;
  std::uint64_t total_bytes;
  // Waiters sleep on wake_word (FUTEX_WAIT on its value); every post bumps it and, when
  // sleepers is non-zero, wakes them. 32 bits because futexes are.
  alignas(64) std::atomic<std::uint32_t> wake_word;
  std::atomic<std::uint32_t> sleepers;
};

struct alignas(64) RankInfo {
  std::atomic<std::int32_t> pid;          // 0 until the rank has mapped the segment
  std::atomic<std::uint64_t> start_time;  // /proc/PID/stat field 22: tells a reused pid apart
  std::atomic<std::uint64_t> op_seq;      // sequence number of the operation it is in
  // Which buffer the rank's current big all_reduce works on: 0 for its own memory, else the
  // symmetric segment (index + 1, top 16 bits) and the offset in its slot. Ranks compare it
  // after the first barrier, so they never mix the in-place and the staged algorithm.
  std::atomic<std::uint64_t> buffer_tag;
  // Barrier counter: the number of the last barrier this rank arrived at. Own cache line,
  // since every other rank polls it.
  alignas(64) std::atomic<std::uint64_t> arrived;
};

// send/recv from one rank to another: pieces of at most mailbox_bytes, one at a time.
struct alignas(64) Channel {
  std::atomic<std::uint64_t> sent;  // pieces posted by the sender
  std::uint32_t tag;
  std::uint64_t message_bytes;  // the whole message the piece belongs to
  std::uint64_t piece_bytes;
  alignas(64) std::atomic<std::uint64_t> taken;  // pieces the receiver has copied out
};

// /dev/shm has no room for the segment (posix_fallocate refused it). Rank 0 says so through
// the store, so every rank of the group throws this and none waits for a segment.
class SegmentUnavailable : public CommError {
 public:
  using CommError::CommError;
};

class Segment {
 public:
  // Collective over the group's ranks: see the top of the file. `store` is already prefixed
  // with the group's namespace. Throws TimeoutError naming the ranks that did not map it
  // within `timeout`, SegmentUnavailable when /dev/shm is too small, CommError for a failed
  // system call.
  Segment(const StorePtr& store, int rank, int world, std::size_t slot_bytes,
          std::size_t mailbox_bytes, Milliseconds timeout,
          SegmentKind kind = SegmentKind::collectives);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  RankInfo& rank_info(int r) const { return reinterpret_cast<RankInfo*>(base_ + rank_offset_)[r]; }
  Channel& channel(int src, int dst) const {
    return reinterpret_cast<Channel*>(base_ + channel_offset_)[src * world_ + dst];
  }
  char* slot(int r) const { return base_ + data_offset_ + std::size_t(r) * slot_bytes_; }
  char* result_slot() const { return slot(world_); }
  char* mailbox(int src, int dst) const {
    return base_ + mailbox_offset_ + std::size_t(src * world_ + dst) * mailbox_bytes_;
  }
  // Small-operation slot of rank r in half 0 or 1.
  char* small_slot(int half, int r) const {
    return base_ + small_offset_ + (std::size_t(half) * world_ + r) * kSmallBytes;
  }
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::size_t mailbox_bytes() const { return mailbox_bytes_; }
  const std::string& name() const { return name_; }

 private:
  void compute_layout();
  void create_and_publish(const StorePtr& store);
  void open_published(const StorePtr& store, Milliseconds timeout);

  int rank_, world_;
  std::size_t slot_bytes_, mailbox_bytes_;
  SegmentKind kind_;
  std::size_t rank_offset_ = 0, channel_offset_ = 0, data_offset_ = 0, mailbox_offset_ = 0;
  std::size_t small_offset_ = 0;
  std::size_t total_bytes_ = 0;
  char* base_ = nullptr;
  std::string name_;
  bool linked_ = false;  // rank 0: the name still exists in /dev/shm
};

// Start time of a process (/proc/PID/stat field 22, clock ticks since boot); 0 when it does
// not run (gone, or a zombie).
std::uint64_t process_start_time(int pid);

// Removes /dev/shm/accel-shm-PIDNS-PID-* entries of this user, made in this pid namespace,
// whose creator PID no longer runs.
void remove_stale_segments();

}  // namespace accel::shm
