#include "backends/comm/shm/shm_communicator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "foundation/env_value.hpp"
#include "foundation/error.hpp"
#include "foundation/host_cores.hpp"
#include "foundation/store/prefix_store.hpp"

namespace accel {
namespace {

constexpr std::size_t kDefaultSlotBytes = 1u << 20;
constexpr std::size_t kMaxMailboxBytes = 64u << 10;

// Slots must hold whole elements of every dtype, and world windows of them (reduce_scatter).
std::size_t slot_bytes_for(int world) {
  std::size_t bytes = env_uint("ACCEL_SHM_SLOT_BYTES", kDefaultSlotBytes, 1);
  const std::size_t unit = 8 * std::size_t(world);
  return std::max(unit, bytes / unit * unit);
}

std::size_t mailbox_bytes_for(int world) {
  // 64 KiB per ordered pair, less when the world is large (n^2 mailboxes), at least 4 KiB.
  const std::size_t pairs = std::size_t(world) * std::size_t(world);
  return std::clamp<std::size_t>((4u << 20) / pairs / 64 * 64, 4u << 10, kMaxMailboxBytes);
}

}  // namespace

ShmCommunicator::ShmCommunicator(const CommOptions& options)
    : Communicator(options.rank, options.world_size, options.timeout) {
  ACCEL_CHECK_ARG(options.store != nullptr, "the shm communicator needs a rendezvous store");
  store_ = std::make_shared<PrefixStore>("shm/" + options.group_name, options.store);
  segment_ =
      std::make_unique<shm::Segment>(store_, rank(), world_size(), slot_bytes_for(world_size()),
                                     mailbox_bytes_for(world_size()), options.timeout);
  // With more ranks than cores a spinning rank holds the core the rank it waits for needs.
  // Otherwise the core is this rank's anyway, and a futex sleep costs tens of microseconds to
  // wake from: measured on an idle 2-core machine, a 4 KiB all-reduce at world 2 averaged
  // 3.6-10 us with a 200 us spin against 10-41 us with 20 us.
  const bool oversubscribed = world_size() > usable_cores();
  policy_.spin =
      std::chrono::microseconds(env_uint("ACCEL_SHM_SPIN_US", oversubscribed ? 2 : 200, 1));
  // Measured on a loaded 2-core machine: yielding while spinning halved to quartered the
  // median 4 KiB all-reduce time against sleeping right after a pure spin.
  policy_.yield = env_uint("ACCEL_SHM_YIELD", 1, 1, 2) == 1;
  start_times_.resize(world_size());
  for (int r = 0; r < world_size(); ++r) {
    const shm::RankInfo& info = segment_->rank_info(r);
    start_times_[r] = info.start_time.load();
    // A peer in another pid namespace cannot be watched through /proc: rely on the timeout.
    if (shm::process_start_time(info.pid.load()) != start_times_[r] || start_times_[r] == 0)
      pids_visible_ = false;
  }
  symmetric_enabled_ = env_uint("ACCEL_SHM_SYMMETRIC", 0, 0, 1) == 1;
  sent_.assign(world_size(), 0);
  taken_.assign(world_size(), 0);
  set_inline_max_bytes(env_uint("ACCEL_SHM_INLINE_BYTES", kInlineBytes));
}

ShmCommunicator::~ShmCommunicator() { stop_worker(); }

std::string ShmCommunicator::dead_among(const std::vector<int>& ranks) const {
  if (!pids_visible_) return "";
  for (int r : ranks) {
    const int pid = segment_->rank_info(r).pid.load();
    if (shm::process_start_time(pid) != start_times_[r])
      return "rank " + std::to_string(r) + " (pid " + std::to_string(pid) + ") exited";
  }
  return "";
}

DeviceBuffer ShmCommunicator::allocate_symmetric(std::size_t count, DType dtype) {
  if (world_size() == 1 || !symmetric_enabled_) return {};
  // Whole pages per rank, so no two ranks' buffers share a cache line.
  const std::size_t page = 4096;
  const std::size_t bytes = std::max(page, (count * element_size(dtype) + page - 1) / page * page);
  std::size_t index = 0;
  {
    std::lock_guard lock(symmetric_mutex_);
    index = symmetric_.size();
  }
  ACCEL_CHECK_ARG(index < kMaxSymmetric, "shm: at most " + std::to_string(kMaxSymmetric) +
                                             " symmetric allocations per communicator");
  // Not under the lock: making it waits for every rank, and an operation running meanwhile
  // must still be able to look its buffer up.
  std::shared_ptr<shm::Segment> segment;
  try {
    segment = std::make_shared<shm::Segment>(
        std::make_shared<PrefixStore>("symmetric/" + std::to_string(index), store_), rank(),
        world_size(), bytes, 0, timeout(), shm::SegmentKind::symmetric);
  } catch (const shm::SegmentUnavailable& e) {
    // Every rank gets here alike; the caller stages through memory of its own instead.
    if (rank() == 0)
      std::fprintf(stderr, "note: %s; %zu bytes per rank stay in private memory instead\n",
                   e.what(), bytes);
    std::lock_guard lock(symmetric_mutex_);
    symmetric_.emplace_back();  // the index stays taken on every rank
    return {};
  }
  if (segment->slot_bytes() != bytes)
    throw InvalidArgument("shm: rank " + std::to_string(rank()) + " asked for symmetric memory #" +
                          std::to_string(index) + " of " + std::to_string(bytes) +
                          " bytes, rank 0 for " + std::to_string(segment->slot_bytes()) +
                          ": every rank must allocate the same sizes in the same order");
  const Buffer view{segment->slot(rank()), count, dtype, DeviceKind::cpu};
  {
    std::lock_guard lock(symmetric_mutex_);
    symmetric_.push_back(segment);
  }
  return DeviceBuffer(view, std::move(segment));
}

std::uint64_t ShmCommunicator::buffer_tag(const Buffer& data,
                                          std::shared_ptr<shm::Segment>& segment) const {
  const char* const p = static_cast<const char*>(data.data);
  std::lock_guard lock(symmetric_mutex_);
  for (std::size_t i = 0; i < symmetric_.size(); ++i) {
    segment = symmetric_[i].lock();
    if (!segment) continue;
    const char* const slot = segment->slot(rank());
    if (p >= slot && p + data.bytes() <= slot + segment->slot_bytes())
      return (std::uint64_t(i + 1) << kTagIndexShift) | std::uint64_t(p - slot);
  }
  segment.reset();
  return 0;
}

void ShmCommunicator::expect_same_buffer_tag(std::uint64_t tag) const {
  const auto describe = [](std::uint64_t t) {
    if (t == 0) return std::string("its own memory");
    return "symmetric memory #" + std::to_string(tag_index(t)) + " at offset " +
           std::to_string(tag_offset(t));
  };
  for (int j = 0; j < world_size(); ++j) {
    const std::uint64_t theirs = segment_->rank_info(j).buffer_tag.load();
    if (theirs != tag)
      throw CommError("shm: all_reduce on " + describe(tag) + " at rank " + std::to_string(rank()) +
                      ", on " + describe(theirs) + " at rank " + std::to_string(j) +
                      ": every rank must pass its own slice of the same symmetric buffer, or "
                      "every rank memory of its own");
  }
}

shm::Clock::time_point ShmCommunicator::begin(Milliseconds timeout) {
  segment_->rank_info(rank()).op_seq.store(current_sequence());
  return shm::Clock::now() + timeout;
}

void ShmCommunicator::barrier(shm::Clock::time_point deadline, const char* phase) {
  const std::uint64_t target = ++barriers_;
  segment_->rank_info(rank()).arrived.store(target);
  shm::post(segment_->header());
  const int n = world_size();
  // Ranks already seen at the target stay there; start the scan at the first one not yet seen.
  int first_missing = 0;
  const auto ready = [&] {
    while (first_missing < n && segment_->rank_info(first_missing).arrived.load() >= target)
      ++first_missing;
    return first_missing == n;
  };
  const auto missing = [&] {
    std::vector<int> out;
    for (int r = 0; r < n; ++r)
      if (segment_->rank_info(r).arrived.load() < target) out.push_back(r);
    return out;
  };
  shm::wait_until(
      segment_->header(), ready, deadline, policy_, [&] { return dead_among(missing()); },
      [&] {
        return std::string("waiting in ") + phase + " (barrier " + std::to_string(target) +
               ") for ranks " + format_ranks(missing());
      });
}

void ShmCommunicator::run_barrier(Milliseconds timeout) { barrier(begin(timeout), "barrier"); }

// One barrier instead of two: every rank reduces the whole (small) buffer itself, from all
// slots in rank order, so all get bit-identical results. The small slots alternate between
// two halves: a rank writes half h again only two small operations later, after the barrier of
// the one between, which every rank reaches only when done reading half h.
void ShmCommunicator::small_all_reduce(Buffer data, ReduceOp op, shm::Clock::time_point deadline) {
  const int n = world_size();
  const int half = int(small_ops_++ % 2);
  const std::size_t bytes = data.bytes();
  std::memcpy(segment_->small_slot(half, rank()), data.data, bytes);
  barrier(deadline, "all_reduce");
  const ReduceKernel kernel = reduce_kernel(data.dtype, wire_op(op));
  kernel(data.data, segment_->small_slot(half, 0), segment_->small_slot(half, 1), data.count);
  for (int j = 2; j < n; ++j)
    kernel(data.data, data.data, segment_->small_slot(half, j), data.count);
  if (op == ReduceOp::avg) finish_average(data);
}

void ShmCommunicator::run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) {
  const int n = world_size(), r = rank();
  if (n == 1) return;
  const auto deadline = begin(timeout);
  if (data.bytes() <= shm::kSmallBytes) return small_all_reduce(data, op, deadline);
  std::shared_ptr<shm::Segment> symmetric;  // held for the operation
  const std::uint64_t tag = buffer_tag(data, symmetric);
  segment_->rank_info(r).buffer_tag.store(tag);
  if (tag != 0) return in_place_all_reduce(data, op, *symmetric, tag, deadline);
  const std::size_t esize = element_size(data.dtype);
  const std::size_t chunk = segment_->slot_bytes() / esize;
  const ReduceKernel kernel = reduce_kernel(data.dtype, wire_op(op));
  char* const base = static_cast<char*>(data.data);
  char* const mine = segment_->slot(r);
  char* const result = segment_->result_slot();
  for (std::size_t off = 0; off < data.count; off += chunk) {
    const std::size_t count = std::min(chunk, data.count - off);
    char* const part = base + off * esize;
    // write: the others' shares of this chunk into this rank's slot
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const Shard s = shard_of(count, n, j);
      std::memcpy(mine + s.offset * esize, part + s.offset * esize, s.count * esize);
    }
    barrier(deadline, "all_reduce write");
    if (off == 0) expect_same_buffer_tag(0);
    // reduce: this rank's share, its own values first, then every other rank's in rank order
    const Shard own = shard_of(count, n, r);
    if (own.count) {
      char* const out = part + own.offset * esize;
      for (int j = 0; j < n; ++j)
        if (j != r) kernel(out, out, segment_->slot(j) + own.offset * esize, own.count);
      if (op == ReduceOp::avg) divide_elements(out, own.count, data.dtype, n);
      std::memcpy(result + own.offset * esize, out, own.count * esize);
    }
    barrier(deadline, "all_reduce reduce");
    // read: the others' reduced shares
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const Shard s = shard_of(count, n, j);
      std::memcpy(part + s.offset * esize, result + s.offset * esize, s.count * esize);
    }
  }
}

void ShmCommunicator::in_place_all_reduce(Buffer data, ReduceOp op, const shm::Segment& segment,
                                          std::uint64_t tag, shm::Clock::time_point deadline) {
  const int n = world_size(), r = rank();
  barrier(deadline, "all_reduce ready");
  expect_same_buffer_tag(tag);
  std::vector<const char*> peer(std::size_t(n), nullptr);  // rank j's copy of `data`
  for (int j = 0; j < n; ++j) peer[std::size_t(j)] = segment.slot(j) + tag_offset(tag);
  const std::size_t esize = element_size(data.dtype);
  const ReduceKernel kernel = reduce_kernel(data.dtype, wire_op(op));
  char* const base = static_cast<char*>(data.data);
  // The same chunks and shares as the staged algorithm, each share reduced the same way (its
  // owner's values first, then the others' in rank order): both give the same bits. A chunk
  // is also what keeps the average's sums in cache for the division.
  const std::size_t chunk = segment_->slot_bytes() / esize;
  const auto for_each_share = [&](auto&& visit) {
    for (std::size_t off = 0; off < data.count; off += chunk) {
      const std::size_t count = std::min(chunk, data.count - off);
      for (int j = 0; j < n; ++j) {
        const Shard s = shard_of(count, n, j);
        visit(j, (off + s.offset) * esize, s.count);
      }
    }
  };
  // reduce: this rank's shares, reading the others' buffers in place
  for_each_share([&](int owner, std::size_t at, std::size_t count) {
    if (owner != r || count == 0) return;
    for (int j = 0; j < n; ++j)
      if (j != r) kernel(base + at, base + at, peer[std::size_t(j)] + at, count);
    if (op == ReduceOp::avg) divide_elements(base + at, count, data.dtype, n);
  });
  barrier(deadline, "all_reduce reduce");
  // read: the others' reduced shares, from their buffers
  for_each_share([&](int owner, std::size_t at, std::size_t count) {
    if (owner != r) std::memcpy(base + at, peer[std::size_t(owner)] + at, count * esize);
  });
  // Nobody may change its buffer (the next backward, zero_grad) until all have read it.
  barrier(deadline, "all_reduce read");
}

void ShmCommunicator::run_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                         const Parts& parts, Milliseconds timeout) {
  const int n = world_size(), r = rank();
  const std::size_t esize = element_size(input.dtype);
  if (n == 1) {
    std::memmove(output.data, static_cast<const char*>(input.data) + parts[0].offset * esize,
                 output.bytes());
    return;
  }
  const auto deadline = begin(timeout);
  // Each slot holds one window per destination rank.
  const std::size_t window = segment_->slot_bytes() / esize / std::size_t(n);
  const ReduceKernel kernel = reduce_kernel(input.dtype, wire_op(op));
  const char* const in = static_cast<const char*>(input.data);
  char* const out = static_cast<char*>(output.data);
  const std::size_t largest = parts.largest();
  const Shard own = parts[std::size_t(r)];
  for (std::size_t lo = 0; lo < largest; lo += window) {
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const Shard s = parts[std::size_t(j)];
      if (lo >= s.count) continue;
      const std::size_t len = std::min(window, s.count - lo);
      std::memcpy(segment_->slot(r) + std::size_t(j) * window * esize, in + (s.offset + lo) * esize,
                  len * esize);
    }
    barrier(deadline, "reduce_scatter write");
    if (lo < own.count) {
      const std::size_t len = std::min(window, own.count - lo);
      char* const dst = out + lo * esize;
      const char* src = in + (own.offset + lo) * esize;
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        kernel(dst, src, segment_->slot(j) + std::size_t(r) * window * esize, len);
        src = dst;
      }
      if (op == ReduceOp::avg) divide_elements(dst, len, input.dtype, n);
    }
    barrier(deadline, "reduce_scatter reduce");
  }
}

void ShmCommunicator::run_all_gather(Buffer input, Buffer output, const Parts& parts,
                                     Milliseconds timeout) {
  const int n = world_size(), r = rank();
  const std::size_t esize = element_size(output.dtype);
  const Shard own = parts[std::size_t(r)];
  char* const out = static_cast<char*>(output.data);
  if (own.count) std::memmove(out + own.offset * esize, input.data, own.count * esize);
  if (n == 1) return;
  const auto deadline = begin(timeout);
  const std::size_t window = segment_->slot_bytes() / esize;
  const std::size_t largest = parts.largest();
  // This rank's part is read from its place in the output, where no peer's part lands: an
  // input lying elsewhere in the output would be overwritten by the first window's parts.
  const char* const in = out + own.offset * esize;
  for (std::size_t lo = 0; lo < largest; lo += window) {
    if (lo < own.count)
      std::memcpy(segment_->slot(r), in + lo * esize, std::min(window, own.count - lo) * esize);
    barrier(deadline, "all_gather write");
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const Shard s = parts[std::size_t(j)];
      if (lo >= s.count) continue;
      std::memcpy(out + (s.offset + lo) * esize, segment_->slot(j),
                  std::min(window, s.count - lo) * esize);
    }
    barrier(deadline, "all_gather read");
  }
}

void ShmCommunicator::run_broadcast(Buffer data, int root, Milliseconds timeout) {
  const int n = world_size();
  if (n == 1) return;
  const auto deadline = begin(timeout);
  const std::size_t esize = element_size(data.dtype);
  // The slots are contiguous: the root fills all of them at once.
  const std::size_t window = segment_->slot_bytes() * std::size_t(n) / esize;
  char* const base = static_cast<char*>(data.data);
  char* const area = segment_->slot(0);
  for (std::size_t lo = 0; lo < data.count; lo += window) {
    const std::size_t bytes = std::min(window, data.count - lo) * esize;
    if (rank() == root) std::memcpy(area, base + lo * esize, bytes);
    barrier(deadline, "broadcast write");
    if (rank() != root) std::memcpy(base + lo * esize, area, bytes);
    barrier(deadline, "broadcast read");
  }
}

void ShmCommunicator::wait_for_peer(int peer, const std::function<bool()>& ready,
                                    shm::Clock::time_point deadline, const std::string& what) {
  shm::wait_until(
      segment_->header(), ready, deadline, policy_, [&] { return dead_among({peer}); },
      [&] { return what; });
}

void ShmCommunicator::run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) {
  const auto deadline = begin(timeout);
  shm::Channel& ch = segment_->channel(rank(), dst);
  char* const box = segment_->mailbox(rank(), dst);
  const std::size_t piece = segment_->mailbox_bytes();
  const char* src = static_cast<const char*>(data.data);
  std::size_t left = data.bytes();
  do {  // a message of 0 bytes is still one piece, so the receiver sees its tag
    // The mailbox is free once rank dst took the previous piece.
    const std::uint64_t posted = sent_[dst];
    wait_for_peer(
        dst, [&] { return ch.taken.load() >= posted; }, deadline,
        "send to rank " + std::to_string(dst) + ": waiting for it to take piece " +
            std::to_string(posted));
    const std::size_t len = std::min(piece, left);
    std::memcpy(box, src, len);
    ch.tag = tag;
    ch.message_bytes = data.bytes();
    ch.piece_bytes = len;
    ch.sent.store(++sent_[dst]);
    shm::post(segment_->header());
    src += len;
    left -= len;
  } while (left > 0);
}

void ShmCommunicator::run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) {
  const auto deadline = begin(timeout);
  shm::Channel& ch = segment_->channel(src, rank());
  const char* const box = segment_->mailbox(src, rank());
  char* dst = static_cast<char*>(data.data);
  std::size_t left = data.bytes();
  do {
    const std::uint64_t want = taken_[src] + 1;
    wait_for_peer(
        src, [&] { return ch.sent.load() >= want; }, deadline,
        "recv from rank " + std::to_string(src) + ": waiting for piece " + std::to_string(want));
    if (ch.tag != tag || ch.message_bytes != data.bytes())
      throw CommError("shm: recv expected tag " + std::to_string(tag) + " with " +
                      std::to_string(data.bytes()) + " bytes from rank " + std::to_string(src) +
                      ", but it sent tag " + std::to_string(ch.tag) + " with " +
                      std::to_string(ch.message_bytes) +
                      " bytes (sends and receives between two ranks must pair in order)");
    const std::size_t len = ch.piece_bytes;
    std::memcpy(dst, box, len);
    ch.taken.store(++taken_[src]);
    shm::post(segment_->header());
    dst += len;
    left -= len;
  } while (left > 0);
}

std::vector<int> ShmCommunicator::ranks_not_heard_from(std::uint64_t seq) {
  // Ranks that never reached this operation, or reached it but not the barrier we waited in
  // (one stopped inside it is as silent as one that never came).
  std::vector<int> missing;
  for (int r = 0; r < world_size(); ++r)
    if (r != rank() && (segment_->rank_info(r).op_seq.load() < seq ||
                        segment_->rank_info(r).arrived.load() < barriers_))
      missing.push_back(r);
  return missing;
}

}  // namespace accel
