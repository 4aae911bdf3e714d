// Accelerator::save_state() / load_state() / latest_checkpoint() without a directory:
// Accelerate's ProjectConfiguration (automatic_checkpoint_naming, total_limit). The named
// checkpoints are project_dir/checkpoints/checkpoint_<i>; each is installed whole by
// save_checkpoint (checkpoint.hpp), so "complete" is "exists by the recovery rule".

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "accelerate/checkpointing/checkpoint.hpp"
#include "backends/comm/host_collectives.hpp"
#include "config/config.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kPrefix = "checkpoint_";

std::string named_dir(const std::string& root, std::uint64_t i) {
  return (fs::path(root) / (std::string(kPrefix) + std::to_string(i))).string();
}

// The index every entry checkpoint_<i>[.<marker>-<id>] under `root` names (complete or a
// leftover of a crash: DIR.tmp-*, DIR.old-*, DIR.trash-*).
std::set<std::uint64_t> named_indices(const std::string& root) {
  std::set<std::uint64_t> indices;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const std::string rest = name.substr(kPrefix.size());
    const std::string digits = rest.substr(0, rest.find('.'));
    if (digits.empty() || digits.size() > 18 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    indices.insert(std::stoull(digits));
  }
  return indices;
}

// The complete named checkpoints under `root`, oldest first, as (index, directory). A save
// that crashed between its two renames left its predecessor as checkpoint_<i>.old-<id> only:
// checkpoint_exists finds that through the plain name (the recovery rule); checkpoint_3.tmp-*
// and the like are never read.
std::vector<std::pair<std::uint64_t, std::string>> named_checkpoints(const std::string& root) {
  std::vector<std::pair<std::uint64_t, std::string>> out;
  for (const std::uint64_t i : named_indices(root))
    if (checkpoint_exists(named_dir(root, i))) out.emplace_back(i, named_dir(root, i));
  return out;
}

}  // namespace

std::string Accelerator::checkpoints_dir(const char* call) const {
  ACCEL_CHECK_ARG(config_->automatic_checkpoint_naming,
                  std::string(call) +
                      " without a directory needs automatic_checkpoint_naming true (config key, "
                      "accel launch --automatic_checkpoint_naming, or AcceleratorOptions), "
                      "which names the checkpoints project_dir/checkpoints/checkpoint_<i>");
  return (fs::path(config_->project_dir) / "checkpoints").string();
}

std::string Accelerator::save_state() {
  const std::string root = checkpoints_dir("save_state()");
  // Rank 0 (each machine's first rank, saved on each node) looks; the index is one past the
  // newest anyone saw.
  const bool writer = writes_shared_checkpoint_files();
  std::int64_t next = 0;
  std::string error;
  if (writer) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) error = "save_state(): cannot create " + root + ": " + ec.message();
    const auto existing = named_checkpoints(root);
    if (!existing.empty()) next = std::int64_t(existing.back().first) + 1;
  }
  const int failed = first_failed_rank(comm(), error.empty());
  if (failed >= 0)
    throw CheckpointError(error.empty() ? "save_state(): rank " + std::to_string(failed) +
                                              " cannot create " + root
                                        : error);
  all_reduce_values(comm(), buffer_of(std::span(&next, 1)), ReduceOp::max);
  const std::string dir = named_dir(root, std::uint64_t(next));
  save_state(dir);
  // Only now, with the new one complete: the oldest beyond total_limit go.
  if (config_->total_limit > 0 && writer) {
    auto existing = named_checkpoints(root);
    for (std::size_t k = 0; k + std::size_t(config_->total_limit) < existing.size(); ++k)
      remove_checkpoint(existing[k].second);
  }
  // What crashes left of other indices (a save never installed, a removal cut short): none
  // of it is read, and it would pile up.
  if (writer)
    for (const std::uint64_t i : named_indices(root))
      if (!checkpoint_exists(named_dir(root, i))) remove_checkpoint(named_dir(root, i));
  return dir;
}

std::string Accelerator::latest_checkpoint() {
  const std::string root = checkpoints_dir("latest_checkpoint()");
  // The newest every writer has (a save that failed on one machine is not it).
  std::int64_t newest = std::numeric_limits<std::int64_t>::max();
  if (writes_shared_checkpoint_files()) {
    const auto existing = named_checkpoints(root);
    newest = existing.empty() ? -1 : std::int64_t(existing.back().first);
  }
  all_reduce_values(comm(), buffer_of(std::span(&newest, 1)), ReduceOp::min);
  if (newest < 0) return "";
  return named_dir(root, std::uint64_t(newest));
}

void Accelerator::load_state() {
  const std::string dir = latest_checkpoint();
  if (dir.empty())
    throw CheckpointError("load_state(): no complete checkpoint under " +
                          checkpoints_dir("load_state()") +
                          " (save_state() without a directory writes them there)");
  load_state(dir);
}

}  // namespace accel
