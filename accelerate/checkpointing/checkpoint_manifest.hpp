#pragma once
// The MANIFEST of a checkpoint directory: plain `key: value` text (no YAML library in
// accel_accelerate), written last, so a directory with a valid manifest is a complete checkpoint.
//
//   accelerate-cpp checkpoint
//   format_version: 1
//   world_size: 2
//   rank_files: 2
//   step: 14
//   epoch: 1
//   batch: 3
//   seed: 42
//   blob: parameters 5130 1c291ca3
//   blob: rng.rank0 6980 0a9b7e21
//   end: 3f0a11d2
//
// A copy saved on one machine of several (save_on_each_node) adds, after seed:
//   node_ranks: 2,3            the ranks whose per-rank blobs this copy holds
//   save_id: 9f86d081884c7d65  the save it belongs to, the same in every machine's copy
// Each blob line is "NAME SIZE CRC32" (size in bytes, CRC-32 in hex). The end line carries the
// CRC-32 of every byte before it: a truncated manifest lacks it, a flipped byte breaks it.
// Unknown keys are an error rather than ignored: a manifest from a newer format must not be
// half-understood.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "foundation/error.hpp"

namespace accel {

inline constexpr int kCheckpointFormatVersion = 1;

// Where the training loop was when it saved, and what it needs to continue.
struct CheckpointMeta {
  int world_size = 1;       // processes of the job that saved it
  int rank_files = 1;       // processes that wrote per-rank blobs (NAME.rankR)
  std::uint64_t step = 0;   // optimizer steps taken
  std::uint64_t epoch = 0;  // the epoch to continue in...
  std::uint64_t batch = 0;  // ...at this batch (batches already done in it)
  std::uint64_t seed = 0;   // the job's seed (set_seed)
  // global_batch_size of the job that saved it (0: none): batch b is then the same samples
  // at any world size, so a mid-epoch checkpoint resumes at another size.
  std::uint64_t global_batch_size = 0;
};

struct BlobEntry {
  std::string name;  // file name inside the checkpoint directory
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  CheckpointMeta meta;
  std::vector<int> node_ranks;  // empty: every rank's blobs are here (one shared directory)
  std::string save_id;          // with node_ranks
  std::vector<BlobEntry> blobs;
};

std::string format_manifest(const Manifest& manifest);
// Throws CheckpointError "PATH: ..." naming the line that is wrong.
Manifest parse_manifest(std::string_view text, const std::string& path);

// CRC-32 (IEEE 802.3, as zlib and gzip), continuable: crc32(b, crc32(a)) == crc32(a + b).
std::uint32_t crc32(std::span<const char> bytes, std::uint32_t crc = 0);

// Blob names become file names: letters, digits, '.', '_' and '-', not starting with '.',
// at most 200 characters. Throws InvalidArgument otherwise.
void check_blob_name(std::string_view name);

}  // namespace accel
