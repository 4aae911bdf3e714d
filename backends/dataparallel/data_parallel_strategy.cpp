#include "backends/dataparallel/data_parallel_strategy.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "backends/optim/elementwise.hpp"
#include "backends/replica_sync.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

std::string replica_name(std::size_t k) { return "DataParallel: replica " + std::to_string(k); }

// For each element of a run of parameters laid end to end: which parameter, where in it.
struct Span {
  std::size_t param, begin, end;  // elements [begin, end) of parameter `param`
};
std::vector<Span> spans_of(const std::vector<ParamRef>& params, std::size_t from, std::size_t to) {
  std::vector<Span> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < params.size() && start < to; ++i) {
    const std::size_t n = params[i].data.count;
    const std::size_t b = std::max(from, start), e = std::min(to, start + n);
    if (b < e) out.push_back({i, b - start, e - start});
    start += n;
  }
  return out;
}

}  // namespace

std::vector<Shard> chunk_rows(std::size_t rows, int replicas) {
  ACCEL_CHECK_ARG(replicas >= 1, "chunk_rows: " + std::to_string(replicas) + " replicas");
  const std::size_t k = std::size_t(replicas);
  const std::size_t size = (rows + k - 1) / k;
  std::vector<Shard> out(k);
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t first = std::min(rows, i * size);
    out[i] = {first, std::min(rows, first + size) - first};
  }
  return out;
}

DataParallelStrategy::DataParallelStrategy(Communicator& comm, std::vector<ParamRef> params,
                                           std::vector<Buffer> buffers, DataParallelOptions options)
    : comm_(comm),
      devices_(std::move(options.cuda_devices)),
      pool_(options.replicas, std::move(options.worker_init)) {
  ACCEL_CHECK_ARG(comm.world_size() == 1,
                  "DataParallel runs in one process; this job has " +
                      std::to_string(comm.world_size()) +
                      " (set num_processes 1, or use MULTI_CPU for DDP across processes)");
  const std::size_t k_count = std::size_t(options.replicas);
  ACCEL_CHECK_ARG(options.replica_params.size() + 1 == k_count,
                  "DataParallel: " + std::to_string(k_count) + " replicas need " +
                      std::to_string(k_count - 1) + " copies of the model's parameters, got " +
                      std::to_string(options.replica_params.size()));
  ACCEL_CHECK_ARG(options.replica_buffers.empty() || options.replica_buffers.size() + 1 == k_count,
                  "DataParallel: buffers given for " +
                      std::to_string(options.replica_buffers.size()) + " replicas, expected " +
                      std::to_string(k_count - 1));
  ACCEL_CHECK_ARG(devices_.empty() || devices_.size() == k_count,
                  "DataParallel: " + std::to_string(devices_.size()) + " CUDA devices for " +
                      std::to_string(k_count) + " replicas");
  ACCEL_CHECK_ARG(!on_gpu() || k_count <= kMaxSummedSources + 1,
                  "DataParallel: " + std::to_string(k_count) + " GPU replicas, at most " +
                      std::to_string(kMaxSummedSources + 1) + " are summed on one GPU");
  replicas_.push_back(std::move(params));
  buffers_.push_back(std::move(buffers));
  for (std::size_t k = 1; k < k_count; ++k) {
    replicas_.push_back(std::move(options.replica_params[k - 1]));
    buffers_.push_back(options.replica_buffers.empty() ? std::vector<Buffer>{}
                                                       : std::move(options.replica_buffers[k - 1]));
  }
  const std::vector<ParamRef>& first = replicas_[0];
  for (std::size_t k = 0; k < k_count; ++k) {
    const std::string who = replica_name(k);
    const int device = cuda_device(int(k));
    ACCEL_CHECK_ARG(replicas_[k].size() == first.size(),
                    who + " has " + std::to_string(replicas_[k].size()) +
                        " parameters, replica 0 has " + std::to_string(first.size()));
    ACCEL_CHECK_ARG(buffers_[k].size() == buffers_[0].size(),
                    who + " has " + std::to_string(buffers_[k].size()) +
                        " buffers, replica 0 has " + std::to_string(buffers_[0].size()));
    for (std::size_t i = 0; i < first.size(); ++i) {
      ParamRef& p = replicas_[k][i];
      ACCEL_CHECK_ARG(p.data.dtype == first[i].data.dtype && p.data.count == first[i].data.count,
                      who + ": parameter " + std::to_string(i) + " ('" + p.name +
                          "') differs from replica 0's in dtype or size");
      ACCEL_CHECK_ARG(!on_gpu() || cuda_device_of(p.data.data) == device,
                      who + ": parameter '" + p.name + "' is not on CUDA device " +
                          std::to_string(device) + ", the replica's (it is on " +
                          (cuda_device_of(p.data.data) < 0
                               ? std::string("the host")
                               : "device " + std::to_string(cuda_device_of(p.data.data))) +
                          ")");
      if (p.grad.data == nullptr) {  // storage from here, zeroed (on the replica's stream too,
        // which the allocation's memset on the legacy default stream may not be ordered before)
        owned_grads_.emplace_back(p.data.count, p.data.dtype,
                                  on_gpu() ? MemoryKind::cuda : MemoryKind::host, device);
        p.grad = owned_grads_.back().view();
        gradient_bytes_ += p.data.bytes();
        if (on_gpu()) {
          CudaDeviceGuard guard(device);
          zero_buffer(p.grad, replica_context(int(k)).stream);
        }
      }
    }
    check_params_on(who, replicas_[k], on_gpu() ? DeviceKind::cuda : DeviceKind::cpu,
                    on_gpu() ? "its replica is on CUDA device " + std::to_string(device)
                             : std::string("the replicas are CPU threads (no cuda_devices)"));
    for (std::size_t b = 0; b < buffers_[k].size(); ++b)
      ACCEL_CHECK_ARG(buffers_[k][b].bytes() == buffers_[0][b].bytes(),
                      who + ": buffer " + std::to_string(b) + " differs from replica 0's in size");
  }
  staging_.resize(k_count - 1);
  for (std::size_t k = 1; on_gpu() && k < k_count; ++k)
    if (devices_[k] != devices_[0])
      for (const ParamRef& p : first) {
        staging_[k - 1].emplace_back(p.data.count, p.data.dtype, MemoryKind::cuda, devices_[0]);
        gradient_bytes_ += p.data.bytes();
      }
  weights_.assign(k_count, 1.0);
}

DataParallelStrategy::~DataParallelStrategy() = default;

void DataParallelStrategy::prepare() {
  copy_parameters();
  sync_buffers();
}

Buffer DataParallelStrategy::grad_slot(int replica, std::size_t index) const {
  ACCEL_CHECK_ARG(replica >= 0 && replica < count() && index < replicas_[0].size(),
                  "DataParallel: no parameter " + std::to_string(index) + " in replica " +
                      std::to_string(replica));
  return replicas_[std::size_t(replica)][index].grad;
}

std::vector<ParamSegment> DataParallelStrategy::segments() const {
  return full_segments(replicas_[0]);
}

int DataParallelStrategy::cuda_device(int replica) const {
  return on_gpu() ? devices_[std::size_t(replica)] : -1;
}

DeviceContext DataParallelStrategy::replica_context(int replica) const {
  if (!on_gpu()) return {};
  DeviceContext ctx{nullptr, devices_[std::size_t(replica)], comm_.timeout()};
  if (replica == 0) ctx.stream = comm_.compute_stream();
  return ctx;
}

void DataParallelStrategy::run(const std::function<void(int)>& fn) {
  if (!on_gpu()) return pool_.run(fn);
  pool_.run([&](int k) {
    CudaDeviceGuard guard(devices_[std::size_t(k)]);
    fn(k);
  });
}

void DataParallelStrategy::copy_from_replica0(const std::vector<std::vector<Buffer>>& views) {
  if (views.size() < 2 || views[0].empty()) return;
  if (on_gpu()) {
    const DeviceContext first = replica_context(0);
    CudaDeviceGuard guard(first.cuda_device);
    for (int k = 1; k < count(); ++k)  // replica k is done with its old values
      stream_wait(first, replica_context(k));
    for (std::size_t k = 1; k < views.size(); ++k)
      for (std::size_t i = 0; i < views[0].size(); ++i)
        copy_buffer(views[k][i], views[0][i], first.stream);
    for (int k = 1; k < count(); ++k) stream_wait(replica_context(k), first);
    return;
  }
  std::size_t total = 0;
  for (const Buffer& b : views[0]) total += b.bytes();
  pool_.run_ranges(total, [&](std::size_t from, std::size_t to) {  // byte ranges
    std::size_t start = 0;
    for (std::size_t i = 0; i < views[0].size() && start < to; ++i) {
      const std::size_t base = start, n = views[0][i].bytes();
      start += n;
      const std::size_t b = std::max(from, base), e = std::min(to, base + n);
      if (b >= e) continue;
      for (std::size_t k = 1; k < views.size(); ++k)
        if (views[k][i].data != views[0][i].data)
          std::memcpy(static_cast<std::byte*>(views[k][i].data) + (b - base),
                      static_cast<const std::byte*>(views[0][i].data) + (b - base), e - b);
    }
  });
}

void DataParallelStrategy::copy_parameters() {
  std::vector<std::vector<Buffer>> views(replicas_.size());
  for (std::size_t k = 0; k < replicas_.size(); ++k)
    for (const ParamRef& p : replicas_[k]) views[k].push_back(p.data);
  copy_from_replica0(views);
}

void DataParallelStrategy::sync_buffers() { copy_from_replica0(buffers_); }

void DataParallelStrategy::set_weights(std::vector<double> weights) {
  ACCEL_CHECK_ARG(weights.size() == replicas_.size(),
                  "DataParallel: " + std::to_string(weights.size()) + " weights for " +
                      std::to_string(replicas_.size()) + " replicas");
  if (reduced_ && weights[0] != 1.0) {
    // Another backward before the optimizer step: replica 0's synchronised gradient must count
    // once in the next reduction, not weights[0] times (the other replicas hold zeros).
    ACCEL_CHECK_ARG(weights[0] != 0.0, "DataParallel: replica 0's weight must not be 0");
    std::fill(weights_.begin(), weights_.end(), 1.0);
    reduce_into_replica0(weights[0]);
  } else if (accumulated_ && weights != weights_) {
    // Gradients accumulated under the old weights: fold them into replica 0 now, scaled by
    // 1 / the new weight of replica 0, which the final reduction multiplies back.
    ACCEL_CHECK_ARG(weights[0] != 0.0, "DataParallel: replica 0's weight must not be 0");
    reduce_into_replica0(weights[0]);
  }
  weights_ = std::move(weights);
  accumulated_ = true;  // a backward follows
  reduced_ = false;
}

void DataParallelStrategy::sync_gradients() {
  if (!sync_enabled_) return;
  reduce_into_replica0();
  accumulated_ = false;
  reduced_ = true;
}

void DataParallelStrategy::reduce_into_replica0(double divide_by) {
  if (count() == 1 && weights_[0] == 1.0 && divide_by == 1.0) return;
  bool plain = divide_by == 1.0;
  for (double w : weights_) plain = plain && w == 1.0;
  for (const ParamRef& p : replicas_[0])  // before anything changes
    ACCEL_CHECK_ARG(plain || p.data.dtype == DType::f32 || p.data.dtype == DType::f64,
                    "DataParallel: weighted gradient sums need f32 or f64 gradients, parameter '" +
                        p.name + "' is " + std::string(dtype_name(p.data.dtype)));
  if (on_gpu()) return reduce_on_gpu(divide_by);
  std::size_t total = 0;
  for (const ParamRef& p : replicas_[0]) total += p.data.count;
  pool_.run_ranges(total, [&](std::size_t from, std::size_t to) {
    std::vector<Buffer> sources(replicas_.size() - 1);
    for (const Span& s : spans_of(replicas_[0], from, to)) {
      const std::size_t n = s.end - s.begin;
      for (std::size_t k = 1; k < replicas_.size(); ++k)
        sources[k - 1] = replicas_[k][s.param].grad.slice(s.begin, n);
      weighted_sum(replicas_[0][s.param].grad.slice(s.begin, n), sources, weights_, divide_by);
      for (const Buffer& g : sources) zero_buffer(g, nullptr);
    }
  });
}

void DataParallelStrategy::reduce_on_gpu(double divide_by) {
  const DeviceContext first = replica_context(0);
  CudaDeviceGuard guard(first.cuda_device);
  for (int k = 1; k < count(); ++k)  // every replica's backward is queued before the sum
    stream_wait(first, replica_context(k));
  std::vector<Buffer> sources(replicas_.size() - 1);
  for (std::size_t i = 0; i < replicas_[0].size(); ++i) {
    for (std::size_t k = 1; k < replicas_.size(); ++k) {
      sources[k - 1] = replicas_[k][i].grad;
      if (!staging_[k - 1].empty()) {  // another device: bring it over first
        const Buffer staged = staging_[k - 1][i].view();
        copy_buffer(staged, sources[k - 1], first.stream);
        sources[k - 1] = staged;
      }
    }
    weighted_sum(replicas_[0][i].grad, sources, weights_, divide_by, first);
  }
  for (int k = 1; k < count(); ++k) {  // zeroed once the sum has read them
    const DeviceContext ctx = replica_context(k);
    stream_wait(ctx, first);
    CudaDeviceGuard on(ctx.cuda_device);
    for (const ParamRef& p : replicas_[std::size_t(k)]) zero_buffer(p.grad, ctx.stream);
  }
}

}  // namespace accel
