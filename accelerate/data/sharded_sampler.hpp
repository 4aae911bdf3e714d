#pragma once
// Which samples each rank sees in an epoch (PyTorch's DistributedSampler with Accelerate's
// even batches), framework-free: it deals in dataset indices.
//
// The epoch is a sequence of global batches of batch_size * world samples, taken from one
// permutation of the dataset (shuffled with seed + epoch, the same on every rank). Global
// batch g gives rank r the batch_size samples starting at g * batch_size * world +
// r * batch_size. So N ranks together see exactly the global batches one process with
// batch_size * world would see, which is what makes DDP equal to single-process training.
//
// The tail: with drop_last the incomplete last global batch is dropped; otherwise, with
// even_batches (Accelerate's default), it is filled by wrapping around to the start of the
// permutation, so every rank gets the same number of batches (no rank waits in a collective
// for a batch another rank lacks), and padding() says how many samples were repeats, so
// gather_for_metrics can drop them. Without even_batches nothing repeats: rank r gets its part
// of the last global batch as it falls (a shorter batch, or none), so ranks may differ by one
// batch, which suits evaluation; a training step on the extra batch would wait for the ranks
// that have none until the collective's timeout. One process never pads (as Accelerate): its
// last batch is short, as in the plain loop.

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace accel {

struct SamplerOptions {
  std::size_t batch_size = 1;  // per rank
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
  bool even_batches = true;  // false: no padding, ranks may get one batch fewer (see above)
};

class ShardedSampler {
 public:
  ShardedSampler(std::size_t dataset_size, int world_size, int rank, SamplerOptions options = {});

  // Reshuffles for this epoch (every rank must use the same epoch).
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  // This rank's sample indices for the epoch, batch after batch.
  std::vector<std::size_t> indices() const;
  // This rank's batches in the epoch: the same on every rank unless even_batches is false.
  std::size_t num_batches() const;
  // Where batch b lies in indices(): [begin, end), batch_size long but for a short last batch
  // (one process, or without even_batches).
  std::pair<std::size_t, std::size_t> batch_bounds(std::size_t b) const;
  // Samples of the whole epoch (all ranks) that repeat earlier ones to fill the last batch.
  std::size_t padding() const;
  std::size_t dataset_size() const { return dataset_size_; }
  const SamplerOptions& options() const { return options_; }

 private:
  std::vector<std::size_t> permutation() const;
  // Without even_batches: how many of the incomplete last global batch's samples are this
  // rank's (0 when there is none, or with drop_last).
  std::size_t tail_samples() const;
  // Whether the last global batch is filled by wrapping: even_batches, with several ranks.
  bool pads() const;

  std::size_t dataset_size_;
  int world_size_;
  int rank_;
  SamplerOptions options_;
  std::uint64_t epoch_ = 0;
};

}  // namespace accel
