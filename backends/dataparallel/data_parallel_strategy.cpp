#include "backends/dataparallel/data_parallel_strategy.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "backends/comm/device_memory.hpp"
#include "backends/comm/error.hpp"
#include "backends/comm/reduce.hpp"
#include "backends/replicas.hpp"

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

template <typename T>
T* at(const Buffer& b, std::size_t offset) {
  return static_cast<T*>(b.data) + offset;
}

// dst[j] = (w[0] dst[j] + sum_k w[k] src_k[j]) / divide_by over [begin, end), in T (float
// weights 1 and no division: plain additions, as one replica summing its rows would round).
template <typename T>
void weighted_sum(const std::vector<Buffer>& grads, const std::vector<double>& w,
                  double divide_by, bool plain, std::size_t begin, std::size_t end) {
  T* dst = at<T>(grads[0], 0);
  if (plain) {
    for (std::size_t k = 1; k < grads.size(); ++k) {
      const T* src = at<T>(grads[k], 0);
      for (std::size_t j = begin; j < end; ++j) dst[j] += src[j];
    }
    return;
  }
  for (std::size_t j = begin; j < end; ++j) {
    double s = w[0] * double(dst[j]);
    for (std::size_t k = 1; k < grads.size(); ++k) s += w[k] * double(at<T>(grads[k], 0)[j]);
    dst[j] = T(s / divide_by);
  }
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
                                           std::vector<Buffer> buffers,
                                           DataParallelOptions options)
    : comm_(comm), pool_(options.replicas, std::move(options.worker_init)) {
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
      ACCEL_CHECK_ARG(p.data.device == DeviceKind::cpu,
                      who + ": parameter '" + p.name +
                          "' is not on the CPU (only CPU replicas are implemented)");
      if (p.grad.data == nullptr) {  // storage from here, zeroed
        owned_grads_.emplace_back(p.data.count, p.data.dtype, MemoryKind::host);
        p.grad = owned_grads_.back().view();
        gradient_bytes_ += p.data.bytes();
      }
      ACCEL_CHECK_ARG(p.grad.dtype == p.data.dtype && p.grad.count == p.data.count,
                      who + ": parameter '" + p.name +
                          "' has a gradient of another shape or dtype");
    }
    for (std::size_t b = 0; b < buffers_[k].size(); ++b)
      ACCEL_CHECK_ARG(buffers_[k][b].bytes() == buffers_[0][b].bytes(),
                      who + ": buffer " + std::to_string(b) + " differs from replica 0's in size");
  }
  weights_.assign(k_count, 1.0);
}

DataParallelStrategy::~DataParallelStrategy() = default;

void DataParallelStrategy::prepare() {
  copy_parameters();
  sync_buffers();
}

Buffer DataParallelStrategy::grad_view(int replica, std::size_t index) const {
  ACCEL_CHECK_ARG(replica >= 0 && replica < replicas() && index < replicas_[0].size(),
                  "DataParallel: no parameter " + std::to_string(index) + " in replica " +
                      std::to_string(replica));
  return replicas_[std::size_t(replica)][index].grad;
}

std::vector<ParamSegment> DataParallelStrategy::segments() const {
  return full_segments(replicas_[0]);
}

void DataParallelStrategy::copy_parameters() {
  if (replicas() == 1) return;
  std::size_t total = 0;
  for (const ParamRef& p : replicas_[0]) total += p.data.count;
  pool_.run_ranges(total, [&](std::size_t from, std::size_t to) {
    for (const Span& s : spans_of(replicas_[0], from, to)) {
      const Buffer& src = replicas_[0][s.param].data;
      const std::size_t size = element_size(src.dtype);
      for (std::size_t k = 1; k < replicas_.size(); ++k)
        std::memcpy(static_cast<std::byte*>(replicas_[k][s.param].data.data) + s.begin * size,
                    static_cast<const std::byte*>(src.data) + s.begin * size,
                    (s.end - s.begin) * size);
    }
  });
}

void DataParallelStrategy::sync_buffers() {
  // Small (BatchNorm statistics): copied on the calling thread.
  for (std::size_t k = 1; k < buffers_.size(); ++k)
    for (std::size_t b = 0; b < buffers_[0].size(); ++b)
      if (buffers_[k][b].data != buffers_[0][b].data)
        std::memcpy(buffers_[k][b].data, buffers_[0][b].data, buffers_[0][b].bytes());
}

void DataParallelStrategy::set_replica_weights(std::vector<double> weights) {
  ACCEL_CHECK_ARG(weights.size() == replicas_.size(),
                  "DataParallel: " + std::to_string(weights.size()) + " weights for " +
                      std::to_string(replicas_.size()) + " replicas");
  if (accumulated_ && weights != weights_) {
    // Gradients accumulated under the old weights: fold them into replica 0 now, scaled by
    // 1 / the new weight of replica 0, which the final reduction multiplies back.
    ACCEL_CHECK_ARG(weights[0] != 0.0, "DataParallel: replica 0's weight must not be 0");
    reduce_into_replica0(weights[0]);
  }
  weights_ = std::move(weights);
  accumulated_ = true;  // a backward follows
}

void DataParallelStrategy::sync_gradients() {
  if (!sync_enabled_) return;
  reduce_into_replica0();
  accumulated_ = false;
}

void DataParallelStrategy::reduce_into_replica0(double divide_by) {
  if (replicas() == 1 && weights_[0] == 1.0 && divide_by == 1.0) return;
  bool plain = divide_by == 1.0;
  for (double w : weights_) plain = plain && w == 1.0;
  std::size_t total = 0;
  for (const ParamRef& p : replicas_[0]) {
    total += p.data.count;
    ACCEL_CHECK_ARG(plain || p.data.dtype == DType::f32 || p.data.dtype == DType::f64,
                    "DataParallel: weighted gradient sums need f32 or f64 gradients, parameter '" +
                        p.name + "' is " + std::string(dtype_name(p.data.dtype)));
  }
  pool_.run_ranges(total, [&](std::size_t from, std::size_t to) {
    std::vector<Buffer> grads(replicas_.size());
    for (const Span& s : spans_of(replicas_[0], from, to)) {
      for (std::size_t k = 0; k < replicas_.size(); ++k) grads[k] = replicas_[k][s.param].grad;
      const DType dtype = grads[0].dtype;
      if (dtype == DType::f32)
        weighted_sum<float>(grads, weights_, divide_by, plain, s.begin, s.end);
      else if (dtype == DType::f64)
        weighted_sum<double>(grads, weights_, divide_by, plain, s.begin, s.end);
      else  // plain sums of other dtypes: the communicators' reduction kernels
        for (std::size_t k = 1; k < grads.size(); ++k)
          reduce_elements(grads[0].slice(s.begin, s.end - s.begin).data,
                          grads[0].slice(s.begin, s.end - s.begin).data,
                          grads[k].slice(s.begin, s.end - s.begin).data, s.end - s.begin, dtype,
                          ReduceOp::sum);
      const std::size_t size = element_size(dtype);
      for (std::size_t k = 1; k < grads.size(); ++k)
        std::memset(static_cast<std::byte*>(grads[k].data) + s.begin * size, 0,
                    (s.end - s.begin) * size);
    }
  });
}

}  // namespace accel
