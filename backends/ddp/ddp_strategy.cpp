#include "backends/ddp/ddp_strategy.hpp"

#include <algorithm>
#include <cstring>

#include "backends/replica_sync.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/error.hpp"

namespace accel {

struct DdpStrategy::Bucket {
  DType dtype;
  std::vector<std::size_t> params;
  std::size_t count = 0;  // elements
  DeviceBuffer storage;   // in replica_memory, when not in the symmetric memory
  Buffer flat;
  std::size_t pending = 0;  // gradients not yet ready this iteration
  WorkPtr work;
};

namespace {
// A bucket's bytes in the symmetric memory: whole cache lines, so every bucket starts on one.
std::size_t aligned_bytes(std::size_t count, DType dtype) {
  return (count * element_size(dtype) + 63) / 64 * 64;
}
}  // namespace

DdpStrategy::DdpStrategy(Communicator& comm, std::vector<ParamRef> params,
                         std::vector<Buffer> buffers, DdpOptions options)
    : comm_(comm),
      params_(std::move(params)),
      buffers_(std::move(buffers)),
      options_(options),
      bucket_of_(params_.size()),
      offset_of_(params_.size()),
      ready_(params_.size(), false) {
  ACCEL_CHECK_ARG(options_.bucket_cap_bytes > 0 && options_.first_bucket_bytes > 0,
                  "DDP bucket sizes must be positive");
  check_replica_params("DDP", comm_, params_);
  // Reverse parameter order: backward produces the last layers' gradients first. Each dtype
  // fills its own open bucket; the very first bucket is capped smaller so the first
  // all-reduce starts early in backward.
  constexpr std::size_t kNone = std::size_t(-1);
  std::vector<std::size_t> open(std::size(kAllDTypes), kNone);  // dtype -> open bucket index
  for (std::size_t k = params_.size(); k-- > 0;) {
    const ParamRef& p = params_[k];
    std::size_t& b = open[std::size_t(p.data.dtype)];
    if (b != kNone) {
      const std::size_t cap = b == 0 ? options_.first_bucket_bytes : options_.bucket_cap_bytes;
      if ((buckets_[b]->count + p.data.count) * element_size(p.data.dtype) > cap) b = kNone;
    }
    if (b == kNone) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->dtype = p.data.dtype;
      b = buckets_.size() - 1;
    }
    bucket_of_[k] = b;
    offset_of_[k] = buckets_[b]->count;
    buckets_[b]->params.push_back(k);
    buckets_[b]->count += p.data.count;
  }
  // Allocated (and on the host touched) once here: all buckets in one piece of the
  // communicator's symmetric memory where it has some (its all-reduce then reads the peers'
  // buckets in place), else each bucket on the communicator's device.
  std::size_t total = 0;
  for (auto& b : buckets_) total += aligned_bytes(b->count, b->dtype);
  symmetric_ = comm_.allocate_symmetric(total / 8, DType::i64);  // whole cache lines
  std::size_t at = 0;
  for (auto& b : buckets_) {
    if (symmetric_.view().data) {
      b->flat = Buffer{static_cast<char*>(symmetric_.view().data) + at, b->count, b->dtype,
                       symmetric_.view().device};
      at += aligned_bytes(b->count, b->dtype);
    } else {
      b->storage = DeviceBuffer(b->count, b->dtype, replica_memory(comm_), comm_.cuda_device());
      b->flat = b->storage.view();
    }
    b->pending = b->params.size();
  }
  // A gradient given without storage lives in its bucket slot (gradient_as_bucket_view).
  for (std::size_t k = 0; k < params_.size(); ++k)
    if (params_[k].grad.data == nullptr) params_[k].grad = grad_slot(0, k);
}

DdpStrategy::~DdpStrategy() {
  // Operations still in flight write into our buckets: let them finish first.
  for (auto& b : buckets_)
    if (b->work) try {
        b->work->wait();
      } catch (...) {
      }
}

Buffer DdpStrategy::grad_slot(int replica, std::size_t index) const {
  ACCEL_CHECK_ARG(
      replica == 0 && index < params_.size(),
      "DDP: no parameter " + std::to_string(index) + " in replica " + std::to_string(replica));
  return buckets_[bucket_of_[index]]->flat.slice(offset_of_[index], params_[index].data.count);
}

std::vector<std::vector<std::size_t>> DdpStrategy::bucket_layout() const {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& b : buckets_) out.push_back(b->params);
  return out;
}

std::vector<ParamSegment> DdpStrategy::segments() const { return full_segments(params_); }

std::size_t DdpStrategy::gradient_bytes() const {
  std::size_t bytes = 0;
  for (const auto& b : buckets_) bytes += b->flat.bytes();
  return bytes;
}

void DdpStrategy::prepare() { broadcast_from_rank0(comm_, params_, buffers_); }

void DdpStrategy::sync_buffers() {
  if (!options_.broadcast_buffers || comm_.world_size() == 1) return;
  broadcast_from_rank0(comm_, {}, buffers_);
}

void DdpStrategy::copy_into_bucket(std::size_t index) {
  // On the compute stream, where the loop produced the gradient; the all-reduce issued after
  // it is ordered after the copy (communicator.hpp, "Device buffers and streams").
  copy_buffer(grad_slot(0, index), params_[index].grad, comm_.compute_stream());
}

void DdpStrategy::grad_ready(std::size_t index) {
  if (!sync_enabled_) return;
  ACCEL_CHECK_ARG(index < params_.size(), "DDP: no parameter " + std::to_string(index));
  copy_into_bucket(index);
  std::lock_guard lock(mutex_);
  if (ready_[index]) throw InvalidArgument(ready_twice_problem("DDP", params_[index].name));
  ready_[index] = true;
  --buckets_[bucket_of_[index]]->pending;
  launch_ready_buckets();
}

void DdpStrategy::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) {
    Bucket& b = *buckets_[next_launch_++];
    b.work = comm_.all_reduce(b.flat, ReduceOp::avg);
  }
}

void DdpStrategy::sync_gradients() {
  if (!sync_enabled_) return;
  {
    std::lock_guard lock(mutex_);
    // A gradient not reported this micro-batch (its parameter was not used) contributes what
    // its buffer holds: what earlier micro-batches accumulated, or the zeros zero_grad left.
    // Reducing it now means no rank ever waits for it.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      copy_into_bucket(i);
      ready_[i] = true;
      --buckets_[bucket_of_[i]]->pending;
    }
    launch_ready_buckets();
  }
  // The compute stream waits for each bucket's all-reduce; the host does not wait for the GPU
  // (with a CPU communicator this is a plain wait).
  const DeviceStream stream = comm_.compute_stream();
  std::exception_ptr error;
  for (auto& b : buckets_) {
    try {
      if (b->work) b->work->wait_stream(stream, comm_.timeout());
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    b->work.reset();
    b->pending = b->params.size();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  if (error) std::rethrow_exception(error);
  for (auto& b : buckets_)
    for (std::size_t k : b->params) copy_buffer(params_[k].grad, grad_slot(0, k), stream);
}

}  // namespace accel
