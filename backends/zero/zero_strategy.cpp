#include "backends/zero/zero_strategy.hpp"

#include <algorithm>
#include <cstring>

#include "backends/comm/error.hpp"

namespace accel {
namespace {

std::vector<std::uint64_t> words_for(std::size_t count, DType dtype) {
  // Allocated and touched once here (zeros): fresh pages cost more than the collectives.
  return std::vector<std::uint64_t>((count * element_size(dtype) + 7) / 8 + 1, 0);
}

Buffer view_of(const std::vector<std::uint64_t>& words, std::size_t count, DType dtype) {
  return Buffer{const_cast<std::uint64_t*>(words.data()), count, dtype, DeviceKind::cpu};
}

}  // namespace

ZeroStrategy::ZeroStrategy(Communicator& comm, std::vector<ParamRef> params,
                           std::vector<Buffer> buffers, ZeroOptions options)
    : comm_(comm),
      params_(std::move(params)),
      buffers_(std::move(buffers)),
      options_(std::move(options)),
      layout_(params_, comm.world_size(), comm.rank()),
      buckets_of_(params_.size()),
      release_in_(params_.size()),
      ready_(params_.size(), false) {
  ACCEL_CHECK_ARG(options_.stage == 1 || options_.stage == 2,
                  "ZeRO stage " + std::to_string(options_.stage) +
                      " is not available (stages 1 and 2 are)");
  ACCEL_CHECK_ARG(options_.bucket_cap_bytes > 0, "ZeRO bucket size must be positive");
  ACCEL_CHECK_ARG(comm_.device() == DeviceKind::cpu,
                  "ZeRO buffers live in CPU memory so far; a CUDA communicator needs device "
                  "buffers");
  for (const ParamRef& p : params_) {
    ACCEL_CHECK_ARG(p.data.dtype == p.grad.dtype && p.data.count == p.grad.count,
                    "ZeRO: parameter '" + p.name + "' has a gradient of another shape or dtype");
    ACCEL_CHECK_ARG(p.data.device == comm_.device(),
                    "ZeRO: parameter '" + p.name + "' is not on the communicator's device");
  }
  const auto& groups = layout_.groups();
  for (std::size_t f = 0; f < groups.size(); ++f) {
    param_store_.push_back(words_for(groups[f].padded, groups[f].dtype));
    grad_store_.push_back(words_for(
        options_.stage == 1 ? groups[f].padded : layout_.owned(f).count, groups[f].dtype));
  }
  bucket_ranges_ = layout_.buckets(options_.bucket_cap_bytes);
  std::size_t largest = 0;  // bytes
  for (std::size_t b = 0; b < bucket_ranges_.size(); ++b) {
    const FlatBucket& r = bucket_ranges_[b];
    Bucket bucket;
    bucket.range = r;
    bucket.counts = layout_.owner_counts(r.flat, r.begin, r.end);
    bucket.pending = r.params.size();
    buckets_.push_back(std::move(bucket));
    for (std::size_t i : r.params) {
      buckets_of_[i].push_back(b);
      release_in_[i] = b;  // the last bucket holding a piece of it
    }
    largest = std::max(largest, (r.end - r.begin) * element_size(groups[r.flat].dtype));
  }
  if (options_.stage == 2)
    for (auto& s : staging_) s.assign((largest + 7) / 8 + 1, 0);
  // Stage 1: a gradient given without storage lives in its flat slot from the start. Stage 2
  // has no slot for it: no storage means no gradient yet (zeros) until set_grad().
  if (options_.stage == 1)
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i].grad.data == nullptr) params_[i].grad = grad_view(i);
}

ZeroStrategy::~ZeroStrategy() {
  for (Bucket& b : buckets_)
    if (b.work) try {
        b.work->wait();
      } catch (...) {
      }
}

Buffer ZeroStrategy::flat_params(std::size_t f) const {
  const FlatGroup& g = layout_.groups()[f];
  return view_of(param_store_[f], g.padded, g.dtype);
}

Buffer ZeroStrategy::grad_slice(std::size_t f) const {
  const FlatGroup& g = layout_.groups()[f];
  const Shard own = layout_.owned(f);
  if (options_.stage == 1) return view_of(grad_store_[f], g.padded, g.dtype).slice(own.offset, own.count);
  return view_of(grad_store_[f], own.count, g.dtype);
}

Buffer ZeroStrategy::param_view(std::size_t index) const {
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  return flat_params(layout_.flat_of(index)).slice(layout_.offset_of(index), params_[index].data.count);
}

Buffer ZeroStrategy::grad_view(std::size_t index) const {
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  ACCEL_CHECK_ARG(options_.stage == 1, "ZeRO-2 keeps no full gradient of '" +
                                           params_[index].name + "' (only this rank's slice)");
  const std::size_t f = layout_.flat_of(index);
  const FlatGroup& g = layout_.groups()[f];
  return view_of(grad_store_[f], g.padded, g.dtype)
      .slice(layout_.offset_of(index), params_[index].data.count);
}

void ZeroStrategy::set_grad(std::size_t index, Buffer grad) {
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  ACCEL_CHECK_ARG(grad.data == nullptr || (grad.dtype == params_[index].data.dtype &&
                                            grad.count == params_[index].data.count),
                  "ZeRO: the new gradient of '" + params_[index].name +
                      "' has another shape or dtype");
  params_[index].grad = grad;
}

void ZeroStrategy::use_flat_parameters() {
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].data = param_view(i);
  flat_parameters_ = true;
}

void ZeroStrategy::reload_parameters() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Buffer slot = param_view(i);
    if (slot.data != params_[i].data.data) std::memcpy(slot.data, params_[i].data.data, slot.bytes());
  }
}

void ZeroStrategy::prepare() {
  std::vector<WorkPtr> works;
  for (const ParamRef& p : params_) works.push_back(comm_.broadcast(p.data, 0));
  for (const Buffer& b : buffers_) works.push_back(comm_.broadcast(b, 0));
  for (auto& w : works) w->wait();
  reload_parameters();
}

void ZeroStrategy::sync_buffers() {
  if (!options_.broadcast_buffers || comm_.world_size() == 1) return;
  std::vector<WorkPtr> works;
  for (const Buffer& b : buffers_) works.push_back(comm_.broadcast(b, 0));
  for (auto& w : works) w->wait();
}

std::vector<ParamSegment> ZeroStrategy::segments() const {
  std::vector<ParamSegment> out;
  for (std::size_t f = 0; f < layout_.groups().size(); ++f) {
    const Shard own = layout_.owned(f);
    out.push_back({layout_.groups()[f].group, flat_params(f).slice(own.offset, own.count),
                   grad_slice(f), own.offset});
  }
  return out;
}

std::size_t ZeroStrategy::gradient_bytes() const {
  std::size_t bytes = 0;
  for (std::size_t f = 0; f < layout_.groups().size(); ++f) {
    const FlatGroup& g = layout_.groups()[f];
    bytes += (options_.stage == 1 ? g.padded : layout_.owned(f).count) * element_size(g.dtype);
  }
  for (const auto& s : staging_) bytes += s.size() * sizeof(std::uint64_t);
  return bytes;
}

void ZeroStrategy::grad_ready(std::size_t index) {
  // Only the micro-batch that ends an accumulation communicates (see the header).
  if (!sync_enabled_) return;
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  std::lock_guard lock(mutex_);
  if (ready_[index])
    throw InvalidArgument("ZeRO: the gradient of '" + params_[index].name +
                          "' was reported ready twice in one iteration");
  ready_[index] = true;
  for (std::size_t b : buckets_of_[index]) --buckets_[b].pending;
  launch_ready_buckets();
}

void ZeroStrategy::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
    launch(buckets_[next_launch_++]);
}

Buffer ZeroStrategy::own_part(const Bucket& b, Buffer bucket_data) const {
  const std::size_t mine = b.counts[std::size_t(comm_.rank())];
  if (mine == 0) return Buffer{bucket_data.data, 0, bucket_data.dtype, bucket_data.device};
  const Shard own = layout_.owned(b.range.flat);
  return bucket_data.slice(std::max(b.range.begin, own.offset) - b.range.begin, mine);
}

void ZeroStrategy::launch(Bucket& b) {
  const FlatGroup& g = layout_.groups()[b.range.flat];
  const std::size_t count = b.range.end - b.range.begin;
  Buffer data;
  if (options_.stage == 1) {
    data = view_of(grad_store_[b.range.flat], g.padded, g.dtype).slice(b.range.begin, count);
  } else {
    // Two staging buffers: the older bucket in flight must finish before its buffer is reused.
    const int slot = next_slot_;
    next_slot_ ^= 1;
    if (in_slot_[std::size_t(slot)]) finish(*in_slot_[std::size_t(slot)]);
    data = view_of(staging_[std::size_t(slot)], count, g.dtype);
    b.slot = slot;
    in_slot_[std::size_t(slot)] = &b;
  }
  const std::size_t bucket_index = std::size_t(&b - buckets_.data());
  for (std::size_t i : b.range.params) {
    // The piece of parameter i inside this bucket (all of it unless it is split).
    const std::size_t offset = layout_.offset_of(i);
    const std::size_t lo = std::max(offset, b.range.begin);
    const std::size_t hi = std::min(offset + params_[i].data.count, b.range.end);
    const Buffer dst = data.slice(lo - b.range.begin, hi - lo);
    const Buffer& grad = params_[i].grad;
    if (grad.data == nullptr)
      std::memset(dst.data, 0, dst.bytes());  // stage 2, a parameter without a gradient yet
    else if (grad.slice(lo - offset, hi - lo).data != dst.data)
      std::memcpy(dst.data, grad.slice(lo - offset, hi - lo).data, dst.bytes());
    // The buckets hold all of it now: stage 2 keeps no full gradient past this point.
    if (options_.stage == 2 && options_.release_grad && release_in_[i] == bucket_index)
      options_.release_grad(i);
  }
  // In place: this rank's part of the bucket receives the average of everyone's.
  b.work = comm_.reduce_scatter(data, own_part(b, data), ReduceOp::avg, b.counts);
}

void ZeroStrategy::finish(Bucket& b) {
  if (!b.work) return;
  WorkPtr work = std::move(b.work);
  if (b.slot >= 0) in_slot_[std::size_t(b.slot)] = nullptr;
  work->wait();
  if (options_.stage == 1) return;  // the part was reduced in place, inside the slice
  const FlatGroup& g = layout_.groups()[b.range.flat];
  const Buffer data = view_of(staging_[std::size_t(b.slot)], b.range.end - b.range.begin, g.dtype);
  const Buffer part = own_part(b, data);
  b.slot = -1;
  if (part.count == 0) return;
  const Shard own = layout_.owned(b.range.flat);
  const Buffer dst = grad_slice(b.range.flat).slice(std::max(b.range.begin, own.offset) - own.offset, part.count);
  std::memcpy(dst.data, part.data, part.bytes());
}

void ZeroStrategy::finish_all() {
  std::exception_ptr error;
  for (Bucket& b : buckets_) {
    try {
      finish(b);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    b.pending = b.range.params.size();
    b.slot = -1;
  }
  in_slot_ = {};
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  next_slot_ = 0;
  if (error) std::rethrow_exception(error);
}

void ZeroStrategy::sync_gradients() {
  if (!sync_enabled_) return;
  {
    std::lock_guard lock(mutex_);
    // A gradient not reported this micro-batch (its parameter was unused) contributes what
    // its buffer holds, so no rank waits for it (as DdpStrategy::sync_gradients).
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      ready_[i] = true;
      for (std::size_t b : buckets_of_[i]) --buckets_[b].pending;
    }
    launch_ready_buckets();
    finish_all();
  }
}

void ZeroStrategy::after_optimizer_step() {
  std::vector<WorkPtr> works;
  for (std::size_t f = 0; f < layout_.groups().size(); ++f) {
    const Buffer full = flat_params(f);
    const Shard own = layout_.owned(f);
    works.push_back(comm_.all_gather(full.slice(own.offset, own.count), full));
  }
  for (auto& w : works) w->wait();
  if (flat_parameters_) return;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Buffer slot = param_view(i);
    if (slot.data != params_[i].data.data) std::memcpy(params_[i].data.data, slot.data, slot.bytes());
  }
}

}  // namespace accel
