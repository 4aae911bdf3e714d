#include "accelerate/torch/data/rank_sampler.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include "foundation/error.hpp"

namespace accel {

RankSampler::RankSampler(std::shared_ptr<Plan> plan) : plan_(std::move(plan)) {
  ACCEL_CHECK_ARG(plan_ && plan_->sharded.has_value() != (plan_->own != nullptr),
                  "RankSampler: needs either a sharded sampler or the loop's own");
}

void RankSampler::reset(c10::optional<std::size_t> new_size) {
  const std::size_t skip = std::exchange(plan_->skip_batches, 0);
  if (plan_->own) {
    plan_->own->reset(new_size);
    for (std::size_t k = 0; k < skip; ++k)
      if (!plan_->own->next(plan_->batch_size)) break;
    return;
  }
  const std::size_t size = plan_->sharded->dataset_size();
  ACCEL_CHECK_ARG(!new_size || *new_size == size, "data loader: the dataset changed size to " +
                                                      std::to_string(new_size.value_or(0)) +
                                                      " samples, it was " + std::to_string(size) +
                                                      " when prepared");
  indices_ = plan_->sharded->indices();
  cursor_ = std::min(skip * plan_->batch_size, indices_.size());
}

c10::optional<std::vector<std::size_t>> RankSampler::next(std::size_t batch_size) {
  if (plan_->own) return plan_->own->next(batch_size);
  if (cursor_ >= indices_.size()) return c10::nullopt;
  const std::size_t end = std::min(cursor_ + batch_size, indices_.size());
  std::vector<std::size_t> batch(indices_.begin() + std::ptrdiff_t(cursor_),
                                 indices_.begin() + std::ptrdiff_t(end));
  cursor_ = end;
  return batch;
}

void RankSampler::save(torch::serialize::OutputArchive& archive) const {
  if (plan_->own) return plan_->own->save(archive);
  archive.write("epoch", torch::tensor(std::int64_t(plan_->sharded->epoch())), true);
  archive.write("cursor", torch::tensor(std::int64_t(cursor_)), true);
}

void RankSampler::load(torch::serialize::InputArchive& archive) {
  if (plan_->own) return plan_->own->load(archive);
  torch::Tensor epoch, cursor;
  archive.read("epoch", epoch, true);
  archive.read("cursor", cursor, true);
  plan_->sharded->set_epoch(std::uint64_t(epoch.item<std::int64_t>()));
  indices_ = plan_->sharded->indices();
  cursor_ = std::min(std::size_t(cursor.item<std::int64_t>()), indices_.size());
}

}  // namespace accel
