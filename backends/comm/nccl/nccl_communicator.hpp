#pragma once
// The Communicator over NCCL, for CUDA buffers: one process per GPU, joined through the
// rendezvous store (rank 0 publishes the NCCL unique id there).
//
// Each operation is enqueued on the communicator's own CUDA stream and waited for on the
// worker thread (polling a CUDA event and NCCL's asynchronous error state), so a Work finishes
// when the result is in memory, as with the CPU backends. Before it starts, the operation
// waits for all work already queued on the legacy default stream (and so on every blocking
// stream): buffers produced there, as LibTorch and plain CUDA code do by default, are complete
// when read. Buffers written on a non-blocking stream of the caller's must be synchronised by
// the caller first.
//
// Timeouts: joining (ncclCommInitRankConfig on a nonblocking communicator) and every operation
// give up after the timeout; the NCCL communicator is then aborted (ncclCommAbort), which stops
// its kernels, and every later operation fails.
//
// Shapes: all_gather and reduce_scatter use ncclAllGather / ncclReduceScatter when the count
// divides evenly over the ranks; otherwise (NCCL needs equal parts) one ncclBroadcast, resp.
// ncclReduce, per rank's part, inside one ncclGroupStart/End so NCCL runs them together. In
// place works when the input is this rank's part of the output (all_gather) or the output is
// this rank's part of the input (reduce_scatter); other overlaps are rejected.
// avg is NCCL's native ncclAvg. send/recv: NCCL has no tags; messages between two ranks pair
// up in issue order, which the in-order worker keeps, so the tag is accepted and ignored.

#include <memory>
#include <string>

#include "backends/comm/communicator.hpp"

namespace accel {

class NcclCommunicator final : public Communicator {
 public:
  // Joins the group of options.world_size ranks through options.store (required) on CUDA
  // device options.cuda_device, or $LOCAL_RANK when that is -1, or 0 when LOCAL_RANK is unset.
  // Throws InvalidArgument for a missing store or device, TimeoutError when not every rank
  // joins within options.timeout, CommError for CUDA/NCCL failures.
  explicit NcclCommunicator(const CommOptions& options);
  ~NcclCommunicator() override;

  std::string_view backend_name() const override { return "nccl"; }
  DeviceKind device() const override { return DeviceKind::cuda; }
  // The CUDA device index this rank uses.
  int cuda_device() const;

 protected:
  void run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) override;
  void run_broadcast(Buffer data, int root, Milliseconds timeout) override;
  void run_all_gather(Buffer input, Buffer output, Milliseconds timeout) override;
  void run_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                          const std::vector<Shard>& parts, Milliseconds timeout) override;
  void run_barrier(Milliseconds timeout) override;
  void run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) override;
  void run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) override;

 private:
  struct State;  // CUDA and NCCL handles; kept out of this header so users need neither SDK
  std::unique_ptr<State> state_;
};

// For `accel env`: the NCCL library's version ("2.21.5"), and what the CUDA runtime sees
// ("runtime 13.0, driver 12.8, 1 device" or "no driver: ...").
std::string nccl_library_version();
std::string cuda_summary();

}  // namespace accel
