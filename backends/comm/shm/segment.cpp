#include "backends/comm/shm/segment.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <vector>

#include "backends/comm/communicator.hpp"
#include "foundation/error.hpp"
#include "foundation/store/store_join.hpp"
#include "foundation/unique_fd.hpp"

namespace accel::shm {
namespace {

constexpr const char* kPrefix = "accel-shm-";

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

[[noreturn]] void throw_errno(const std::string& what) {
  throw CommError("shm: " + what + ": " + errno_text(errno));
}

// The pid namespace the pid in a segment's name means something in.
unsigned long long pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

}  // namespace

std::uint64_t process_start_time(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return 0;
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string state;
  fields >> state;  // field 3
  if (state == "Z" || state == "X" || state == "x") return 0;
  std::string skip;
  for (int field = 4; field < 22; ++field) fields >> skip;
  std::uint64_t start = 0;
  fields >> start;
  return start;
}

void remove_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (!name.starts_with(kPrefix)) continue;
    // Only names from this pid namespace: elsewhere (a container sharing /dev/shm) the same
    // pid number is another process, and a live creator would look dead from here.
    unsigned long long ns = 0;
    int pid = 0;
    if (std::sscanf(name.c_str() + std::strlen(kPrefix), "%llu-%d-", &ns, &pid) != 2 ||
        ns != pid_namespace() || pid <= 0)
      continue;
    struct stat st {};
    if (fstatat(dirfd(dir), name.c_str(), &st, 0) != 0 || st.st_uid != geteuid()) continue;
    if (process_start_time(pid) == 0) stale.push_back(name);
  }
  closedir(dir);
  for (const auto& name : stale) shm_unlink(("/" + name).c_str());
}

Segment::Segment(const StorePtr& store, int rank, int world, std::size_t slot_bytes,
                 std::size_t mailbox_bytes, Milliseconds timeout, SegmentKind kind)
    : rank_(rank),
      world_(world),
      slot_bytes_(slot_bytes),
      mailbox_bytes_(mailbox_bytes),
      kind_(kind) {
  if (rank_ == 0)
    create_and_publish(store);
  else
    open_published(store, timeout);

  RankInfo& me = rank_info(rank_);
  me.start_time.store(process_start_time(getpid()));
  me.pid.store(getpid());
  // Everyone waits for everyone, so the group is complete when the constructor returns and a
  // rank that never comes is named here.
  const std::vector<int> missing = join_on_store(*store, "mapped/", rank_, world_, timeout);
  if (!missing.empty()) {
    if (linked_) {
      shm_unlink(name_.c_str());
      linked_ = false;
    }
    munmap(base_, total_bytes_);
    throw TimeoutError("rank " + std::to_string(rank_) + ": shm group timed out after " +
                       std::to_string(timeout.count()) + " ms waiting for ranks " +
                       format_ranks(missing) + " of " + std::to_string(world_) + " to join");
  }
  if (linked_) {
    // Every rank holds a mapping: the name is no longer needed, and without it nothing can
    // outlive the job.
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

Segment::~Segment() {
  if (linked_) shm_unlink(name_.c_str());
  if (base_) munmap(base_, total_bytes_);
}

void Segment::compute_layout() {
  std::size_t offset = round_up(sizeof(Header), 64);
  rank_offset_ = offset;
  offset += sizeof(RankInfo) * std::size_t(world_);
  channel_offset_ = offset;
  offset += sizeof(Channel) * std::size_t(world_) * std::size_t(world_);
  data_offset_ = round_up(offset, kControlAlign);
  if (kind_ == SegmentKind::symmetric) {
    mailbox_offset_ = small_offset_ = data_offset_ + slot_bytes_ * std::size_t(world_);
    total_bytes_ = round_up(mailbox_offset_, kControlAlign);
    return;
  }
  mailbox_offset_ = data_offset_ + slot_bytes_ * std::size_t(world_ + 1);
  small_offset_ = mailbox_offset_ + mailbox_bytes_ * std::size_t(world_) * world_;
  total_bytes_ = round_up(small_offset_ + 2 * kSmallBytes * std::size_t(world_), kControlAlign);
}

void Segment::create_and_publish(const StorePtr& store) {
  remove_stale_segments();
  compute_layout();
  std::random_device random;
  const std::uint64_t nonce = (std::uint64_t(random()) << 32) ^ random();
  char name[96];
  std::snprintf(name, sizeof name, "/%s%llu-%d-%016llx", kPrefix, pid_namespace(), int(getpid()),
                static_cast<unsigned long long>(nonce));
  name_ = name;
  // O_EXCL: never adopt an existing segment, whoever left it.
  UniqueFd fd(shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (!fd) throw_errno("shm_open(" + name_ + ")");
  linked_ = true;
  if (ftruncate(fd.get(), off_t(total_bytes_)) != 0)
    throw_errno("ftruncate(" + name_ + ", " + std::to_string(total_bytes_) + ")");
  // Allocate every page now, zeroed, in one call: a full /dev/shm is then an error here, not
  // a SIGBUS at the first touch, and it is far cheaper than faulting the pages in one by one.
  // The pages are the tmpfs's (huge where shmem_enabled is always or within_size).
  if (const int err = posix_fallocate(fd.get(), 0, off_t(total_bytes_)); err != 0) {
    fd.reset();
    shm_unlink(name_.c_str());
    linked_ = false;
    const std::string why = "shm: /dev/shm has no room for " + std::to_string(total_bytes_ >> 20) +
                            " MiB (" + errno_text(err) +
                            "): free some, or give the container a bigger /dev/shm "
                            "(docker run --shm-size)";
    store->set("segment", "unavailable " + why);
    throw SegmentUnavailable(why);
  }
  // MAP_POPULATE: this rank's page tables are filled now, not on the first collective.
  void* p =
      mmap(nullptr, total_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) throw_errno("mmap(" + name_ + ")");
  fd.reset();  // the mapping keeps the segment
  base_ = static_cast<char*>(p);

  Header* h = new (base_) Header{};
  h->magic = kMagic;
  h->nonce = nonce;
  h->version = kVersion;
  h->world = std::uint32_t(world_);
  h->kind = kind_;
  h->slot_bytes = slot_bytes_;
  h->mailbox_bytes = mailbox_bytes_;
  h->total_bytes = total_bytes_;
  for (int r = 0; r < world_; ++r) new (&rank_info(r)) RankInfo{};
  for (int s = 0; s < world_; ++s)
    for (int d = 0; d < world_; ++d) new (&channel(s, d)) Channel{};
  std::atomic_thread_fence(std::memory_order_seq_cst);

  char published[128];
  std::snprintf(published, sizeof published, "%s %016llx", name_.c_str(),
                static_cast<unsigned long long>(nonce));
  store->set("segment", published);
}

void Segment::open_published(const StorePtr& store, Milliseconds timeout) {
  std::string published;
  try {
    published = store->get("segment", timeout);
  } catch (const TimeoutError&) {
    throw TimeoutError("rank " + std::to_string(rank_) + ": shm group timed out after " +
                       std::to_string(timeout.count()) +
                       " ms waiting for rank 0 to create the shared-memory segment");
  }
  if (published.starts_with("unavailable "))
    throw SegmentUnavailable(published.substr(std::strlen("unavailable ")) + " (rank 0 found)");
  const auto space = published.find(' ');
  if (space == std::string::npos)
    throw CommError("shm: malformed segment record '" + published + "'");
  name_ = published.substr(0, space);
  const std::uint64_t nonce = std::stoull(published.substr(space + 1), nullptr, 16);
  UniqueFd fd(shm_open(name_.c_str(), O_RDWR, 0));
  if (!fd)
    throw_errno("rank " + std::to_string(rank_) + " cannot open rank 0's segment " + name_ +
                " (are all ranks on one host, in one IPC namespace?)");
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) throw_errno("fstat(" + name_ + ")");
  total_bytes_ = std::size_t(st.st_size);
  // MAP_POPULATE: this rank's page tables are filled now, not on the first collective.
  void* p =
      mmap(nullptr, total_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) throw_errno("mmap(" + name_ + ")");
  fd.reset();  // the mapping keeps the segment
  base_ = static_cast<char*>(p);
  const Header& h = header();
  if (h.magic != kMagic || h.nonce != nonce || h.version != kVersion ||
      h.world != std::uint32_t(world_) || h.kind != kind_) {
    munmap(base_, total_bytes_);
    base_ = nullptr;
    throw CommError("shm: segment " + name_ + " is not the one rank 0 published for a world of " +
                    std::to_string(world_) + " (or not of the kind expected)");
  }
  slot_bytes_ = h.slot_bytes;  // rank 0 decides the sizes
  mailbox_bytes_ = h.mailbox_bytes;
  const std::size_t mapped = total_bytes_;
  compute_layout();
  if (total_bytes_ != h.total_bytes || total_bytes_ != mapped) {
    munmap(base_, mapped);
    base_ = nullptr;
    throw CommError("shm: segment " + name_ + " has the wrong size");
  }
}

}  // namespace accel::shm
