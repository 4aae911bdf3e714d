#pragma once
// Pipeline parallelism for a LibTorch Sequential (DeepSpeed's PipelineModule + engine, PyTorch's
// pipelining): the model's children split into P x V contiguous pieces, each rank keeping its
// stage's V pieces, the micro-batches flowing through them by a schedule (schedule.hpp), the
// activations and their gradients sent between neighbours. The world is P stages x D
// data-parallel replicas: rank r is stage r % P of replica r / P, and each stage's D replicas
// average their gradients before the step.
//
//   TorchAccelerator acc;
//   TorchPipeline pipe(acc, model, optimizer, {.pipeline_parallel_size = 2,
//                                              .num_microbatches = 8});
//   for (auto& [x, y] : this replica's batches)   // pipe.data_parallel_rank() of _size()
//     const double loss = pipe.step(x, y, [](const at::Tensor& out, const at::Tensor& t) {
//       return torch::mse_loss(out, t);
//     });
//
// Or TorchPipeline pipe(acc, model, optimizer) with the config's pipeline keys (accel launch
// --pipeline_parallel_size 2 --num_microbatches 8). A replica's processes average their
// gradients as DDP's do; distributed_type ZERO or DATA_PARALLEL is refused.
//
// Every rank of a replica passes the same batch; the first stage reads the input, the last the
// target. step() runs the schedule, averages over the replicas, steps the optimizer (filtered
// to this stage's parameters) and returns the mean loss on every rank; acc.step() counts it.
//
// Checkpoints: acc.save_state(dir) / acc.load_state(dir) as without a pipeline. Each stage
// writes its own layers and optimizer state into the layout every strategy writes
// (detail/stage_checkpoint.hpp), so the checkpoint loads into a pipeline of other stages or
// replicas, without a pipeline (state_dict_type SHARDED_STATE_DICT), and accel merge-weights
// makes one LibTorch archive of it. One pipeline per accelerator.

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/pipeline/pipeline_options.hpp"
#include "accelerate/pipeline/schedule.hpp"
#include "accelerate/torch/pipeline/layer_spec.hpp"
#include "backends/comm/communicator.hpp"

namespace accel {

class TorchAccelerator;

namespace pipeline::detail {
class StageChannels;    // torch/pipeline/detail/stage_channels.hpp
class StageCheckpoint;  // torch/pipeline/detail/stage_checkpoint.hpp
}  // namespace pipeline::detail

class TorchPipeline {
 public:
  // The loss of one micro-batch (a mean over its rows): the last stage calls it.
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

  // Collective over the world: every rank builds the same model (same seed or LayerSpecs) and
  // passes it with the optimizer over its parameters. Refuses a world that is not a multiple of
  // pipeline_parallel_size, a shape the schedule cannot run, fewer layers than pieces,
  // partition_method profile without a profile_sample and a ZERO or DATA_PARALLEL config,
  // naming them. partition_method profile times each layer's forward + backward on `profile_sample`
  // (a micro-batch of the first stage's input) on every rank and balances the average.
  TorchPipeline(TorchAccelerator& accelerator, torch::nn::Sequential model,
                torch::optim::Optimizer& optimizer, pipeline::PipelineOptions options,
                const at::Tensor& profile_sample = {});
  // A model too big to build whole (DeepSpeed's LayerSpec): each rank builds only its stage's
  // layers (and, for partition_method parameters or profile, each layer once to count its
  // parameters or time it, one at a time), then its optimizer over them by `make_optimizer`. The
  // factories run in this constructor; a factory that wants the same layer on every rank seeds
  // itself.
  TorchPipeline(TorchAccelerator& accelerator, const std::vector<pipeline::LayerSpec>& layers,
                const pipeline::OptimizerFactory& make_optimizer, pipeline::PipelineOptions options,
                const at::Tensor& profile_sample = {});
  // The same with the config's pipeline keys (accel launch --pipeline_parallel_size 2 ...,
  // Accelerator::pipeline_options()).
  TorchPipeline(TorchAccelerator& accelerator, torch::nn::Sequential model,
                torch::optim::Optimizer& optimizer, const at::Tensor& profile_sample = {});
  ~TorchPipeline();
  TorchPipeline(const TorchPipeline&) = delete;
  TorchPipeline& operator=(const TorchPipeline&) = delete;

  // One training step on this replica's batch (rows a multiple of num_microbatches): the
  // schedule's forwards and backwards, the replicas' gradient average, the optimizer's step and
  // zero_grad. Returns the mean loss over the global batch, on every rank.
  // A step that throws (a layer raised, a peer died) posts its error as the job's first
  // failure, so every rank's error names the root cause; the pipeline is then spent: its
  // messages are abandoned (a peer may never answer them) and a further step is refused.
  double step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn);

  // Where the last step's time went on this rank (bench/pipeline_bench.cpp): its wall time
  // from step() to the returned loss, the time in compute actions, and that by action kind
  // (indexed by pipeline::ActionKind). Wall minus compute is this stage's bubble plus its
  // messages, the replicas' average and the optimizer's step.
  struct StepTiming {
    double wall_seconds = 0;
    double compute_seconds = 0;
    std::array<double, pipeline::kActionKinds> seconds_by_kind{};
  };
  const StepTiming& last_step_timing() const { return timing_; }

  // The last step's gradient 2-norm over every stage's parameters, before clipping (what
  // clip_grad_norm_ returns); computed only with max_grad_norm set, else 0.
  double last_grad_norm() const { return last_grad_norm_; }

  int stage() const { return stage_; }
  int num_stages() const { return options_.pipeline_parallel_size; }
  int data_parallel_rank() const { return replica_; }
  int data_parallel_size() const { return replicas_; }
  // Piece k holds the model's children [bounds[k], bounds[k + 1]); this stage holds pieces
  // chunk * P + stage.
  const pipeline::PieceBounds& piece_bounds() const { return bounds_; }
  // This stage's pieces, chunk by chunk (children shared with the model given).
  const std::vector<torch::nn::Sequential>& chunks() const { return chunks_; }
  const std::vector<pipeline::Action>& actions() const { return actions_; }
  // partition_method profile: each layer's measured forward + backward seconds (the ranks'
  // average) the split balanced; empty otherwise.
  const std::vector<double>& profiled_seconds() const { return profiled_seconds_; }

 private:
  struct Piece;  // one micro-batch on one chunk, while its backward is due
  // The checks and this rank's place; then take_layers (this stage's chunks and parameters)
  // and connect (the schedule, the channels, the replicas' group).
  TorchPipeline(TorchAccelerator& accelerator, pipeline::PipelineOptions options);
  void take_layers(const std::vector<std::string>& names,
                   const std::function<double(std::size_t)>& parameters_of,
                   const std::function<torch::nn::AnyModule(std::size_t)>& layer_at,
                   const at::Tensor& profile_sample);
  std::vector<double> profile_layers(
      const std::vector<std::string>& names,
      const std::function<torch::nn::AnyModule(std::size_t)>& layer_at, const at::Tensor& sample);
  void connect();
  double run_step(const at::Tensor& input, const at::Tensor& target, const LossFn& loss_fn);
  std::string who(int stage) const;  // "stage 1 (rank 3)"
  void run_messages(std::size_t begin, std::size_t end, std::vector<Piece>& pieces);
  void run_compute(const pipeline::Action& a, std::vector<Piece>& pieces, const at::Tensor& input,
                   const at::Tensor& target, const LossFn& loss_fn);
  void average_over_replicas();
  void clip_gradients();
  int virtual_stage(int chunk) const { return chunk * options_.pipeline_parallel_size + stage_; }
  bool is_first(int chunk) const { return virtual_stage(chunk) == 0; }
  bool is_last(int chunk) const;

  TorchAccelerator& accelerator_;
  pipeline::PipelineOptions options_;
  pipeline::PipelineShape shape_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  std::unique_ptr<torch::optim::Optimizer> owned_optimizer_;  // made by an OptimizerFactory
  int stage_ = 0, replica_ = 0, replicas_ = 1;
  pipeline::PieceBounds bounds_;
  std::vector<torch::nn::Sequential> chunks_;
  std::vector<at::Tensor> parameters_;  // this stage's, in chunk order
  std::vector<pipeline::Action> actions_;
  std::unique_ptr<pipeline::detail::StageChannels> channels_;
  std::unique_ptr<pipeline::detail::StageCheckpoint> checkpoint_;  // in the accelerator's saves
  CommunicatorPtr replica_group_;            // this stage's D replicas (D > 1)
  std::int64_t micro_rows_ = 0;              // this step's rows per micro-batch
  std::vector<at::Tensor> activation_like_;  // per chunk: this step's first received input
  std::vector<double> profiled_seconds_;
  StepTiming timing_;
  double last_grad_norm_ = 0;
  bool failed_ = false;
};

}  // namespace accel
