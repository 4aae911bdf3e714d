#pragma once
// Checkpoint directories: named binary blobs plus a MANIFEST (checkpoint_manifest.hpp),
// written so that a crash at any moment leaves a complete checkpoint, and read back only
// after every byte was checked.
//
// Layout of DIR:
//   MANIFEST              written last: format, world size, position, seed, each blob's
//                         name, size and CRC-32
//   NAME                  a shared blob, written by rank 0 (e.g. parameters: DDP replicas are
//                         equal, so one copy is enough)
//   NAME.rankR            a per-rank blob, written by rank R (e.g. its RNG state)
//
// Writing (save_checkpoint, every rank calls it):
//   1. rank 0 draws <id> and broadcasts it, then removes stale DIR.tmp-* and creates
//      DIR.tmp-<id>; the ranks agree that it worked;
//   2. every rank writes its blobs there, each fsync'ed, plus a small index of their sizes
//      and checksums; the ranks agree that every rank succeeded (an all-reduce, so a failure
//      on one rank fails the save on all instead of leaving the others waiting);
//   3. rank 0 merges the indexes into MANIFEST, fsyncs it and the directory, renames DIR to
//      DIR.old-<id>, renames DIR.tmp-<id> to DIR, fsyncs the parent, and only then removes
//      every DIR.old-*;
//   4. the ranks agree on the outcome (every rank returns, or throws, together).
// So DIR is only ever absent or complete. All ranks must see the same filesystem at DIR (a
// shared one across machines): rank 0 reads the other ranks' indexes and says so if it cannot.
// Machines without one save on each node instead (CheckpointPlacement): the same steps, with
// each machine's first rank in rank 0's place for its own copy.
// Each <id> is 16 random hex digits, so no later run (a restarted container's rank 0 has the
// same pid) reuses a name an earlier one left. A directory is removed by renaming it to
// DIR.trash-<id> first, then deleting that: a crash mid-removal leaves nothing partial under
// a name the loader reads; the next save, or the next load_checkpoint, finishes the removal.
//
// Recovery rule (resolve_checkpoint_dir): DIR if it exists (and is not an empty directory,
// which counts as no checkpoint); else the newest DIR.old-<id> with a MANIFEST (a crash
// between the two renames of step 3: that is the previous complete checkpoint); DIR.tmp-* and
// DIR.trash-* are never read. Only names with our ids (or all digits: a pid, as versions before
// wrote) are read or removed, so a user's DIR.old-backup is left alone. A non-empty DIR without
// a MANIFEST is not ours (or is damaged): saving refuses to replace it, loading reports it.
//
// Reading (load_checkpoint): every rank reads the manifest, the shared blobs and its own
// per-rank blobs into memory and checks each size and CRC-32 before anything is returned;
// the ranks agree, so either all get the data or all throw. Errors are CheckpointError
// naming the file and what is wrong with it.

#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "backends/comm/communicator.hpp"

namespace accel {

// A blob to write: views of bytes the caller keeps alive during save_checkpoint, written one
// after the other into one file (so parameters scattered over many buffers are saved without
// first copying them together).
struct BlobView {
  std::string name;  // see check_blob_name; per-rank blobs get ".rankR" appended
  std::vector<std::span<const char>> pieces;
};

struct CheckpointContents {
  CheckpointMeta meta;             // rank 0's is written; world_size and rank_files are filled in
  std::vector<BlobView> shared;    // the writer's (rank 0's; see CheckpointPlacement) are written
  std::vector<BlobView> per_rank;  // every rank's, as NAME.rankR
};

// Where the files go. By default DIR is one directory every rank sees (a shared filesystem):
// rank 0 writes the shared blobs and MANIFEST. With node_ranks (Accelerate's
// save_on_each_node), each machine has a DIR of its own: the first rank of each machine
// (node_ranks.front()) plays rank 0's part there, for the shared blobs (so every rank's
// CheckpointContents holds them) and a MANIFEST of its machine's ranks' blobs; a save id in
// every copy lets load_checkpoint check that all machines read the same save. Writers that
// find each other's marks in DIR.tmp-<id> (a shared filesystem after all) fail the save,
// saying so.
struct CheckpointPlacement {
  std::vector<int> node_ranks;  // this rank's machine's ranks, ascending; empty: shared DIR
};

void save_checkpoint(Communicator& comm, const std::string& dir, const CheckpointContents& contents,
                     const CheckpointPlacement& placement = {});

// One rank's view of a verified checkpoint.
struct LoadedCheckpoint {
  std::string dir;  // the directory actually read: DIR, or a DIR.old-* after a crash
  CheckpointMeta meta;
  std::map<std::string, std::string> shared;    // every shared blob, by name
  std::map<std::string, std::string> per_rank;  // this rank's blobs, by name without ".rankR"
  // Empty when the checkpoint was saved by a different number of processes: which rank's
  // blobs belong to whom is then undefined, and the caller decides whether that matters.
  bool per_rank_loaded = false;
  std::vector<BlobEntry> blobs;  // every blob the MANIFEST lists, loaded here or not
  std::vector<int> node_ranks;   // saved on each node: the ranks whose blobs this copy holds
  std::string save_id;           // ...and the save, the same in every machine's copy

  const std::string& shared_blob(const std::string& name) const;
};

// Any blob FILE the MANIFEST lists (e.g. another rank's "parameters.rank3"), read from ck.dir
// and checked against its size and CRC-32 like those load_checkpoint reads; CheckpointError
// naming the file when it is not listed, missing or damaged.
std::string read_blob(const LoadedCheckpoint& ck, const std::string& file);

// Reads and verifies on every rank, then agrees: returns on all ranks or throws on all. Rank 0
// then deletes any DIR.trash-* a crash left.
// With node_ranks, each machine reads its own copy, and all must be of one save.
LoadedCheckpoint load_checkpoint(Communicator& comm, const std::string& dir,
                                 const CheckpointPlacement& placement = {});

// Every rank says whether its part of a save or load worked; all learn the lowest failing
// rank, or -1 (an all-reduce through host_collectives, so NCCL jobs stage it on the GPU).
int first_failed_rank(Communicator& comm, bool ok);

// The same for one process, without communication (tools, tests): `rank` picks the
// per-rank blobs, loaded when the checkpoint was saved by `world_size` processes.
LoadedCheckpoint read_checkpoint(const std::string& dir, int rank, int world_size);

// The directory the recovery rule picks for DIR, or "" when there is no checkpoint there.
std::string resolve_checkpoint_dir(const std::string& dir);
// True when load_checkpoint(dir) would find a checkpoint (not necessarily a valid one).
bool checkpoint_exists(const std::string& dir);
// Removes the checkpoint DIR and what earlier saves left beside it (DIR.old-*, DIR.tmp-*):
// each renamed to DIR.trash-<id> first, so a crash never leaves a partial DIR to be read.
void remove_checkpoint(const std::string& dir);

namespace checkpoint_testing {
// Called by rank 0 at each stage of a save: "blobs_written" (before MANIFEST),
// "manifest_written" (before the renames), "moved_aside" (DIR renamed away, the new one not
// yet in place), "renamed" (before DIR.old-* is removed); and by every rank just before each
// change it makes to the filesystem: "fs:mkdir", "fs:create", "fs:write", "fs:sync",
// "fs:sync dir", "fs:rename aside" (DIR away), "fs:rename in" (the new one to DIR),
// "fs:rename trash", "fs:remove" (one file or empty directory). Tests kill the process there to
// check that every point of a save leaves a loadable checkpoint. Not for production use.
void set_stage_hook(std::function<void(std::string_view stage)> hook);
}  // namespace checkpoint_testing

}  // namespace accel
