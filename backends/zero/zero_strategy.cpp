#include "backends/zero/zero_strategy.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "backends/optim/elementwise.hpp"
#include "backends/replica_sync.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

// weighted_sum's weights for dst += source in the buffers' dtype (elementwise.hpp).
constexpr double kPlainSumWeights[] = {1.0, 1.0};
constexpr std::span<const double> kPlainSum(kPlainSumWeights);

// A view of the first `count` elements of `dtype` of a buffer allocated as raw words.
Buffer view_as(const DeviceBuffer& storage, std::size_t count, DType dtype) {
  const Buffer all = storage.view();
  return Buffer{all.data, count, dtype, all.device};
}

}  // namespace

ZeroStrategy::ZeroStrategy(Communicator& comm, std::vector<ParamRef> params,
                           std::vector<Buffer> buffers, ZeroOptions options)
    : comm_(comm),
      shard_(options.shard_group != nullptr ? *options.shard_group : comm),
      replicas_(options.replica_group),
      params_(std::move(params)),
      buffers_(std::move(buffers)),
      options_(std::move(options)),
      layout_(params_, shard_.world_size(), shard_.rank()),
      buckets_of_(params_.size()),
      release_in_(params_.size()),
      ready_(params_.size(), false) {
  ACCEL_CHECK_ARG(
      options_.stage >= 1 && options_.stage <= 3,
      "ZeRO stage " + std::to_string(options_.stage) + " does not exist (stages 1, 2 and 3 do)");
  ACCEL_CHECK_ARG(options_.bucket_cap_bytes > 0, "ZeRO bucket size must be positive");
  ACCEL_CHECK_ARG((replicas_ == nullptr) == (options_.shard_group == nullptr) &&
                      (replicas_ == nullptr ||
                       shard_.world_size() * replicas_->world_size() == comm_.world_size()),
                  "ZeRO HYBRID_SHARD: the shard and replica groups must both be given and "
                  "together hold every rank once");
  check_replica_params("ZeRO", comm_, params_);
  // Offloading only means something when the parameters are on a GPU (see the header).
  offload_ = options_.offload_optimizer == OffloadDevice::cpu && comm_.device() == DeviceKind::cuda;
  const MemoryKind memory = replica_memory(comm_);
  const int device = comm_.cuda_device();
  const auto& groups = layout_.groups();
  for (std::size_t f = 0; f < groups.size(); ++f) {
    const Shard own = layout_.owned(f);
    param_store_.emplace_back(options_.stage == 3 ? own.count : groups[f].padded, groups[f].dtype,
                              memory, device);
    if (options_.stage == 1)
      flat_grads_.emplace_back(groups[f].padded, groups[f].dtype, memory, device);
    grad_slices_.emplace_back(own.count, groups[f].dtype, memory, device);
    if (offload_) {
      host_params_.emplace_back(own.count, groups[f].dtype, MemoryKind::pinned_host);
      host_grads_.emplace_back(own.count, groups[f].dtype, MemoryKind::pinned_host);
    }
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
  if (options_.stage >= 2)
    for (auto& s : staging_) s = DeviceBuffer((largest + 7) / 8, DType::i64, memory, device);
  // A gradient asked of the strategy: stage 1 gives its flat slot from the start; stages 2 and
  // 3 have no slot, so it is lent (lend_grad), and until then there is none (zeros).
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].grad.data == nullptr) {
      if (options_.stage == 1)
        params_[i].grad = grad_slot(0, i);
      else
        lent_ = true;
    }
  if (options_.stage == 3)
    gatherer_ = std::make_unique<UnitGatherer>(shard_, layout_, params_, param_store_, options_);
}

std::string_view ZeroStrategy::name() const {
  static constexpr std::string_view kNames[] = {"zero1", "zero2", "zero3"};
  return kNames[options_.stage - 1];
}

void ZeroStrategy::set_sync_enabled(bool enabled) {
  sync_enabled_ = enabled;
  if (gatherer_) gatherer_->set_step_ends(enabled);
}

void ZeroStrategy::gather_unit(std::size_t unit, UnitPass pass) {
  if (gatherer_) gatherer_->gather(unit, pass);
}

void ZeroStrategy::release_unit(std::size_t unit, UnitPass pass) {
  if (gatherer_) gatherer_->release(unit, pass);
}

std::size_t ZeroStrategy::gathered_parameter_bytes() const {
  return gatherer_ ? gatherer_->gathered_bytes() : 0;
}

ZeroStrategy::~ZeroStrategy() {
  for (Bucket& b : buckets_)
    if (b.work) try {
        b.work->wait();
      } catch (...) {
      }
}

Buffer ZeroStrategy::flat_params(std::size_t f) const { return param_store_[f].view(); }

Buffer ZeroStrategy::owned_params(std::size_t f) const {
  if (options_.stage == 3) return param_store_[f].view();
  const Shard own = layout_.owned(f);
  return flat_params(f).slice(own.offset, own.count);
}

Buffer ZeroStrategy::grad_slice(std::size_t f) const { return grad_slices_[f].view(); }

Buffer ZeroStrategy::param_slot(std::size_t index) const {
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  ACCEL_CHECK_ARG(options_.stage != 3, "ZeRO-3 keeps no full copy of '" + params_[index].name +
                                           "' (only this rank's slice)");
  return flat_params(layout_.flat_of(index))
      .slice(layout_.offset_of(index), params_[index].data.count);
}

Buffer ZeroStrategy::grad_slot(int replica, std::size_t index) const {
  ACCEL_CHECK_ARG(
      replica == 0 && index < params_.size(),
      "ZeRO: no parameter " + std::to_string(index) + " in replica " + std::to_string(replica));
  ACCEL_CHECK_ARG(options_.stage == 1, std::string(name()) + " keeps no full gradient of '" +
                                           params_[index].name + "' (only this rank's slice)");
  return flat_grads_[layout_.flat_of(index)].view().slice(layout_.offset_of(index),
                                                          params_[index].data.count);
}

void ZeroStrategy::lend_grad(std::size_t index, Buffer grad) {
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  ACCEL_CHECK_ARG(lent_, "ZeRO: lend_grad needs stage 2 or 3 with gradients asked of the strategy");
  ACCEL_CHECK_ARG(
      grad.dtype == params_[index].data.dtype && grad.count == params_[index].data.count,
      "ZeRO: the new gradient of '" + params_[index].name + "' has another shape or dtype");
  std::lock_guard lock(mutex_);
  params_[index].grad = grad;
}

std::vector<std::size_t> ZeroStrategy::take_released() {
  std::lock_guard lock(mutex_);
  return std::exchange(released_, {});
}

void ZeroStrategy::withdraw_grad(std::size_t index) {
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  std::lock_guard lock(mutex_);
  if (!lent_) return;
  params_[index].grad = gradient_wanted(params_[index].data);  // none: zeros
  std::erase(released_, index);
  if (slices_withdrawn_) return;  // the next sync replaces the slices anyway
  // What earlier syncs reduced into this rank's part of it (every rank zeroes its own part).
  const OwnedPiece piece = owned_piece(index);
  if (piece.count > 0)
    zero_buffer(grad_slice(layout_.flat_of(index)).slice(piece.in_slice, piece.count),
                comm_.compute_stream());
}

void ZeroStrategy::withdraw_grads() {
  std::lock_guard lock(mutex_);
  if (!lent_) return;
  for (ParamRef& p : params_) p.grad = gradient_wanted(p.data);  // none: zeros
  released_.clear();
  // Every gradient is zero now: the next sync's reductions replace what the slices hold (a
  // GAN's discriminator, synced again by the generator's backward after its own step).
  slices_withdrawn_ = true;
}

void ZeroStrategy::use_param_slots() {
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].data = param_slot(i);
  flat_parameters_ = true;
}

void ZeroStrategy::use_gathered_views() {
  ACCEL_CHECK_ARG(gatherer_ != nullptr, std::string(name()) + " does not shard parameters");
  gatherer_->use_views();
  gathered_views_ = true;
}

Buffer ZeroStrategy::gathered_view(std::size_t index) const {
  ACCEL_CHECK_ARG(gatherer_ != nullptr && index < params_.size(),
                  "ZeRO: no gathered view of parameter " + std::to_string(index));
  return gatherer_->view(index);
}

void ZeroStrategy::load_parameters(const std::vector<Buffer>& values) {
  ACCEL_CHECK_ARG(gatherer_ != nullptr && values.size() == params_.size(),
                  "ZeRO-3: load_parameters takes every parameter's values");
  copy_owned_parts_in(values);
  gatherer_->invalidate();
  gatherer_->refresh_persistent();
}

void ZeroStrategy::reload_parameters() {
  const DeviceStream stream = comm_.compute_stream();
  if (options_.stage == 3) {
    // With gathered views the ParamRefs' buffers are gone: load_parameters brought the values.
    if (!gathered_views_) {
      std::vector<Buffer> values;
      for (const ParamRef& p : params_) values.push_back(p.data);
      copy_owned_parts_in(values);
    }
  } else {
    for (std::size_t i = 0; i < params_.size(); ++i)
      copy_buffer(param_slot(i), params_[i].data, stream);
  }
  if (offload_) copy_owned_to_host();
  if (gatherer_) {
    gatherer_->invalidate();
    gatherer_->refresh_persistent();
  }
}

ZeroStrategy::OwnedPiece ZeroStrategy::owned_piece(std::size_t index) const {
  const std::size_t offset = layout_.offset_of(index);
  const Shard own = layout_.owned(layout_.flat_of(index));
  const std::size_t lo = std::max(offset, own.offset);
  const std::size_t hi = std::min(offset + params_[index].data.count, own.offset + own.count);
  if (lo >= hi) return {};
  return {lo - offset, lo - own.offset, hi - lo};
}

// Stage 3: the part of each parameter (whole in values[i]) that this rank's slices hold.
void ZeroStrategy::copy_owned_parts_in(const std::vector<Buffer>& values) {
  const DeviceStream stream = comm_.compute_stream();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const OwnedPiece piece = owned_piece(i);
    if (piece.count == 0) continue;
    copy_buffer(param_store_[layout_.flat_of(i)].view().slice(piece.in_slice, piece.count),
                values[i].slice(piece.in_param, piece.count), stream);
  }
}

void ZeroStrategy::copy_owned_to_host() {
  const DeviceStream stream = comm_.compute_stream();
  // The optimizer's copy of the owned slices (host memory) follows the parameters.
  for (std::size_t f = 0; f < layout_.groups().size(); ++f)
    copy_buffer(host_params_[f].view(), owned_params(f), stream);
  synchronize_stream(stream, comm_.cuda_device(), comm_.timeout(),
                     "ZeRO offload: rank " + std::to_string(comm_.rank()) +
                         " copying its parameter slices to host memory");
}

void ZeroStrategy::prepare() {
  if (options_.offload_optimizer == OffloadDevice::cpu && !offload_ && comm_.rank() == 0)
    std::fprintf(stderr,
                 "note: offload_optimizer_device cpu has no effect here: the parameters are in "
                 "CPU memory already, where the optimizer state lives\n");
  broadcast_from_rank0(comm_, params_, buffers_);
  reload_parameters();
}

void ZeroStrategy::sync_buffers() {
  if (!options_.broadcast_buffers || comm_.world_size() == 1) return;
  broadcast_from_rank0(comm_, {}, buffers_);
}

std::vector<ParamSegment> ZeroStrategy::segments() const {
  std::vector<ParamSegment> out;
  for (std::size_t f = 0; f < layout_.groups().size(); ++f) {
    const Shard own = layout_.owned(f);
    if (offload_)  // the optimizer steps the host copies (its state lives in host memory)
      out.push_back(
          {layout_.groups()[f].group, host_params_[f].view(), host_grads_[f].view(), own.offset});
    else
      out.push_back({layout_.groups()[f].group, owned_params(f), grad_slice(f), own.offset});
  }
  return out;
}

std::size_t ZeroStrategy::gradient_bytes() const {
  std::size_t bytes = 0;
  for (std::size_t f = 0; f < layout_.groups().size(); ++f) {
    const FlatGroup& g = layout_.groups()[f];
    bytes +=
        ((options_.stage == 1 ? g.padded : 0) + layout_.owned(f).count) * element_size(g.dtype);
  }
  for (const auto& s : staging_) bytes += s.view().bytes();
  return bytes;
}

void ZeroStrategy::grad_ready(std::size_t index) {
  // Only the micro-batch that ends an accumulation communicates (see the header).
  if (!sync_enabled_) return;
  ACCEL_CHECK_ARG(index < params_.size(), "ZeRO: no parameter " + std::to_string(index));
  std::lock_guard lock(mutex_);
  if (ready_[index]) throw InvalidArgument(ready_twice_problem("ZeRO", params_[index].name));
  ready_[index] = true;
  for (std::size_t b : buckets_of_[index]) --buckets_[b].pending;
  launch_ready_buckets();
}

void ZeroStrategy::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0)
    launch(buckets_[next_launch_++]);
}

Buffer ZeroStrategy::own_part(const Bucket& b, Buffer bucket_data) const {
  const std::size_t mine = b.counts[std::size_t(shard_.rank())];
  if (mine == 0) return Buffer{bucket_data.data, 0, bucket_data.dtype, bucket_data.device};
  const Shard own = layout_.owned(b.range.flat);
  return bucket_data.slice(std::max(b.range.begin, own.offset) - b.range.begin, mine);
}

Buffer ZeroStrategy::own_slice_part(const Bucket& b) const {
  const Buffer slice = grad_slice(b.range.flat);
  const std::size_t mine = b.counts[std::size_t(shard_.rank())];
  if (mine == 0) return Buffer{slice.data, 0, slice.dtype, slice.device};
  const Shard own = layout_.owned(b.range.flat);
  return slice.slice(std::max(b.range.begin, own.offset) - own.offset, mine);
}

void ZeroStrategy::launch(Bucket& b) {
  const FlatGroup& g = layout_.groups()[b.range.flat];
  const std::size_t count = b.range.end - b.range.begin;
  const DeviceStream stream = comm_.compute_stream();
  Buffer data;
  if (options_.stage == 1) {
    data = flat_grads_[b.range.flat].view().slice(b.range.begin, count);
  } else {
    // Two staging buffers: the older bucket in flight must finish before its buffer is reused.
    const int slot = next_slot_;
    next_slot_ ^= 1;
    if (in_slot_[std::size_t(slot)]) finish(*in_slot_[std::size_t(slot)]);
    data = view_as(staging_[std::size_t(slot)], count, g.dtype);
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
    // On the compute stream, where the gradients were produced (see the header).
    if (grad.data == nullptr)
      zero_buffer(dst, stream);  // stage 2, nothing lent: no gradient yet
    else
      copy_buffer(dst, grad.slice(lo - offset, hi - lo), stream);
    // The buckets hold all of it now: stage 2 keeps no full gradient past this point.
    if (lent_ && release_in_[i] == bucket_index) {
      params_[i].grad = gradient_wanted(params_[i].data);
      released_.push_back(i);
    }
  }
  // Stage 1: straight into the slice, so the flat gradients keep what the loop accumulated
  // (a later backward of the same step adds to it); stage 2: in place in the staging bucket.
  const Buffer out = options_.stage == 1 ? own_slice_part(b) : own_part(b, data);
  b.work = shard_.reduce_scatter(data, out, ReduceOp::avg, b.counts);
}

void ZeroStrategy::finish(Bucket& b) {
  if (!b.work) return;
  WorkPtr work = std::move(b.work);
  if (b.slot >= 0) in_slot_[std::size_t(b.slot)] = nullptr;
  // The compute stream (not the host) waits for the reduce-scatter; the copy below and the
  // next bucket's copies into this staging buffer are queued after it.
  const DeviceStream stream = comm_.compute_stream();
  work->wait_stream(stream, comm_.timeout());
  if (options_.stage == 1) return;  // the part was reduced straight into the slice
  const FlatGroup& g = layout_.groups()[b.range.flat];
  const Buffer data = view_as(staging_[std::size_t(b.slot)], b.range.end - b.range.begin, g.dtype);
  const Buffer part = own_part(b, data);
  b.slot = -1;
  if (part.count == 0) return;
  const Buffer dst = own_slice_part(b);
  // Released gradients are gone from the loop's storage: what an earlier backward since the
  // loop's last reset reduced lives only in the slice, so this one adds to it (as autograd
  // adds into .grad()). Gradients the loop keeps hold everything since its zero_grad: they
  // replace it.
  if (lent_ && !slices_withdrawn_)
    weighted_sum(dst, std::span(&part, 1), kPlainSum, 1.0, compute_context(comm_));
  else
    copy_buffer(dst, part, stream);
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
  // A loop that never gathers reads stale (or never updated) parameters: say so, every rank.
  ACCEL_CHECK_ARG(!gatherer_ || gatherer_->gathered_since_invalidate(),
                  "ZeRO-3: gradients are being synchronised but no unit was gathered since the "
                  "last optimizer step, so the loop computed them from parameters this rank "
                  "holds only a slice of; bracket each unit's forward and backward with "
                  "acc.gather_parameters(unit, pass) (or use zero_stage 1 or 2)");
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
    slices_withdrawn_ = false;
  }
  average_across_replicas();
  if (!offload_) return;
  // The optimizer reads the reduced slices in host memory: the one place the host waits.
  const DeviceStream stream = comm_.compute_stream();
  for (std::size_t f = 0; f < layout_.groups().size(); ++f)
    copy_buffer(host_grads_[f].view(), grad_slice(f), stream);
  synchronize_stream(stream, comm_.cuda_device(), comm_.timeout(),
                     "ZeRO offload: rank " + std::to_string(comm_.rank()) +
                         " copying its reduced gradient slices to host memory");
}

void ZeroStrategy::average_across_replicas() {
  // HYBRID_SHARD: each machine's slices hold its own average; the same slice on every machine
  // then becomes the global one. Linear, so a slice that already holds an earlier sync's
  // (equal) average keeps it.
  if (replicas_ == nullptr || replicas_->world_size() == 1) return;
  std::vector<WorkPtr> works;
  for (std::size_t f = 0; f < layout_.groups().size(); ++f)
    if (grad_slice(f).count > 0)
      works.push_back(replicas_->all_reduce(grad_slice(f), ReduceOp::avg));
  for (auto& w : works) w->wait_stream(comm_.compute_stream(), comm_.timeout());
}

void ZeroStrategy::after_optimizer_step() {
  const DeviceStream stream = comm_.compute_stream();
  if (gatherer_) {  // stage 3: nothing gathered is current; the persistent ones follow
    for (std::size_t f = 0; offload_ && f < layout_.groups().size(); ++f)
      copy_buffer(owned_params(f), host_params_[f].view(), stream);
    gatherer_->invalidate();
    gatherer_->finish_recording();
    gatherer_->refresh_persistent();
    return;
  }
  std::vector<WorkPtr> works;
  for (std::size_t f = 0; f < layout_.groups().size(); ++f) {
    const Buffer full = flat_params(f);
    const Shard own = layout_.owned(f);
    // Offloaded: the optimizer updated the host copy; the all-gather issued next is ordered
    // after this copy on the compute stream. The host copy is not written again before the
    // next step, after sync_gradients() waited for this stream.
    if (offload_) copy_buffer(full.slice(own.offset, own.count), host_params_[f].view(), stream);
    works.push_back(shard_.all_gather(full.slice(own.offset, own.count), full));
  }
  for (auto& w : works) w->wait_stream(stream, comm_.timeout());
  if (flat_parameters_) return;
  for (std::size_t i = 0; i < params_.size(); ++i)
    copy_buffer(params_[i].data, param_slot(i), stream);
}

}  // namespace accel
