#pragma once
// Collectives over Gloo's TCP transport (Debian's libgloo), rendezvous through our Store.
// all_reduce, broadcast, all_gather(v) and barrier are Gloo's own algorithms; reduce_scatter
// is a ring over Gloo's unbound buffers (Gloo has no general one), and send/recv use them
// directly.

#include <memory>
#include <vector>

#include "backends/comm/communicator.hpp"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace accel {

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group: every rank announces itself in the store, then Gloo connects a full
  // mesh. Throws TimeoutError naming the ranks that did not join within options.timeout.
  explicit GlooCommunicator(const CommOptions& options);
  ~GlooCommunicator() override;
  std::string_view backend_name() const override { return "gloo"; }
  // Operations of at most this many bytes run on the caller's thread (communicator.hpp's
  // inline execution); ACCEL_GLOO_INLINE_BYTES overrides it (0: only barriers), for
  // experiments. Gloo's calls carry their own timeouts, so running them inline keeps that.
  static constexpr std::size_t kInlineBytes = 256 * 1024;

  // The TCP device this group's pairs run on (tcp_device.hpp): one event-loop thread, which
  // hands every message to the waiting caller. comm_bench can connect its raw Gloo baseline
  // on it (--raw_gloo_device shared), so that a ratio shows only what this class adds.
  const std::shared_ptr<gloo::transport::Device>& transport_device() const { return device_; }

 protected:
  void run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) override;
  void run_broadcast(Buffer data, int root, Milliseconds timeout) override;
  void run_all_gather(Buffer input, Buffer output, const Parts& parts,
                      Milliseconds timeout) override;
  void run_reduce_scatter(Buffer input, Buffer output, ReduceOp op, const Parts& parts,
                          Milliseconds timeout) override;
  void run_barrier(Milliseconds timeout) override;
  void run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) override;
  void run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) override;
  std::vector<int> ranks_not_heard_from(std::uint64_t seq) override;

 private:
  // Gloo tags its collectives; ours follow the operation sequence so a mismatch between
  // ranks cannot silently pair unrelated operations.
  std::uint32_t next_tag() { return tag_++; }

  // reduce_scatter's two staging buffers, grown on demand and kept: touching fresh memory
  // costs more than the transfer on this kind of machine. Only the worker thread uses them.
  struct Staging;
  Staging& staging(std::size_t bytes);

  StorePtr store_;  // prefixed with this group's namespace
  std::unique_ptr<Staging> staging_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::uint32_t tag_ = 0;
};

}  // namespace accel
