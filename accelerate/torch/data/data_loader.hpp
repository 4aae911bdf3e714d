#pragma once
// An in-memory dataset of tensors (dim 0 = samples) dealt out to the ranks by a
// ShardedSampler: each rank iterates its own shard, every rank the same number of batches.
//
//   auto loader = acc.prepare_data_loader(images, labels, {.batch_size = 64, .seed = 1});
//   for (std::uint64_t epoch = 0; epoch < epochs; ++epoch)
//     for (auto& batch : *loader) ...                // as with torch::data's loaders
//
// Epochs count themselves, as in Accelerate: each full pass over the loader moves it to the
// next epoch (the next shuffle, the same on every rank); set_epoch(e) picks one explicitly
// (e.g. when resuming from a checkpoint).
//
// Iterating tells the Accelerator where the loop is before each batch is yielded
// (begin_batch(index, size)): the last batch of an epoch always ends in a gradient sync and
// gradient accumulation restarts its count with each epoch (Accelerate's sync_with_dataloader).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include "accelerate/data/sharded_sampler.hpp"

namespace accel {

class Accelerator;

struct TorchBatch {
  at::Tensor data;        // [batch_size, ...] on the accelerator's device
  at::Tensor target;      // [batch_size, ...]
  std::size_t index = 0;  // position in the epoch (0-based), for gather_for_metrics
};

class TorchDataLoader {
 public:
  // `data` and `targets` share their first dimension. Batches are copied out of them (on the
  // CPU) and moved to `device`.
  TorchDataLoader(Accelerator& accelerator, at::Tensor data, at::Tensor targets,
                  ShardedSampler sampler, c10::Device device);

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = TorchBatch;
    using difference_type = std::ptrdiff_t;
    using pointer = const TorchBatch*;
    using reference = const TorchBatch&;

    Iterator() = default;
    const TorchBatch& operator*() const { return batch_; }
    const TorchBatch* operator->() const { return &batch_; }
    Iterator& operator++();
    void operator++(int) { ++*this; }
    bool operator==(const Iterator& other) const { return position_ == other.position_; }

   private:
    friend class TorchDataLoader;
    Iterator(const TorchDataLoader* loader, std::size_t position);
    void load();  // begin_batch on the accelerator, then copies out batch position_

    const TorchDataLoader* loader_ = nullptr;
    std::size_t position_ = 0;
    std::vector<std::size_t> indices_;  // this rank's indices for the epoch
    TorchBatch batch_;
  };

  // Each begin() starts the current epoch (at skip_first_batches' batch, once); after a pass
  // that reached the end, the next begin() starts the following epoch.
  Iterator begin();
  Iterator end() const;
  // `*loader` is the loader itself, so a loop written for torch::data's loaders
  // (`for (auto& batch : *loader)`) runs unchanged.
  TorchDataLoader& operator*() { return *this; }

  void set_epoch(std::uint64_t epoch) {
    sampler_.set_epoch(epoch);
    finished_pass_ = false;
  }
  std::uint64_t epoch() const { return sampler_.epoch(); }
  // Batches per rank in an epoch (the same on every rank).
  std::size_t size() const { return sampler_.num_batches(); }
  const ShardedSampler& sampler() const { return sampler_; }
  // The next iteration only starts at batch n of its epoch (resuming mid-epoch, Accelerate's
  // skip_first_batches); batch indices keep their position in the epoch.
  void skip_first_batches(std::size_t n) { skip_ = n; }
  // The batches the next iteration yields: size() less what skip_first_batches skips.
  std::size_t batches_left() const { return size() - std::min(skip_, size()); }

 private:
  Accelerator* accelerator_;
  at::Tensor data_;
  at::Tensor targets_;
  ShardedSampler sampler_;
  c10::Device device_;
  std::size_t skip_ = 0;
  mutable bool finished_pass_ = false;  // the last iteration reached the end of its epoch
};

}  // namespace accel
