#pragma once
// Any torch::data dataset dealt out to the ranks (TorchAccelerator::prepare_data_loader's
// Dataset form, which mirrors torch::data::make_data_loader). LibTorch's own
// StatelessDataLoader runs the dataset, its transforms, workers and collation over a
// RankSampler (rank_sampler.hpp) of this rank's indices, so batches are what LibTorch's
// loader yields (Example<> after Stack<>) and a dataset reading files in get() streams: each
// rank reads only its own samples.
//
//   auto loader = acc.prepare_data_loader<torch::data::samplers::SequentialSampler>(
//       std::move(dataset), torch::data::DataLoaderOptions(64).workers(2));
//   for (auto& batch : *loader) ...                    // batch.data, batch.target
//
// The sampler, as Accelerate shards: one process uses the loop's own (no sharding, no
// padding: the plain loop, bit for bit). Several shard a RandomSampler (shuffled from the
// accelerator's seed + epoch, the same permutation on every rank) or a SequentialSampler
// (in order) with a ShardedSampler (sharded_sampler.hpp): global batch g is the ranks'
// batches g in rank order; with even_batches the last one is padded by wrapping and
// gather_for_metrics drops the padding. A DistributedRandomSampler/DistributedSequentialSampler
// the loop passes shards itself and is kept; any other sampler is refused there.
//
// Epochs count themselves (each finished pass starts the next epoch's shuffle); set_epoch(e)
// picks one (and reaches a kept DistributedSampler's set_epoch; the loop's own RandomSampler
// at world 1 draws from LibTorch's generator, as in the plain loop). Before each batch is
// yielded the accelerator hears begin_batch(index, size()), as with the tensor loader.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/ArrayRef.h>
#include <c10/util/Optional.h>
#include <c10/util/Type.h>
#include <torch/data/dataloader.h>
#include <torch/data/samplers/distributed.h>
#include <torch/data/samplers/random.h>
#include <torch/data/samplers/sequential.h>

#include "accelerate/torch/data/rank_sampler.hpp"

namespace accel {

class Accelerator;

// How prepare_data_loader deals a dataset out to several processes (Accelerate's names).
struct DataLoaderConfiguration {
  bool even_batches = true;  // false: no padding, ranks may get one batch fewer (for evaluation)
  std::uint64_t seed = 0;    // the shuffle's; 0: the accelerator's seed
};

// An index-based (stateless) torch::data dataset: a Dataset<Self, Example>, a MapDataset of
// one, a TensorDataset.
template <typename D>
concept TorchDataset =
    !D::is_stateful && std::is_same_v<typename D::BatchRequestType, c10::ArrayRef<std::size_t>>;

// The part that does not depend on the dataset: epoch, position, what gather_for_metrics needs.
class DatasetLoaderBase {
 public:
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const { return epoch_; }
  // This rank's batches in an epoch (the same on every rank with even_batches).
  std::size_t size() const { return num_batches_; }
  // The next pass only starts at batch n of its epoch (resuming mid-epoch, Accelerate's
  // skip_first_batches): the batches before it are never read; indices keep their position.
  void skip_first_batches(std::size_t n) { skip_ = n; }
  // The batches the next iteration yields: size() less what skip_first_batches skips.
  std::size_t batches_left() const { return size() - std::min(skip_, size()); }
  // The batch last yielded (0-based position in its epoch).
  std::size_t batch_index() const { return current_; }
  // Samples of the whole epoch (all ranks) that repeat earlier ones in its last global batch.
  std::size_t padding() const;
  // Whether this rank reads a share (several processes and a RandomSampler/SequentialSampler).
  bool sharded() const { return plan_->sharded.has_value(); }

 protected:
  DatasetLoaderBase(Accelerator& accelerator, std::shared_ptr<RankSampler::Plan> plan,
                    std::size_t num_batches)
      : accelerator_(&accelerator), plan_(std::move(plan)), num_batches_(num_batches) {}
  // Before LibTorch's begin() resets the sampler: the epoch (the next after a finished pass)
  // and the batch to start at (returned) go into the plan.
  std::size_t begin_pass();
  // After the iterator moved to batch `index` (size() once past the end).
  void reached(std::size_t index);

 private:
  Accelerator* accelerator_;
  std::shared_ptr<RankSampler::Plan> plan_;
  std::size_t num_batches_;
  std::uint64_t epoch_ = 0;
  std::size_t skip_ = 0;
  std::size_t current_ = 0;
  bool finished_pass_ = false;
};

template <TorchDataset Dataset>
class DatasetLoader : public DatasetLoaderBase {
 public:
  using BatchType = typename Dataset::BatchType;
  using TorchLoader = torch::data::StatelessDataLoader<Dataset, RankSampler>;

  DatasetLoader(Accelerator& accelerator, std::shared_ptr<RankSampler::Plan> plan,
                std::size_t num_batches, Dataset dataset, torch::data::DataLoaderOptions options)
      : DatasetLoaderBase(accelerator, plan, num_batches),
        loader_(std::make_unique<TorchLoader>(std::move(dataset), RankSampler(plan),
                                              std::move(options))) {}

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = BatchType;
    using difference_type = std::ptrdiff_t;
    using pointer = BatchType*;
    using reference = BatchType&;

    BatchType& operator*() { return *inner_; }
    BatchType* operator->() { return &*inner_; }
    Iterator& operator++() {
      ++inner_;
      owner_->reached(++index_);
      return *this;
    }
    bool operator==(const Iterator& other) const { return inner_ == other.inner_; }

   private:
    friend class DatasetLoader;
    Iterator(DatasetLoader* owner, torch::data::Iterator<BatchType> inner, std::size_t index)
        : owner_(owner), inner_(std::move(inner)), index_(index) {}

    DatasetLoader* owner_;
    torch::data::Iterator<BatchType> inner_;
    std::size_t index_;
  };

  // Starts a pass: the current epoch (at skip_first_batches' batch, once), or after a pass that
  // reached the end, the following epoch.
  Iterator begin() {
    const std::size_t first = begin_pass();
    Iterator it(this, loader_->begin(), first);
    reached(first);
    return it;
  }
  Iterator end() { return Iterator(this, loader_->end(), size()); }
  // `*loader` and `loader->` are the loader itself, so a loop written for make_data_loader's
  // std::unique_ptr (`for (auto& batch : *loader)`) runs unchanged.
  DatasetLoader& operator*() { return *this; }
  DatasetLoader* operator->() { return this; }
  const torch::data::FullDataLoaderOptions& options() const { return loader_->options(); }

 private:
  std::unique_ptr<TorchLoader> loader_;  // not movable itself: its workers point at it
};

namespace detail {

// How the loop's sampler is dealt with at this number of processes.
enum class SamplerKind { random, sequential, distributed, other };

template <typename Sampler>
constexpr SamplerKind sampler_kind() {
  namespace s = torch::data::samplers;
  if constexpr (std::is_same_v<Sampler, s::RandomSampler>) return SamplerKind::random;
  if constexpr (std::is_same_v<Sampler, s::SequentialSampler>) return SamplerKind::sequential;
  if constexpr (std::is_base_of_v<s::DistributedSampler<>, Sampler>)
    return SamplerKind::distributed;
  return SamplerKind::other;
}

// The samples a DistributedSampler gives this rank (its protected local_sample_count()).
struct DistributedShare : torch::data::samplers::DistributedSampler<> {
  static std::size_t samples(torch::data::samplers::DistributedSampler<>& sampler) {
    return (sampler.*(&DistributedShare::local_sample_count))();
  }
};

struct SamplerChoice {
  SamplerKind kind;
  std::string name;         // for errors
  std::size_t own_samples;  // the loop's sampler's samples on this rank (kept samplers)
};

// The plan for this rank and its batch count; checks what the ranks must agree on.
// Accelerator::batch_size_for (the config's global_batch_size), where Accelerator is complete.
std::size_t loader_batch_size(const Accelerator& accelerator, std::size_t requested);

std::pair<std::shared_ptr<RankSampler::Plan>, std::size_t> plan_loader(
    Accelerator& accelerator, c10::optional<std::size_t> dataset_size,
    const torch::data::DataLoaderOptions& options, const DataLoaderConfiguration& config,
    const SamplerChoice& choice, std::unique_ptr<torch::data::samplers::Sampler<>> own);

}  // namespace detail

// TorchAccelerator::prepare_data_loader's Dataset form (the accelerator's rank and world).
template <TorchDataset Dataset, std::derived_from<torch::data::samplers::Sampler<>> Sampler>
DatasetLoader<Dataset> make_dataset_loader(Accelerator& accelerator, Dataset dataset,
                                           Sampler sampler, torch::data::DataLoaderOptions options,
                                           DataLoaderConfiguration config) {
  static_assert(std::is_same_v<typename Sampler::BatchRequestType, std::vector<std::size_t>>,
                "prepare_data_loader: the sampler must yield std::vector<size_t> batches");
  constexpr detail::SamplerKind kind = detail::sampler_kind<Sampler>();
  std::size_t own_samples = 0;
  if constexpr (kind == detail::SamplerKind::distributed)
    own_samples = detail::DistributedShare::samples(sampler);
  options.batch_size(detail::loader_batch_size(accelerator, options.batch_size()));
  auto [plan, batches] = detail::plan_loader(accelerator, dataset.size(), options, config,
                                             {kind, c10::demangle_type<Sampler>(), own_samples},
                                             std::make_unique<Sampler>(std::move(sampler)));
  return DatasetLoader<Dataset>(accelerator, std::move(plan), batches, std::move(dataset),
                                std::move(options));
}

}  // namespace accel
