#include "backends/comm/gloo/gloo_communicator.hpp"

#include <cstdlib>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "backends/comm/gloo/gloo_store_adapter.hpp"
#include "backends/comm/gloo/tcp_device.hpp"
#include "foundation/env_value.hpp"
#include "foundation/error.hpp"
#include "foundation/store/prefix_store.hpp"
#include "foundation/store/store_join.hpp"

namespace accel {
namespace {

// Slot prefixes for the operations we build on unbound buffers; Gloo's own use 0x01-0x08.
constexpr std::uint8_t kReduceScatterSlotPrefix = 0x40;
constexpr std::uint8_t kPointToPointSlotPrefix = 0x41;

// How long, after a timeout, to wait for the other ranks' own timeout reports.
constexpr Milliseconds kTimeoutReportGrace = std::chrono::seconds(5);

std::string timeout_key(int rank) { return "timed_out_at/" + std::to_string(rank); }

// Gloo's typed setters only need an element of the right size.
template <typename Fn>
void with_element_type(DType dtype, Fn&& fn) {
  switch (element_size(dtype)) {
    case 2:
      return fn(std::uint16_t{});
    case 4:
      return fn(std::uint32_t{});
    case 8:
      return fn(std::uint64_t{});
  }
  throw InvalidArgument("gloo: unsupported element size for " + std::string(dtype_name(dtype)));
}

// Runs a Gloo call, turning its exceptions into ours: a timeout stays a timeout so the base
// class can name the ranks not heard from.
template <typename Fn>
void gloo_call(Fn&& fn) {
  try {
    fn();
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    if (what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos)
      throw TimeoutError("gloo: " + what);
    throw CommError("gloo: " + what);
  } catch (const gloo::Exception& e) {
    throw CommError(std::string("gloo: ") + e.what());
  }
}

void wait_send(gloo::transport::UnboundBuffer& buf, Milliseconds timeout) {
  gloo_call([&] {
    if (!buf.waitSend(timeout)) throw CommError("gloo: send aborted");
  });
}

void wait_recv(gloo::transport::UnboundBuffer& buf, Milliseconds timeout) {
  gloo_call([&] {
    if (!buf.waitRecv(timeout)) throw CommError("gloo: recv aborted");
  });
}

}  // namespace

GlooCommunicator::GlooCommunicator(const CommOptions& options)
    : Communicator(options.rank, options.world_size, options.timeout) {
  ACCEL_CHECK_ARG(options.store != nullptr, "the gloo communicator needs a rendezvous store");
  const std::size_t inline_bytes = env_uint("ACCEL_GLOO_INLINE_BYTES", kInlineBytes);
  store_ = std::make_shared<PrefixStore>("gloo/" + options.group_name, options.store);

  // Join: each rank announces itself, so a rank that never comes can be named.
  const std::vector<int> missing =
      join_on_store(*store_, "joined/", rank(), world_size(), options.timeout);
  if (!missing.empty()) {
    throw TimeoutError("rank " + std::to_string(rank()) + ": gloo group '" + options.group_name +
                       "' timed out after " + std::to_string(options.timeout.count()) +
                       " ms waiting for ranks " + format_ranks(missing) + " of " +
                       std::to_string(world_size()) + " to join");
  }

  device_ = make_tcp_device(options.hostname);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank(), world_size());
  context->setTimeout(options.timeout);
  GlooStoreAdapter adapter(store_, options.timeout);
  try {
    gloo_call([&] { context->connectFullMesh(adapter, device_); });
  } catch (const Error& e) {
    throw CommError("rank " + std::to_string(rank()) + ": gloo could not connect group '" +
                    options.group_name + "': " + e.what());
  }
  context_ = std::move(context);
  set_inline_max_bytes(inline_bytes);
}

GlooCommunicator::~GlooCommunicator() { stop_worker(); }

struct GlooCommunicator::Staging {
  std::vector<char> send, recv;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buf, recv_buf;
};

GlooCommunicator::Staging& GlooCommunicator::staging(std::size_t bytes) {
  if (!staging_) staging_ = std::make_unique<Staging>();
  Staging& s = *staging_;
  if (s.send.size() < bytes || !s.send_buf) {
    const std::size_t size = std::max<std::size_t>(bytes, 1);
    s.send.assign(size, 0);  // assign touches the pages once, here
    s.recv.assign(size, 0);
    s.send_buf = context_->createUnboundBuffer(s.send.data(), s.send.size());
    s.recv_buf = context_->createUnboundBuffer(s.recv.data(), s.recv.size());
  }
  return s;
}

void GlooCommunicator::run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) {
  const ReduceKernel kernel = reduce_kernel(data.dtype, wire_op(op));
  with_element_type(data.dtype, [&](auto element) {
    using T = decltype(element);
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(static_cast<T*>(data.data), data.count);
    opts.setReduceFunction(
        [kernel](void* out, const void* a, const void* b, size_t n) { kernel(out, a, b, n); });
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setTag(next_tag());
    opts.setTimeout(timeout);
    gloo_call([&] { gloo::allreduce(opts); });
  });
  if (op == ReduceOp::avg) finish_average(data);
}

void GlooCommunicator::run_broadcast(Buffer data, int root, Milliseconds timeout) {
  with_element_type(data.dtype, [&](auto element) {
    using T = decltype(element);
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<T*>(data.data), data.count);
    opts.setRoot(root);
    opts.setTag(next_tag());
    opts.setTimeout(timeout);
    gloo_call([&] { gloo::broadcast(opts); });
  });
}

void GlooCommunicator::run_all_gather(Buffer input, Buffer output, const Parts& parts,
                                      Milliseconds timeout) {
  const std::vector<std::size_t> counts = parts.counts();
  with_element_type(output.dtype, [&](auto element) {
    using T = decltype(element);
    gloo::AllgathervOptions opts(context_);
    // Gloo reads the input even when empty; give it a valid pointer for a zero-sized part.
    T dummy{};
    // An input inside the output (in place: this rank's part of it, as ZeRO gathers its
    // parameters; or anywhere else): Gloo memcpy's the input into the output, which must not
    // overlap it, so it gets a copy.
    std::vector<T> copy;
    T* in = input.count ? static_cast<T*>(input.data) : &dummy;
    if (overlaps(input, output)) {
      copy.assign(in, in + input.count);
      in = copy.data();
    }
    opts.setInput(in, input.count);
    opts.setOutput(static_cast<T*>(output.data), counts);
    opts.setTag(next_tag());
    opts.setTimeout(timeout);
    gloo_call([&] { gloo::allgatherv(opts); });
  });
}

// Ring reduce-scatter: in step s (0 .. n-2) rank r sends its partial sum of part (r-s-1) to
// rank r+1 and receives the partial sum of part (r-s-2) from rank r-1, adding its own input
// to it. After n-1 steps rank r holds the full reduction of part r. Every byte of the input
// crosses the ring once: (n-1)/n of the buffer per rank, as in NCCL's ring.
void GlooCommunicator::run_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                          const Parts& parts, Milliseconds timeout) {
  const int n = world_size(), r = rank();
  const std::size_t esize = element_size(input.dtype);
  if (n == 1) {
    std::memmove(output.data, input.data, output.bytes());
    return;
  }
  const ReduceKernel kernel = reduce_kernel(input.dtype, wire_op(op));
  const auto part = [&](int i) { return parts[std::size_t(((i % n) + n) % n)]; };
  const std::size_t largest = parts.largest();

  // Two staging buffers: the partial sum being sent and the one being received.
  Staging& stage = staging(largest * esize);
  char* send_stage = stage.send.data();
  char* recv_stage = stage.recv.data();
  auto& send_buf = stage.send_buf;
  auto& recv_buf = stage.recv_buf;
  const std::uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  const char* in = static_cast<const char*>(input.data);

  // Step 0 sends this rank's own input of part r-1.
  const Shard first = part(r - 1);
  std::memcpy(send_stage, in + first.offset * esize, first.count * esize);
  std::size_t send_count = first.count;

  for (int step = 0; step < n - 1; ++step) {
    const Shard incoming = part(r - step - 2);
    gloo_call([&] {
      if (incoming.count) recv_buf->recv(left, slot, 0, incoming.count * esize);
      if (send_count) send_buf->send(right, slot, 0, send_count * esize);
    });
    if (incoming.count) wait_recv(*recv_buf, timeout);
    if (send_count) wait_send(*send_buf, timeout);
    // Add this rank's own contribution; the last step lands in the output.
    void* dst = (step == n - 2) ? output.data : send_stage;
    if (incoming.count) kernel(dst, recv_stage, in + incoming.offset * esize, incoming.count);
    send_count = incoming.count;
  }
  if (op == ReduceOp::avg) finish_average(output);
}

void GlooCommunicator::run_barrier(Milliseconds timeout) {
  gloo::BarrierOptions opts(context_);
  opts.setTag(next_tag());
  opts.setTimeout(timeout);
  gloo_call([&] { gloo::barrier(opts); });
}

void GlooCommunicator::run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) {
  if (data.count == 0) return;
  auto buf = context_->createUnboundBuffer(data.data, data.bytes());
  gloo_call([&] { buf->send(dst, gloo::Slot::build(kPointToPointSlotPrefix, tag)); });
  wait_send(*buf, timeout);
}

void GlooCommunicator::run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) {
  if (data.count == 0) return;
  auto buf = context_->createUnboundBuffer(data.data, data.bytes());
  gloo_call([&] { buf->recv(src, gloo::Slot::build(kPointToPointSlotPrefix, tag)); });
  wait_recv(*buf, timeout);
}

// Every rank that times out reports the operation it was stuck in; a rank that reports
// nothing within the grace period, or an earlier operation, never reached this one.
std::vector<int> GlooCommunicator::ranks_not_heard_from(std::uint64_t seq) {
  std::vector<int> missing;
  try {
    store_->set(timeout_key(rank()), std::to_string(seq));
    const auto deadline = std::chrono::steady_clock::now() + kTimeoutReportGrace;
    std::vector<int> pending;
    for (int r = 0; r < world_size(); ++r)
      if (r != rank()) pending.push_back(r);
    while (!pending.empty() && std::chrono::steady_clock::now() < deadline) {
      std::erase_if(pending, [&](int r) {
        if (!store_->check({timeout_key(r)})) return false;
        return std::stoull(store_->get(timeout_key(r), timeout())) >= seq;
      });
      if (!pending.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    missing = pending;
  } catch (const std::exception&) {
    return {};  // the store itself is gone: nothing is knowable
  }
  return missing;
}

}  // namespace accel
