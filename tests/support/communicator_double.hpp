#pragma once
// The base of a unit test's Communicator double: a world of `world_size` in which every
// operation succeeds at once and moves nothing. A double overrides what its test watches, and
// its own destructor calls stop_worker() first, as every backend's does, so the worker never
// runs an operation on a half-destroyed double.

#include <string_view>

#include "backends/comm/communicator.hpp"

namespace accel::test {

class CommunicatorDouble : public Communicator {
 public:
  CommunicatorDouble(int rank, int world_size, Milliseconds timeout)
      : Communicator(rank, world_size, timeout) {}
  ~CommunicatorDouble() override { stop_worker(); }
  std::string_view backend_name() const override { return "double"; }

 protected:
  void run_all_reduce(Buffer, ReduceOp, Milliseconds) override {}
  void run_broadcast(Buffer, int, Milliseconds) override {}
  void run_all_gather(Buffer, Buffer, const Parts&, Milliseconds) override {}
  void run_reduce_scatter(Buffer, Buffer, ReduceOp, const Parts&, Milliseconds) override {}
  void run_barrier(Milliseconds) override {}
  void run_send(Buffer, int, std::uint32_t, Milliseconds) override {}
  void run_recv(Buffer, int, std::uint32_t, Milliseconds) override {}
};

}  // namespace accel::test
