#include "accelerate/torch/pipeline/torch_pipeline.hpp"

#include <chrono>
#include <cmath>
#include <unordered_set>

#include "accelerate/pipeline/schedule_simulation.hpp"
#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "accelerate/torch/detail/tensor_collectives.hpp"
#include "accelerate/torch/pipeline/detail/stage_channels.hpp"
#include "accelerate/torch/pipeline/detail/stage_checkpoint.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "foundation/error.hpp"

namespace accel {

using pipeline::Action;
using pipeline::ActionKind;

// One micro-batch on one chunk between its forward and its backward.
struct TorchPipeline::Piece {
  at::Tensor input;        // what the forward read (requires grad after the first piece)
  at::Tensor output;       // its output; the last piece's: its loss / M
  at::Tensor output_grad;  // received for the backward (undefined on the last piece)
  at::Tensor loss;         // the last piece's micro-batch loss
};

namespace {

// The pieces' bounds over the layers: by split_points, else partition_method (`weights`
// gives the layers' weights: parameter counts, or measured times under profile).
pipeline::PieceBounds split_layers(const std::vector<std::string>& names,
                                   const std::function<std::vector<double>()>& weights,
                                   const pipeline::PipelineOptions& options, int pieces) {
  if (!options.split_points.empty()) return pipeline::split_at(names, options.split_points, pieces);
  if (options.partition_method == pipeline::PartitionMethod::uniform)
    return pipeline::uniform(names.size(), pieces);
  return pipeline::balance(weights(), pieces);
}

// Seconds of one forward + backward of `layer` on `input` (the best of a few, after one to
// warm up); returns the layer's output for the next layer. The gradients it leaves are reset.
double time_layer(torch::nn::AnyModule& layer, at::Tensor& input) {
  constexpr int kRuns = 3;
  double best = 0;
  at::Tensor output;
  for (int run = 0; run <= kRuns; ++run) {
    const at::Tensor x = input.detach().requires_grad_(input.is_floating_point());
    const auto start = std::chrono::steady_clock::now();
    output = layer.forward(x);
    if (output.requires_grad()) output.backward(torch::ones_like(output));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (run == 1 || (run > 1 && seconds < best)) best = seconds;
  }
  for (at::Tensor& p : layer.ptr()->parameters()) p.mutable_grad() = at::Tensor();
  input = output.detach();
  return best;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double parameter_count(const torch::nn::Module& layer) {
  double count = 0;
  for (const at::Tensor& p : layer.parameters()) count += double(p.numel());
  return count;
}

}  // namespace

TorchPipeline::TorchPipeline(TorchAccelerator& accelerator, pipeline::PipelineOptions options)
    : accelerator_(accelerator), options_(std::move(options)) {
  const StrategyOptions& strategy = accelerator.strategy_options();
  if (strategy.kind == StrategyKind::zero)
    throw InvalidArgument(
        "pipeline: distributed_type ZERO (zero_stage " + std::to_string(strategy.zero.stage) +
        ") with a pipeline is not built (DeepSpeed refuses ZeRO-2/3 with pipelines; ZeRO-1 is "
        "to come); use distributed_type MULTI_CPU");
  if (strategy.kind == StrategyKind::data_parallel)
    throw InvalidArgument(
        "pipeline: distributed_type DATA_PARALLEL runs one process; a pipeline's stages are "
        "processes (distributed_type MULTI_CPU)");
  const int p = options_.pipeline_parallel_size, world = accelerator.num_processes();
  shape_ = {
      .stages = p, .chunks = options_.pipeline_chunks, .microbatches = options_.num_microbatches};
  pipeline::check_shape(options_.pipeline_schedule, shape_);
  ACCEL_CHECK_ARG(world % p == 0, "pipeline: " + std::to_string(world) +
                                      " processes are not a multiple of "
                                      "pipeline_parallel_size " +
                                      std::to_string(p));
  stage_ = accelerator.process_index() % p;
  replica_ = accelerator.process_index() / p;
  replicas_ = world / p;
}

TorchPipeline::TorchPipeline(TorchAccelerator& accelerator, torch::nn::Sequential model,
                             torch::optim::Optimizer& optimizer, pipeline::PipelineOptions options,
                             const at::Tensor& profile_sample)
    : TorchPipeline(accelerator, std::move(options)) {
  std::vector<std::string> names;
  for (const auto& child : model->named_children()) names.push_back(child.key());
  const auto layer_at = [&](std::size_t i) { return *(model->begin() + std::ptrdiff_t(i)); };
  take_layers(
      names, [&](std::size_t i) { return parameter_count(*model->ptr(i)); }, layer_at,
      profile_sample);
  // The optimizer keeps only this stage's parameters.
  std::unordered_set<const void*> mine;
  for (const at::Tensor& t : parameters_) mine.insert(t.unsafeGetTensorImpl());
  for (auto& group : optimizer.param_groups())
    std::erase_if(group.params(),
                  [&](const at::Tensor& t) { return !mine.count(t.unsafeGetTensorImpl()); });
  optimizer_ = &optimizer;
  connect();
}

TorchPipeline::TorchPipeline(TorchAccelerator& accelerator,
                             const std::vector<pipeline::LayerSpec>& layers,
                             const pipeline::OptimizerFactory& make_optimizer,
                             pipeline::PipelineOptions options, const at::Tensor& profile_sample)
    : TorchPipeline(accelerator, std::move(options)) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < layers.size(); ++i)
    names.push_back(layers[i].name.empty() ? std::to_string(i) : layers[i].name);
  const auto build = [&](std::size_t i) {
    torch::nn::AnyModule layer = layers[i].build();
    ACCEL_CHECK_ARG(!layer.is_empty(), "pipeline: LayerSpec " + names[i] + " built no module");
    return layer;
  };
  // Counting a layer's parameters builds it (and drops it): one layer at a time, as
  // DeepSpeed's LayerSpec partitioning does.
  take_layers(
      names, [&](std::size_t i) { return parameter_count(*build(i).ptr()); }, build,
      profile_sample);
  owned_optimizer_ = make_optimizer(parameters_);
  ACCEL_CHECK_ARG(owned_optimizer_ != nullptr, "pipeline: the optimizer factory returned none");
  optimizer_ = owned_optimizer_.get();
  connect();
}

void TorchPipeline::take_layers(const std::vector<std::string>& names,
                                const std::function<double(std::size_t)>& parameters_of,
                                const std::function<torch::nn::AnyModule(std::size_t)>& layer_at,
                                const at::Tensor& profile_sample) {
  const auto weights = [&] {
    std::vector<double> out;
    if (options_.partition_method == pipeline::PartitionMethod::parameters) {
      for (std::size_t i = 0; i < names.size(); ++i) out.push_back(parameters_of(i));
      return out;
    }
    out = profile_layers(names, layer_at, profile_sample);
    return out;
  };
  bounds_ = split_layers(names, weights, options_, shape_.virtual_stages());
  for (int c = 0; c < shape_.chunks; ++c) {
    torch::nn::Sequential chunk;
    const auto v = std::size_t(virtual_stage(c));
    for (std::size_t i = bounds_[v]; i < bounds_[v + 1]; ++i)
      chunk->push_back(names[i], layer_at(i));
    for (const at::Tensor& t : chunk->parameters()) parameters_.push_back(t);
    chunks_.push_back(chunk);
  }
}

std::vector<double> TorchPipeline::profile_layers(
    const std::vector<std::string>& names,
    const std::function<torch::nn::AnyModule(std::size_t)>& layer_at, const at::Tensor& sample) {
  ACCEL_CHECK_ARG(sample.defined(),
                  "pipeline: partition_method profile times each layer on a micro-batch: pass "
                  "one (the first stage's input, of a micro-batch's rows) as profile_sample");
  // Every rank times every layer in turn (each LayerSpec built, timed and dropped), and the
  // ranks' times are averaged, then rank 0's average is what every rank splits by: the
  // split must be the same everywhere.
  std::vector<double> seconds(names.size());
  at::Tensor x = sample;
  for (std::size_t i = 0; i < names.size(); ++i) {
    torch::nn::AnyModule layer = layer_at(i);
    seconds[i] = time_layer(layer, x);
  }
  Communicator& world = accelerator_.comm();
  world.all_reduce(buffer_of(std::span(seconds)), ReduceOp::avg)->wait();
  world.broadcast(buffer_of(std::span(seconds)), 0)->wait();
  profiled_seconds_ = seconds;
  return seconds;
}

void TorchPipeline::connect() {
  // A schedule this runtime cannot finish is refused before anything runs.
  const pipeline::SimulationResult check =
      pipeline::simulate(pipeline::schedule_all(options_.pipeline_schedule, shape_), shape_, {},
                         pipeline::MessageModel::eager);
  ACCEL_CHECK_ARG(check.ok(), "pipeline: the schedule " +
                                  pipeline::to_string(options_.pipeline_schedule) +
                                  " cannot run: " + check.deadlock);
  actions_ = pipeline::schedule_for_stage(options_.pipeline_schedule, shape_, stage_);

  const int p = options_.pipeline_parallel_size;
  if (p > 1)
    channels_ = std::make_unique<pipeline::detail::StageChannels>(accelerator_, shape_, replicas_,
                                                                  replica_, stage_);
  if (replicas_ > 1) {
    std::vector<int> ranks;
    for (int d = 0; d < replicas_; ++d) ranks.push_back(d * p + stage_);
    replica_group_ =
        accelerator_.new_group(ranks, "pipeline_stage" + std::to_string(stage_) + "_replicas");
    // Every replica starts from replica 0's parameters, as DDP's prepare does.
    torch::NoGradGuard no_grad;
    for (at::Tensor& t : parameters_) {
      at::Tensor data = t.detach();
      tensor_collectives::broadcast(*replica_group_, data, 0);
    }
  }
  std::vector<pipeline::detail::StagePiece> pieces;
  for (int c = 0; c < shape_.chunks; ++c)
    pieces.push_back({virtual_stage(c), chunks_[std::size_t(c)]});
  checkpoint_ = std::make_unique<pipeline::detail::StageCheckpoint>(
      accelerator_.comm(), std::move(pieces), p, stage_, replica_, *optimizer_);
  accelerator_.register_checkpoint_part("pipeline", checkpoint_->part());
}

TorchPipeline::TorchPipeline(TorchAccelerator& accelerator, torch::nn::Sequential model,
                             torch::optim::Optimizer& optimizer, const at::Tensor& profile_sample)
    : TorchPipeline(accelerator, std::move(model), optimizer, accelerator.pipeline_options(),
                    profile_sample) {}

TorchPipeline::~TorchPipeline() {
  if (checkpoint_) accelerator_.unregister_checkpoint_part("pipeline");
  if (!failed_) return;
  // Abandoned, not destroyed: a message still pending may wait for a peer that will never
  // answer, and destroying its communicator would wait for it (up to the timeout). The
  // process is on its way out; its exit closes the sockets.
  (void)channels_.release();
  if (replica_group_) (void)new CommunicatorPtr(std::move(replica_group_));
}

std::string TorchPipeline::who(int stage) const {
  return "stage " + std::to_string(stage) + " (rank " +
         std::to_string(replica_ * options_.pipeline_parallel_size + stage) + ")";
}

bool TorchPipeline::is_last(int chunk) const {
  return virtual_stage(chunk) == shape_.virtual_stages() - 1;
}

double TorchPipeline::step(const at::Tensor& input, const at::Tensor& target,
                           const LossFn& loss_fn) {
  if (failed_)
    throw Error("pipeline " + who(stage_) +
                ": an earlier step failed; the pipeline cannot go on (restart the job, or resume "
                "from a checkpoint)");
  try {
    const double loss = run_step(input, target, loss_fn);
    accelerator_.count_optimizer_step();
    return loss;
  } catch (const std::exception& e) {
    failed_ = true;
    const std::string self = "pipeline " + who(stage_);
    std::string what = e.what();
    if (what.rfind(self + ": ", 0) == 0) what.erase(0, self.size() + 2);
    accelerator_.post_failure(self + ", step " + std::to_string(accelerator_.step()) + ": " + what);
    throw;
  }
}

double TorchPipeline::run_step(const at::Tensor& input, const at::Tensor& target,
                               const LossFn& loss_fn) {
  const auto step_start = std::chrono::steady_clock::now();
  timing_ = {};
  const int m = shape_.microbatches;
  const at::Tensor& rows_of = is_first(0) ? input : target;
  const bool reads_batch = is_first(0) || is_last(shape_.chunks - 1);
  if (reads_batch) {
    ACCEL_CHECK_ARG(rows_of.dim() >= 1 && rows_of.size(0) % m == 0,
                    "pipeline step: the batch's " +
                        std::to_string(rows_of.dim() >= 1 ? rows_of.size(0) : 0) +
                        " rows do not split into num_microbatches " + std::to_string(m));
    micro_rows_ = rows_of.size(0) / m;
  }
  if (is_last(shape_.chunks - 1))
    ACCEL_CHECK_ARG(target.size(0) == micro_rows_ * m,
                    "pipeline step: the target's " + std::to_string(target.size(0)) +
                        " rows are not the input's " + std::to_string(micro_rows_ * m));
  std::vector<Piece> pieces(std::size_t(m * shape_.chunks));
  activation_like_.assign(std::size_t(shape_.chunks), at::Tensor());
  for (std::size_t i = 0; i < actions_.size();) {
    if (!pipeline::is_communication(actions_[i].kind)) {
      const auto start = std::chrono::steady_clock::now();
      run_compute(actions_[i], pieces, input, target, loss_fn);
      const double seconds = seconds_since(start);
      timing_.compute_seconds += seconds;
      timing_.seconds_by_kind[std::size_t(actions_[i].kind)] += seconds;
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < actions_.size() && pipeline::is_communication(actions_[end].kind)) ++end;
    run_messages(i, end, pieces);
    i = end;
  }
  if (channels_) channels_->wait_sends();
  average_over_replicas();
  if (options_.max_grad_norm > 0) clip_gradients();
  optimizer_->step();
  optimizer_->zero_grad();

  // The mean loss: the last stage's micro-batch mean, averaged over the replicas, everywhere.
  double loss = 0;
  if (is_last(shape_.chunks - 1))
    for (int mb = 0; mb < m; ++mb)
      loss += pieces[std::size_t((shape_.chunks - 1) * m + mb)].loss.item<double>();
  loss /= double(m) * double(replicas_);
  accelerator_.comm().all_reduce(buffer_of(std::span(&loss, 1)), ReduceOp::sum)->wait();
  timing_.wall_seconds = seconds_since(step_start);
  return loss;
}

void TorchPipeline::run_messages(std::size_t begin, std::size_t end, std::vector<Piece>& pieces) {
  const int m = shape_.microbatches;
  // Sends first: they go out on their own channels and never wait for this group's receives.
  for (std::size_t i = begin; i < end; ++i) {
    const Action& a = actions_[i];
    Piece& piece = pieces[std::size_t(a.chunk * m + a.microbatch)];
    if (a.kind == ActionKind::send_activation)
      channels_->send(a, piece.output, /*with_header=*/a.microbatch == 0);
    else if (a.kind == ActionKind::send_gradient)
      channels_->send(a, piece.input.grad(), false);
  }
  for (std::size_t i = begin; i < end; ++i) {
    const Action& a = actions_[i];
    Piece& piece = pieces[std::size_t(a.chunk * m + a.microbatch)];
    if (a.kind == ActionKind::recv_activation) {
      // The step's first micro-batch brings the shape; the later ones are received like it.
      at::Tensor& like = activation_like_[std::size_t(a.chunk)];
      piece.input = channels_->receive(a, /*with_header=*/a.microbatch == 0, like);
      if (a.microbatch == 0) like = piece.input;
    } else if (a.kind == ActionKind::recv_gradient)
      piece.output_grad = channels_->receive(a, false, piece.output);
  }
  channels_->wait_receives();
}

void TorchPipeline::run_compute(const Action& a, std::vector<Piece>& pieces,
                                const at::Tensor& input, const at::Tensor& target,
                                const LossFn& loss_fn) {
  const int m = shape_.microbatches;
  Piece& piece = pieces[std::size_t(a.chunk * m + a.microbatch)];
  torch::nn::Sequential& chunk = chunks_[std::size_t(a.chunk)];
  const std::int64_t first_row = std::int64_t(a.microbatch) * micro_rows_;
  switch (a.kind) {
    case ActionKind::forward: {
      if (is_first(a.chunk))
        piece.input = input.narrow(0, first_row, micro_rows_);
      else
        piece.input.requires_grad_(true);
      if (is_last(a.chunk) && !is_first(a.chunk) && piece.input.size(0) != micro_rows_) {
        const int from = (virtual_stage(a.chunk) - 1) % options_.pipeline_parallel_size;
        throw InvalidArgument(
            "pipeline " + who(stage_) + ": the activation from " + who(from) + " has " +
            std::to_string(piece.input.size(0)) + " rows per micro-batch, this stage's target " +
            std::to_string(micro_rows_) + " (every rank of a replica passes the same batch)");
      }
      at::Tensor out = chunk->forward(piece.input);
      if (is_last(a.chunk)) {
        piece.loss = loss_fn(out, target.narrow(0, first_row, micro_rows_));
        out = piece.loss / double(m);
      }
      piece.output = out;
      return;
    }
    case ActionKind::backward:
      // (A first piece without parameters has nothing to differentiate.)
      if (piece.output.requires_grad()) {
        if (is_last(a.chunk))
          piece.output.backward();
        else
          piece.output.backward(piece.output_grad);
      }
      if (is_first(a.chunk)) piece.input = at::Tensor();  // the batch's rows: nothing to send
      piece.output = piece.output_grad = at::Tensor();
      return;
    case ActionKind::backward_input: {
      // The input's gradient alone, the graph kept for the weights' (ZERO_BUBBLE).
      if (is_first(a.chunk)) return;
      const std::vector<at::Tensor> grads = torch::autograd::grad(
          {piece.output}, {piece.input}, {is_last(a.chunk) ? at::Tensor() : piece.output_grad},
          /*retain_graph=*/true);
      piece.input.mutable_grad() = grads[0];
      return;
    }
    case ActionKind::backward_weight: {
      std::vector<at::Tensor> params = chunk->parameters();
      if (!params.empty() && piece.output.requires_grad())
        torch::autograd::backward({piece.output},
                                  {is_last(a.chunk) ? at::Tensor() : piece.output_grad},
                                  /*retain_graph=*/false, /*create_graph=*/false, params);
      piece.input = piece.output = piece.output_grad = at::Tensor();
      return;
    }
    default:
      return;
  }
}

void TorchPipeline::clip_gradients() {
  // This stage's sum of squares (in double, as clip_grad_norm_ sums), over the world: every
  // replica holds the same averaged gradients, so the world's sum is D times the pipeline's.
  double squares = 0;
  for (const at::Tensor& p : parameters_)
    if (p.grad().defined()) squares += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  accelerator_.comm().all_reduce(buffer_of(std::span(&squares, 1)), ReduceOp::sum)->wait();
  last_grad_norm_ = std::sqrt(squares / double(replicas_));
  const double coefficient = options_.max_grad_norm / (last_grad_norm_ + 1e-6);
  if (coefficient >= 1) return;
  torch::NoGradGuard no_grad;
  for (at::Tensor& p : parameters_)
    if (p.grad().defined()) p.grad().mul_(coefficient);
}

void TorchPipeline::average_over_replicas() {
  if (!replica_group_) return;
  std::vector<at::Tensor> grads;
  for (at::Tensor& p : parameters_) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad().reshape({-1}));
  }
  if (grads.empty()) return;
  at::Tensor flat = torch::cat(grads);
  replica_group_->all_reduce(tensor_buffer(flat, "pipeline gradients"), ReduceOp::avg)->wait();
  std::int64_t offset = 0;
  torch::NoGradGuard no_grad;
  for (at::Tensor& p : parameters_) {
    const std::int64_t n = p.numel();
    p.grad().copy_(flat.narrow(0, offset, n).view_as(p));
    offset += n;
  }
}

}  // namespace accel
