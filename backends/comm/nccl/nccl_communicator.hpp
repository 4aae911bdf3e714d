#pragma once
// The Communicator over NCCL, for CUDA buffers: one process per GPU, joined through the
// rendezvous store (rank 0 publishes the NCCL unique id there).
//
// Streams and ordering (the contract of communicator.hpp, "Device buffers and streams"):
//   - the communicator has its own non-blocking CUDA stream; NCCL kernels run there only;
//   - issuing an operation (on the caller's thread) records an event on the caller's compute
//     stream (set_compute_stream; default the legacy default stream, which also covers every
//     blocking stream); the operation's NCCL kernels wait for that event on our stream
//     (cudaStreamWaitEvent), never on the host. So a buffer the caller filled on its compute
//     stream before issuing is complete when NCCL reads it; work queued later is not waited for;
//   - the worker thread launches each operation as soon as it is its turn (launches are not
//     held back by earlier operations still running) and records a completion event after it;
//     Work::wait_stream(s) makes stream s wait for that event, Work::wait() blocks the host until
//     the worker saw it complete (polling the event and NCCL's asynchronous error state);
//   - buffers written on any other stream of the caller's must be synchronised by the caller,
//     or recorded into the compute stream, before issuing.
//
// Timeouts: joining (ncclCommInitRankConfig on a nonblocking communicator) and every operation
// (from its launch) give up after the timeout, naming the operation and its sequence number;
// the NCCL communicator is then aborted (ncclCommAbort), which stops its kernels, and every
// later operation fails.
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
  int cuda_device() const override;

  struct State;  // CUDA and NCCL handles; kept out of this header so users need neither SDK

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
  std::shared_ptr<void> on_issue(DeviceStream compute_stream) override;

 private:
  // Launches one operation after its issued inputs and defers its completion to the worker.
  template <typename Enqueue>
  void run(const std::string& what, Milliseconds timeout, Enqueue&& enqueue);
  std::unique_ptr<State> state_;
};

// For `accel env`: the NCCL library's version ("2.21.5"), and what the CUDA runtime sees
// ("runtime 13.0, driver 12.8, 1 device" or "no driver: ...").
std::string nccl_library_version();
std::string cuda_summary();

}  // namespace accel
