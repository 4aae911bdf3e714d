#include "accelerate/torch/data/data_loader.hpp"

#include <algorithm>

#include <ATen/Functions.h>

#include "accelerate/accelerator.hpp"
#include "foundation/error.hpp"

namespace accel {

TorchDataLoader::TorchDataLoader(Accelerator& accelerator, at::Tensor data, at::Tensor targets,
                                 ShardedSampler sampler, c10::Device device)
    : accelerator_(&accelerator),
      data_(std::move(data)),
      targets_(std::move(targets)),
      sampler_(std::move(sampler)),
      device_(device) {
  ACCEL_CHECK_ARG(data_.dim() >= 1 && targets_.dim() >= 1 && data_.size(0) == targets_.size(0),
                  "data loader: data and targets need the same number of samples (dim 0)");
  ACCEL_CHECK_ARG(sampler_.dataset_size() == std::size_t(data_.size(0)),
                  "data loader: the sampler was made for another dataset size");
}

TorchDataLoader::Iterator TorchDataLoader::begin() {
  if (finished_pass_) set_epoch(epoch() + 1);
  const std::size_t start = std::min(skip_, size());
  skip_ = 0;
  return Iterator(this, start);
}

TorchDataLoader::Iterator TorchDataLoader::end() const {
  Iterator it;
  it.position_ = size();
  return it;
}

TorchDataLoader::Iterator::Iterator(const TorchDataLoader* loader, std::size_t position)
    : loader_(loader), position_(position), indices_(loader->sampler_.indices()) {
  if (position_ < loader_->size()) load();
}

TorchDataLoader::Iterator& TorchDataLoader::Iterator::operator++() {
  ++position_;
  if (position_ < loader_->size()) {
    load();
  } else {
    batch_ = TorchBatch{};  // release the last batch's memory
    loader_->finished_pass_ = true;
  }
  return *this;
}

void TorchDataLoader::Iterator::load() {
  // Before the batch reaches the loop's forward: the accelerator must know whether this
  // micro-batch ends in a sync before backward's hooks fire.
  loader_->accelerator_->begin_batch(position_, loader_->size());
  const std::size_t b = loader_->sampler_.options().batch_size;
  // The last batch is shorter without even_batches.
  const std::size_t last = std::min((position_ + 1) * b, indices_.size());
  std::vector<std::int64_t> rows(indices_.begin() + std::ptrdiff_t(position_ * b),
                                 indices_.begin() + std::ptrdiff_t(last));
  const at::Tensor index = at::tensor(rows, at::kLong);
  batch_.data =
      loader_->data_.index_select(0, index.to(loader_->data_.device())).to(loader_->device_);
  batch_.target =
      loader_->targets_.index_select(0, index.to(loader_->targets_.device())).to(loader_->device_);
  batch_.index = position_;
}

}  // namespace accel
