#pragma once
// A pipeline stage's links to its neighbours: one two-rank communicator per direction and kind
// (activations from stage a to b, gradients from b to a), each with its own worker thread, so
// a send waiting for its receiver never holds up a receive, and every message of a channel
// arrives in the order sent (both ends follow the schedule's order). Sends are asynchronous
// (waited for at the end of the step); receives are waited for before the compute that needs
// them: the eager model the schedules are checked under (schedule_simulation.hpp).
//
// An activation's shape and dtype travel with the step's first micro-batch (a header of
// int64s before the data); later micro-batches of the step have the same shape, and a
// gradient has its activation's.
//
// A message that fails (the peer died, raised, or timed out) throws a CommError naming this
// stage, the peer stage and rank, the message, and the job's first failure where one was
// posted (Accelerator::post_failure): a dead stage stops its neighbours, they stop theirs.
// After a failure the channels are not to be destroyed (a pending message's worker may wait
// for a peer that never answers): TorchPipeline abandons them.

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/Tensor.h>

#include "accelerate/pipeline/schedule.hpp"
#include "backends/comm/communicator.hpp"

namespace accel {
class Accelerator;
}

namespace accel::pipeline::detail {

class StageChannels {
 public:
  // Collective over the world (each rank makes the channels it is an end of, in one global
  // order): the channels of replica `replica`'s pipeline that `stage` sends or receives on.
  StageChannels(Accelerator& accelerator, const PipelineShape& shape, int replicas, int replica,
                int stage);

  // "stage 1 (rank 3)": a stage of this replica's pipeline as errors name it.
  std::string who(int stage) const;

  // Issues a send of `t` (contiguous: a copy is kept until the send completes); with_header:
  // its shape and dtype go first.
  void send(const Action& a, const at::Tensor& t, bool with_header);
  // Issues a receive and returns the tensor it fills (valid after wait_receives()): its shape
  // and dtype from the header when with_header, else like `like`'s.
  at::Tensor receive(const Action& a, bool with_header, const at::Tensor& like);
  void wait_receives();
  void wait_sends();

 private:
  struct Pending {
    at::Tensor tensor;  // kept alive until the message completes
    WorkPtr work;
    Action action;
  };
  Communicator& channel(const Action& a);
  void wait_all(std::vector<Pending>& pending);
  // (gradient?, from stage, to stage) -> the channel; rank 0 of it sends, rank 1 receives.
  std::map<std::tuple<bool, int, int>, CommunicatorPtr> channels_;
  Accelerator& accelerator_;
  int stages_, replica_, stage_;
  std::vector<Pending> sends_, receives_;
};

}  // namespace accel::pipeline::detail
