#include "accelerate/checkpointing/checkpoint.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <filesystem>
#include <set>

#include "backends/comm/host_collectives.hpp"
#include "foundation/unique_fd.hpp"

namespace accel {
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifestName = "MANIFEST";
constexpr const char* kIndexPrefix = ".index.rank";  // per-rank index, merged by rank 0
// Siblings of DIR, each DIR<marker><id>: the save being written, the previous checkpoint moved
// aside, and a directory being deleted (renamed first, so a crash mid-removal never leaves a
// partial copy under a name the loader reads).
constexpr const char* kTmpMarker = ".tmp-";
constexpr const char* kOldMarker = ".old-";
constexpr const char* kTrashMarker = ".trash-";
constexpr std::size_t kIdDigits = 16;

std::function<void(std::string_view)>& stage_hook() {
  static std::function<void(std::string_view)> hook;
  return hook;
}

void at_stage(std::string_view stage) {
  if (stage_hook()) stage_hook()(stage);
}

// "ckpt/" and "ckpt" name the same directory; the sibling names (ckpt.tmp-*) need the latter.
fs::path normalized(const std::string& dir) {
  if (dir.empty()) throw InvalidArgument("checkpoint directory: empty path");
  std::string s = dir;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return fs::path(s);
}

std::string rank_suffix(int rank) { return ".rank" + std::to_string(rank); }

// "NAME.rankR" -> R, or -1 when the name has no rank suffix.
int rank_of(std::string_view name) {
  const std::size_t at = name.rfind(".rank");
  if (at == std::string_view::npos || at + 5 == name.size()) return -1;
  int r = 0;
  for (char c : name.substr(at + 5)) {
    if (c < '0' || c > '9' || r > 1'000'000) return -1;
    r = r * 10 + (c - '0');
  }
  return r;
}

fs::path parent_of(const fs::path& dir) {
  return dir.has_parent_path() ? dir.parent_path() : fs::path(".");
}

// A sibling's id: 16 hex digits, random, so no later run (a restarted container's rank 0 has
// the same pid) makes a name an earlier one left behind.
std::string id_text(std::uint64_t v) {
  char text[kIdDigits + 1];
  std::snprintf(text, sizeof text, "%016" PRIx64, v);
  return text;
}

std::uint64_t fresh_id_value() {
  std::uint64_t v = 0;
  if (::getrandom(&v, sizeof v, 0) != ssize_t(sizeof v)) {
    // No getrandom (old kernel, seccomp): a repeat would then need the same clock reading.
    static std::atomic<std::uint64_t> counter{0};
    v = std::uint64_t(std::chrono::system_clock::now().time_since_epoch().count()) ^
        (std::uint64_t(::getpid()) << 40) ^ counter.fetch_add(0x9e3779b97f4a7c15u);
  }
  return v;
}

std::string fresh_id() { return id_text(fresh_id_value()); }

fs::path sibling(const fs::path& dir, const char* marker, const std::string& id) {
  return dir.string() + marker + id;
}

// Siblings of DIR named DIR<marker><id>, where id is ours: 16 lowercase hex digits, or for
// .tmp- and .old- all digits (the pid, as versions before named them): so a user's own
// "DIR.old-backup" is never read or removed.
std::vector<fs::path> siblings(const fs::path& dir, const std::string& marker) {
  std::vector<fs::path> out;
  const std::string prefix = dir.filename().string() + marker;
  std::error_code ec;
  for (fs::directory_iterator it(parent_of(dir), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix) || name.size() == prefix.size()) continue;
    const std::string id = name.substr(prefix.size());
    const bool digits =
        marker != kTrashMarker && id.find_first_not_of("0123456789") == std::string::npos;
    const bool hex =
        id.size() == kIdDigits && id.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (digits || hex) out.push_back(it->path());
  }
  return out;
}

void write_all(int fd, std::span<const char> bytes, const fs::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    at_stage("fs:write");
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw CheckpointError(path.string() + ": cannot write: " + errno_text(errno));
    done += std::size_t(n);
  }
}

// The file exists with these bytes on disk (fsync'ed) when this returns.
void write_file_synced(const fs::path& path, const std::vector<std::span<const char>>& pieces) {
  at_stage("fs:create");
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw CheckpointError(path.string() + ": cannot create: " + errno_text(errno));
  for (const auto& piece : pieces) write_all(fd.get(), piece, path);
  at_stage("fs:sync");
  if (::fsync(fd.get()) != 0)
    throw CheckpointError(path.string() + ": cannot sync: " + errno_text(errno));
  if (const int err = fd.close(); err != 0)
    throw CheckpointError(path.string() + ": cannot close: " + errno_text(err));
}

void write_file_synced(const fs::path& path, std::string_view text) {
  write_file_synced(path, {std::span<const char>(text.data(), text.size())});
}

// A rename or a new entry is durable once its directory is synced.
void sync_dir(const fs::path& dir) {
  const UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw CheckpointError(dir.string() + ": cannot open to sync: " + errno_text(errno));
  at_stage("fs:sync dir");
  if (::fsync(fd.get()) != 0)
    throw CheckpointError(dir.string() + ": cannot sync: " + errno_text(errno));
}

std::string read_file(const fs::path& path, const std::string& missing_note) {
  const UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const int fd = file.get();
  if (fd < 0) {
    if (errno == ENOENT) throw CheckpointError(path.string() + ": missing" + missing_note);
    throw CheckpointError(path.string() + ": cannot open: " + errno_text(errno));
  }
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(std::size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw CheckpointError(path.string() + ": cannot read: " + errno_text(errno));
    if (n == 0) break;
    out.append(buf, std::size_t(n));
  }
  return out;
}

// A blob's bytes, after checking them against the MANIFEST's size and CRC-32.
std::string read_verified(const fs::path& dir, const BlobEntry& b) {
  const fs::path path = dir / b.name;
  std::string bytes = read_file(path, " (listed in MANIFEST)");
  if (bytes.size() != b.size)
    throw CheckpointError(path.string() + ": size " + std::to_string(bytes.size()) +
                          " bytes, MANIFEST says " + std::to_string(b.size) +
                          " (truncated or changed after the save)");
  const std::uint32_t crc = crc32(bytes);
  if (crc != b.crc32) {
    char line[96];
    std::snprintf(line, sizeof line, ": checksum mismatch (crc32 %08x, MANIFEST says %08x)", crc,
                  b.crc32);
    throw CheckpointError(path.string() + line + ": the file is damaged");
  }
  return bytes;
}

// fs::remove_all, one entry at a time so that a test can crash the process between any two.
// Only for what nothing reads: a directory a loader may consider goes through discard().
void remove_quietly(const fs::path& p) {
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(p, ec)))
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
      remove_quietly(it->path());
  at_stage("fs:remove");
  ::remove(p.c_str());  // leftovers are harmless: the next save removes them again
}

// Removes these siblings of DIR so that a crash at any point leaves each either whole under
// its name or under DIR.trash-<id>, which nothing reads: renamed first (and the renames made
// durable), then deleted. Also finishes the removals an earlier crash interrupted.
void discard(const fs::path& dir, const std::vector<fs::path>& leftovers) {
  bool renamed = false;
  for (const fs::path& p : leftovers) {
    at_stage("fs:rename trash");
    renamed = ::rename(p.c_str(), sibling(dir, kTrashMarker, fresh_id()).c_str()) == 0 || renamed;
  }
  if (renamed) {
    try {
      sync_dir(parent_of(dir));
    } catch (const CheckpointError&) {
      return;  // removal is tidying up: the next save tries again
    }
  }
  for (const fs::path& trash : siblings(dir, kTrashMarker)) remove_quietly(trash);
}

// Rank 0's part of step 1: DIR.tmp-<id>, after checking DIR may be replaced.
void prepare_tmp_dir(const fs::path& dir, const fs::path& tmp) {
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status))
      throw CheckpointError(dir.string() + ": exists and is not a directory; not replacing it");
    if (!fs::exists(dir / kManifestName) && !fs::is_empty(dir, ec))
      throw CheckpointError(dir.string() +
                            ": exists, is not empty and has no MANIFEST (not a checkpoint); "
                            "not replacing it");
  }
  if (dir.has_parent_path()) {
    fs::create_directories(dir.parent_path(), ec);
    if (ec)
      throw CheckpointError(dir.string() + ": cannot create " + dir.parent_path().string() + ": " +
                            ec.message());
  }
  discard(dir, siblings(dir, kTmpMarker));
  at_stage("fs:mkdir");
  if (::mkdir(tmp.c_str(), 0755) != 0)
    throw CheckpointError(tmp.string() + ": cannot create: " + errno_text(errno));
}

void check_names(const CheckpointContents& contents) {
  for (const BlobView& b : contents.shared) {
    check_blob_name(b.name);
    ACCEL_CHECK_ARG(b.name != kManifestName && rank_of(b.name) < 0,
                    "checkpoint blob name '" + b.name + "' is reserved (MANIFEST, NAME.rankR)");
  }
  for (const BlobView& b : contents.per_rank) check_blob_name(b.name);
}

// Step 2 on every rank: the blobs, each synced (the shared ones by the writer of this
// directory), and the index the writer builds MANIFEST from.
void write_rank_blobs(const fs::path& tmp, int rank, bool writer,
                      const CheckpointContents& contents) {
  check_names(contents);
  std::error_code ec;
  if (!fs::is_directory(tmp, ec))
    throw CheckpointError(tmp.string() + ": rank " + std::to_string(rank) +
                          " does not see the directory its writer made: every rank must see "
                          "the checkpoint directory (a shared filesystem), or save with "
                          "save_on_each_node (a copy on each machine)");
  std::string index;
  auto put = [&](const std::string& name, const std::vector<std::span<const char>>& pieces) {
    write_file_synced(tmp / name, pieces);
    std::uint64_t size = 0;
    std::uint32_t crc = 0;
    for (const auto& piece : pieces) {
      size += piece.size();
      crc = crc32(piece, crc);
    }
    index += name + " " + std::to_string(size) + " " + std::to_string(crc) + "\n";
  };
  if (writer)
    for (const BlobView& b : contents.shared) put(b.name, b.pieces);
  for (const BlobView& b : contents.per_rank) put(b.name + rank_suffix(rank), b.pieces);
  write_file_synced(tmp / (kIndexPrefix + std::to_string(rank)), index);
}

// Step 3 on the writer: the indexes of the ranks whose blobs are here merged into MANIFEST.
Manifest merge_indexes(const fs::path& tmp, const CheckpointContents& contents, int world,
                       const std::vector<int>& ranks) {
  Manifest m;
  m.meta = contents.meta;
  m.meta.world_size = world;
  m.meta.rank_files = world;
  std::set<std::string> names;
  for (const int r : ranks) {
    const fs::path index_path = tmp / (kIndexPrefix + std::to_string(r));
    const std::string index = read_file(
        index_path, " (rank " + std::to_string(r) +
                        " wrote it; every rank must see the checkpoint directory, e.g. on a "
                        "shared filesystem, or save with save_on_each_node)");
    std::size_t pos = 0;
    while (pos < index.size()) {
      const std::size_t nl = index.find('\n', pos);
      const std::string line = index.substr(pos, nl - pos);
      pos = nl == std::string::npos ? index.size() : nl + 1;
      BlobEntry b;
      const std::size_t s1 = line.find(' '), s2 = line.rfind(' ');
      b.name = line.substr(0, s1);
      b.size = std::stoull(line.substr(s1 + 1, s2 - s1 - 1));
      b.crc32 = std::uint32_t(std::stoul(line.substr(s2 + 1)));
      if (!names.insert(b.name).second)
        throw CheckpointError(tmp.string() + ": two blobs named '" + b.name + "'");
      m.blobs.push_back(std::move(b));
    }
    remove_quietly(index_path);
  }
  return m;
}

// Step 3's renames: DIR is absent or complete at every instant, and nothing is removed before
// the new DIR is in place (with DIR absent, a DIR.old-* may be the only complete copy).
void install(const fs::path& tmp, const fs::path& dir) {
  const fs::path old = sibling(dir, kOldMarker, fresh_id());
  std::error_code ec;
  const bool had_old = fs::exists(dir, ec);
  if (had_old) at_stage("fs:rename aside");
  if (had_old && ::rename(dir.c_str(), old.c_str()) != 0)
    throw CheckpointError(dir.string() + ": cannot move aside to " + old.string() + ": " +
                          errno_text(errno));
  at_stage("moved_aside");
  at_stage("fs:rename in");
  if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    const int err = errno;
    if (had_old) ::rename(old.c_str(), dir.c_str());  // put the previous one back
    throw CheckpointError(dir.string() + ": cannot rename " + tmp.string() +
                          " into place: " + errno_text(err));
  }
  sync_dir(parent_of(dir));
  at_stage("renamed");
  discard(dir, siblings(dir, kOldMarker));
}

}  // namespace

// Doubles as the barrier between the stages of a save.
int first_failed_rank(Communicator& comm, bool ok) {
  std::int64_t v = ok ? comm.world_size() : comm.rank();
  all_reduce_values(comm, buffer_of(std::span(&v, 1)), ReduceOp::min);
  return v < comm.world_size() ? int(v) : -1;
}

namespace {

// Every rank throws when one failed: its own error there, "DIR: rank R could not WHAT (see its
// error)" on the others; `remove` (a writer's DIR.tmp-<id>, or nothing) goes first.
void agree_or_throw(Communicator& comm, const fs::path& dir, const std::string& error,
                    const char* what, const fs::path& remove = {}) {
  const int failed = first_failed_rank(comm, error.empty());
  if (failed < 0) return;
  if (!remove.empty()) remove_quietly(remove);
  if (!error.empty()) throw CheckpointError(error);
  throw CheckpointError(dir.string() + ": rank " + std::to_string(failed) + " could not " + what +
                        " (see its error)");
}

bool is_writer(const CheckpointPlacement& placement, int rank) {
  return placement.node_ranks.empty() ? rank == 0 : placement.node_ranks.front() == rank;
}

// A writer's mark in its DIR.tmp-<id> (save_on_each_node): finding another machine's there, or
// not its own, means the machines share DIR's filesystem.
std::string writer_mark(int rank) { return ".writer.rank" + std::to_string(rank); }

// Step 1: rank 0 draws the id; each directory's writer prepares DIR.tmp-<id>. Saved on each
// node, the writers then check that no two of them share a directory.
fs::path agree_on_tmp_dir(Communicator& comm, const fs::path& dir,
                          const CheckpointPlacement& placement, std::string& save_id) {
  std::int64_t id = comm.rank() == 0 ? std::int64_t(fresh_id_value()) : 0;
  broadcast_values(comm, buffer_of(std::span(&id, 1)), 0);
  save_id = id_text(std::uint64_t(id));
  const fs::path tmp = sibling(dir, kTmpMarker, save_id);
  const bool writer = is_writer(placement, comm.rank());
  const bool on_each_node = !placement.node_ranks.empty();
  // Every rank throws when one failed, the writers after removing what they made.
  auto fail_together = [&](const std::string& error) {
    agree_or_throw(comm, dir, error, "prepare the checkpoint", writer ? tmp : fs::path());
  };
  const std::string shared_dir =
      dir.string() + ": the machines share this directory (another machine wrote " + tmp.string() +
      " too): save_on_each_node is for machines without a shared filesystem; turn it off";
  std::string error;
  bool made = false;
  try {
    // The id is fresh: DIR.tmp-<id> there already is another writer's.
    if (writer && on_each_node && fs::exists(tmp)) throw CheckpointError(shared_dir);
    if (writer) prepare_tmp_dir(dir, tmp);
    made = writer;
    if (writer && on_each_node) write_file_synced(tmp / writer_mark(comm.rank()), std::string());
  } catch (const std::exception& e) {
    error = on_each_node && !made && fs::exists(tmp) ? shared_dir : e.what();
  }
  fail_together(error);
  if (!on_each_node) return tmp;
  if (writer) {  // every writer's mark is in place now
    std::error_code ec;
    bool mine = false, others = false;
    for (fs::directory_iterator it(tmp, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      mine = mine || name == writer_mark(comm.rank());
      others = others || (name.rfind(".writer.rank", 0) == 0 && name != writer_mark(comm.rank()));
    }
    if (!mine || others) error = shared_dir;
    remove_quietly(tmp / writer_mark(comm.rank()));
  }
  fail_together(error);
  return tmp;
}

// Step 2: every rank's blobs; a failure on any rank fails the save on all.
void write_all_blobs(Communicator& comm, const fs::path& dir, const fs::path& tmp, bool writer,
                     const CheckpointContents& contents) {
  std::string error;
  try {
    write_rank_blobs(tmp, comm.rank(), writer, contents);
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(comm, dir, error, "write its part of the checkpoint", writer ? tmp : fs::path());
}

// Step 3: each writer writes MANIFEST and swaps the directories; step 4: everyone hears how
// it went.
void finish_on_writers(Communicator& comm, const fs::path& dir, const fs::path& tmp,
                       const CheckpointContents& contents, const CheckpointPlacement& placement,
                       const std::string& save_id) {
  std::string error;
  if (is_writer(placement, comm.rank())) {
    bool installed = false;
    try {
      at_stage("blobs_written");
      std::vector<int> ranks = placement.node_ranks;
      if (ranks.empty())
        for (int r = 0; r < comm.world_size(); ++r) ranks.push_back(r);
      Manifest manifest = merge_indexes(tmp, contents, comm.world_size(), ranks);
      if (!placement.node_ranks.empty()) {
        manifest.node_ranks = placement.node_ranks;
        manifest.save_id = save_id;
      }
      write_file_synced(tmp / kManifestName, format_manifest(manifest));
      sync_dir(tmp);
      at_stage("manifest_written");
      install(tmp, dir);
      installed = true;
    } catch (const std::exception& e) {
      error = e.what();
      if (!installed) remove_quietly(tmp);
    }
  }
  agree_or_throw(comm, dir, error, "complete the checkpoint");
}

}  // namespace

void save_checkpoint(Communicator& comm, const std::string& dir_name,
                     const CheckpointContents& contents, const CheckpointPlacement& placement) {
  const fs::path dir = normalized(dir_name);
  std::string save_id;
  const fs::path tmp = agree_on_tmp_dir(comm, dir, placement, save_id);
  write_all_blobs(comm, dir, tmp, is_writer(placement, comm.rank()), contents);
  finish_on_writers(comm, dir, tmp, contents, placement, save_id);
}

std::string resolve_checkpoint_dir(const std::string& dir_name) {
  const fs::path dir = normalized(dir_name);
  std::error_code ec;
  // An empty directory is no checkpoint (e.g. made by `mkdir -p` before the first run).
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    return dir.string();
  // DIR was moved aside and the new one not yet renamed in: the moved one is complete (never
  // partly removed: see discard). There are several when an earlier save crashed before its
  // removal; the newest save wins.
  fs::path best;
  fs::file_time_type best_time{};
  for (const fs::path& old : siblings(dir, kOldMarker)) {
    const auto t = fs::last_write_time(old / kManifestName, ec);  // when that save finished
    if (!ec && (best.empty() || t > best_time)) {
      best = old;
      best_time = t;
    }
  }
  return best.string();
}

bool checkpoint_exists(const std::string& dir) { return !resolve_checkpoint_dir(dir).empty(); }

const std::string& LoadedCheckpoint::shared_blob(const std::string& name) const {
  const auto it = shared.find(name);
  if (it == shared.end())
    throw CheckpointError((fs::path(dir) / name).string() + ": missing (not in MANIFEST)");
  return it->second;
}

namespace {
// "0, 1" (the ranks a machine's copy holds).
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (const int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}
}  // namespace

std::string read_blob(const LoadedCheckpoint& ck, const std::string& file) {
  for (const BlobEntry& b : ck.blobs)
    if (b.name == file) return read_verified(fs::path(ck.dir), b);
  if (!ck.node_ranks.empty())
    throw CheckpointError((fs::path(ck.dir) / file).string() +
                          ": not in this machine's copy (saved with save_on_each_node, it holds "
                          "the blobs of ranks " +
                          rank_list(ck.node_ranks) +
                          " only): resume with the same ranks on each machine, or put every "
                          "machine's files into one directory first");
  throw CheckpointError((fs::path(ck.dir) / file).string() + ": missing (not in MANIFEST)");
}

LoadedCheckpoint read_checkpoint(const std::string& dir_name, int rank, int world_size) {
  LoadedCheckpoint out;
  out.dir = resolve_checkpoint_dir(dir_name);
  if (out.dir.empty())
    throw CheckpointError(normalized(dir_name).string() +
                          ": no checkpoint there (no such directory, or an empty one)");
  const fs::path dir(out.dir);
  const fs::path manifest_path = dir / kManifestName;
  const Manifest manifest = parse_manifest(
      read_file(manifest_path, " (not a checkpoint, or one whose save never finished)"),
      manifest_path.string());
  out.meta = manifest.meta;
  out.per_rank_loaded = manifest.meta.world_size == world_size;
  out.node_ranks = manifest.node_ranks;
  out.save_id = manifest.save_id;
  if (out.per_rank_loaded && !out.node_ranks.empty() &&
      std::find(out.node_ranks.begin(), out.node_ranks.end(), rank) == out.node_ranks.end())
    throw CheckpointError(out.dir + ": rank " + std::to_string(rank) +
                          "'s blobs are not in this machine's copy (saved with "
                          "save_on_each_node, it holds ranks " +
                          rank_list(out.node_ranks) +
                          "): resume with the same ranks on each machine, or put every "
                          "machine's files into one directory first");

  out.blobs = manifest.blobs;
  for (const BlobEntry& b : manifest.blobs) {
    const int owner = rank_of(b.name);
    if (owner >= 0 && (!out.per_rank_loaded || owner != rank)) continue;  // another rank's
    std::string bytes = read_verified(dir, b);
    if (owner >= 0)
      out.per_rank[b.name.substr(0, b.name.size() - rank_suffix(owner).size())] = std::move(bytes);
    else
      out.shared[b.name] = std::move(bytes);
  }
  return out;
}

LoadedCheckpoint load_checkpoint(Communicator& comm, const std::string& dir,
                                 const CheckpointPlacement& placement) {
  LoadedCheckpoint out;
  std::string error;
  try {
    out = read_checkpoint(dir, comm.rank(), comm.world_size());
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Nobody applies a checkpoint another rank could not read.
  agree_or_throw(comm, normalized(dir), error, "read the checkpoint");
  if (!placement.node_ranks.empty()) {
    // Each machine read its own copy: all must be of one save (a save that failed on one
    // machine after another installed its copy leaves them apart).
    const std::uint64_t id = out.save_id.empty() ? 0 : std::stoull(out.save_id, nullptr, 16);
    std::int64_t range[2] = {std::int64_t(id >> 1), -std::int64_t(id >> 1)};
    all_reduce_values(comm, buffer_of(std::span<std::int64_t>(range)), ReduceOp::min);
    if (range[0] != -range[1])
      throw CheckpointError(normalized(dir).string() +
                            ": the machines' copies are of different saves (save_id " +
                            (out.save_id.empty() ? "none" : out.save_id) +
                            " here): a save failed on some machine; load an older checkpoint");
  }
  // A removal a crash interrupted is finished here, so a job that resumes and ends without
  // saving again leaves nothing half-deleted. (DIR.tmp-* and DIR.old-* wait for the next save:
  // another process may be saving to DIR right now.)
  if (is_writer(placement, comm.rank())) discard(normalized(dir), {});
  return out;
}

void remove_checkpoint(const std::string& dir) {
  const fs::path path = normalized(dir);
  std::vector<fs::path> gone;
  std::error_code ec;
  if (fs::exists(path, ec)) gone.push_back(path);
  for (const char* marker : {kOldMarker, kTmpMarker})
    for (const fs::path& p : siblings(path, marker)) gone.push_back(p);
  discard(path, gone);
}

namespace checkpoint_testing {
void set_stage_hook(std::function<void(std::string_view stage)> hook) {
  stage_hook() = std::move(hook);
}
}  // namespace checkpoint_testing

}  // namespace accel
