#include "accelerate/torch/data/dataset_loader.hpp"

#include <algorithm>

#include "accelerate/accelerator.hpp"
#include "foundation/error.hpp"

namespace accel {

void DatasetLoaderBase::set_epoch(std::uint64_t epoch) {
  epoch_ = epoch;
  finished_pass_ = false;
  if (auto* own = dynamic_cast<torch::data::samplers::DistributedSampler<>*>(plan_->own.get()))
    own->set_epoch(epoch);
}

std::size_t DatasetLoaderBase::padding() const {
  return plan_->sharded ? plan_->sharded->padding() : 0;
}

std::size_t DatasetLoaderBase::begin_pass() {
  if (finished_pass_) set_epoch(epoch_ + 1);
  if (plan_->sharded) plan_->sharded->set_epoch(epoch_);
  const std::size_t first = std::min(std::exchange(skip_, 0), num_batches_);
  plan_->skip_batches = first;
  return first;
}

void DatasetLoaderBase::reached(std::size_t index) {
  if (index < num_batches_) {
    // Before the batch reaches the loop's forward: the accelerator must know whether this
    // micro-batch ends in a sync before backward's hooks fire.
    current_ = index;
    accelerator_->begin_batch(index, num_batches_);
  } else {
    finished_pass_ = true;
  }
}

namespace detail {

namespace {

std::size_t batches_of(std::size_t samples, std::size_t batch, bool drop_last) {
  return drop_last ? samples / batch : (samples + batch - 1) / batch;
}

}  // namespace

std::size_t loader_batch_size(const Accelerator& accelerator, std::size_t requested) {
  return accelerator.batch_size_for(requested);
}

std::pair<std::shared_ptr<RankSampler::Plan>, std::size_t> plan_loader(
    Accelerator& accelerator, c10::optional<std::size_t> dataset_size,
    const torch::data::DataLoaderOptions& options, const DataLoaderConfiguration& config,
    const SamplerChoice& choice, std::unique_ptr<torch::data::samplers::Sampler<>> own) {
  const int world = accelerator.num_processes();
  ACCEL_CHECK_ARG(dataset_size.has_value(),
                  "prepare_data_loader: the dataset has no size() (an unsized dataset cannot "
                  "be sampled by index); return its number of samples from size()");
  ACCEL_CHECK_ARG(options.batch_size() >= 1, "prepare_data_loader: batch_size must be at least 1");
  auto plan = std::make_shared<RankSampler::Plan>();
  plan->batch_size = options.batch_size();
  const bool shard =
      world > 1 && (choice.kind == SamplerKind::random || choice.kind == SamplerKind::sequential);
  ACCEL_CHECK_ARG(world == 1 || choice.kind != SamplerKind::other,
                  "prepare_data_loader: " + choice.name + " at " + std::to_string(world) +
                      " processes: only a RandomSampler (shuffled) or a SequentialSampler (in "
                      "order) is sharded, and a DistributedRandomSampler or "
                      "DistributedSequentialSampler shards itself; pass one of those");
  if (shard) {
    plan->sharded =
        accelerator.make_sampler(*dataset_size, {.batch_size = options.batch_size(),
                                                 .shuffle = choice.kind == SamplerKind::random,
                                                 .seed = config.seed,
                                                 .drop_last = options.drop_last(),
                                                 .even_batches = config.even_batches});
    const std::size_t batches = plan->sharded->num_batches();
    return {std::move(plan), batches};
  }
  // The loop's own sampler: it yields every sample once, or (DistributedSampler) its share.
  const std::size_t samples =
      choice.kind == SamplerKind::distributed ? choice.own_samples : *dataset_size;
  if (world > 1)
    check_ranks_agree(accelerator.comm(),
                      {{"the dataset's size", std::to_string(*dataset_size)},
                       {"the loader's batch_size", std::to_string(options.batch_size())},
                       {"the loader's drop_last", options.drop_last() ? "true" : "false"},
                       {"the sampler's samples on this rank", std::to_string(samples)}},
                      "prepare_data_loader: ranks differ");
  plan->own = std::move(own);
  return {std::move(plan), batches_of(samples, options.batch_size(), options.drop_last())};
}

}  // namespace detail

}  // namespace accel
