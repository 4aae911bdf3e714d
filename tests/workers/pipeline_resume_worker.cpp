// One rank of pipeline_checkpoint_test: an fp32 MLP with a BatchNorm (in eval mode: its running
// statistics are buffers the checkpoint must carry) trained by SGD with momentum in two param
// groups, on a fixed global batch of 12 rows per step, either pipelined (--stages P: P stages x
// world / P replicas, --microbatches M) or prepared without a pipeline (--stages 0; the strategy
// and state_dict_type from the environment). Any of them computes the same steps.
//   pipeline_resume_worker --stages P --microbatches M --steps T
//                          [--checkpoint DIR --save_at K[,K2]] [--resume DIR]
//                          [--dump FILE] [--dump_at_save FILE] [--wider]
//                          [--kill_rank R --kill_save N --kill_point STAGE]
// --save_at: acc.save_state(DIR) after those steps. --resume: acc.load_state(DIR) first
// (prints "loaded step S"), then train from that step to T. --dump / --dump_at_save: rank 0
// writes every parameter as doubles in model order (gathered from the stages), at the end / at
// the first save. A fresh run (no --resume) sets the BatchNorm's running mean to non-zero
// values, so a load that left the buffers behind trains differently. --wider: the first
// layer has 20 outputs (a model the checkpoint does not fit). --kill_*: rank R SIGKILLs itself
// at the save's step STAGE (checkpoint_testing's names, e.g. fs:write) of its N-th save.
// Exit 0 on success, 1 on an error.

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/torch/pipeline/torch_pipeline.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "backends/comm/host_collectives.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr std::int64_t kIn = 10, kOut = 5, kGlobalBatch = 12;

torch::nn::Sequential make_net(bool wider) {
  namespace nn = torch::nn;
  const std::int64_t hidden = wider ? 20 : 16;
  torch::manual_seed(5);
  nn::Sequential net(nn::Linear(kIn, hidden), nn::BatchNorm1d(hidden), nn::Tanh(),
                     nn::Linear(hidden, 12), nn::Tanh(), nn::Linear(12, kOut));
  net[1]->eval();  // an affine map by its running statistics, which stay as they are
  return net;
}

std::unique_ptr<torch::optim::SGD> make_sgd(const std::vector<torch::Tensor>& weights,
                                            const std::vector<torch::Tensor>& biases) {
  using namespace torch::optim;
  return std::make_unique<SGD>(
      std::vector<OptimizerParamGroup>{
          {weights,
           std::make_unique<SGDOptions>(SGDOptions(0.05).momentum(0.9).weight_decay(0.01))},
          {biases, std::make_unique<SGDOptions>(SGDOptions(0.1).momentum(0.5))}},
      SGDOptions(0.05));
}

std::vector<double> as_doubles(const std::vector<torch::Tensor>& params) {
  std::vector<double> values;
  for (const auto& p : params) {
    const torch::Tensor d = p.detach().to(torch::kDouble).contiguous().flatten();
    values.insert(values.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
  }
  return values;
}

// Rank 0 writes the whole model's parameters: its own, or (pipelined) replica 0's stages' in
// stage order (one chunk per stage: stage order is model order).
void dump(TorchAccelerator& acc, const std::vector<torch::Tensor>& mine, bool contributes,
          int stages, const std::string& file) {
  std::vector<double> values = as_doubles(mine);
  if (stages > 0) {
    std::string bytes;
    if (contributes)
      bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
    const std::vector<std::string> all = all_gather_strings(acc.comm(), bytes);
    values.clear();
    for (int s = 0; s < stages; ++s) {
      const std::string& b = all[std::size_t(s)];
      const auto* d = reinterpret_cast<const double*>(b.data());
      values.insert(values.end(), d, d + b.size() / sizeof(double));
    }
  }
  if (!acc.is_main_process()) return;
  std::ofstream(file, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(values.data()),
             std::streamsize(values.size() * sizeof(double)));
}

int save_index = 0;  // the saves so far, for --kill_save

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  try {
    const test::WorkerFlags flags(argc, argv);
    flags.only({"stages", "microbatches", "steps", "checkpoint", "save_at", "resume", "dump",
                "dump_at_save", "wider", "kill_rank", "kill_save", "kill_point"});
    const int stages = int(flags.integer("stages", 2));
    const int steps = int(flags.integer("steps", 8));
    const std::string checkpoint = flags.text("checkpoint"), resume = flags.text("resume");
    std::vector<int> save_at;
    std::stringstream list(flags.text("save_at"));
    for (std::string item; std::getline(list, item, ',');) save_at.push_back(std::stoi(item));

    TorchAccelerator acc;
    acc.set_seed(5);
    const int kill_rank = int(flags.integer("kill_rank", -1));
    const int kill_save = int(flags.integer("kill_save", 0));
    const std::string kill_point = flags.text("kill_point");
    if (acc.process_index() == kill_rank)
      checkpoint_testing::set_stage_hook([&](std::string_view stage) {
        if (save_index == kill_save && stage == kill_point) std::raise(SIGKILL);
      });

    torch::nn::Sequential net = make_net(flags.has("wider"));
    if (resume.empty()) {  // values a load must bring back (the default zeros would not show)
      torch::NoGradGuard no_grad;
      auto& mean = net[1]->as<torch::nn::BatchNorm1d>()->running_mean;
      mean.copy_(torch::linspace(-0.5, 0.5, mean.numel()));
    }
    std::vector<torch::Tensor> weights, biases;
    for (const auto& p : net->named_parameters())
      (p.key().find("bias") != std::string::npos ? biases : weights).push_back(p.value());
    std::unique_ptr<torch::optim::SGD> sgd = make_sgd(weights, biases);

    torch::manual_seed(9);  // the data: the same in every run
    const torch::Tensor x = torch::randn({steps * kGlobalBatch, kIn});
    const torch::Tensor y = torch::randn({steps * kGlobalBatch, kOut});

    std::unique_ptr<TorchPipeline> pipe;
    std::optional<PreparedModel<torch::nn::Sequential>> model;
    AcceleratedOptimizer* opt = nullptr;
    if (stages > 0) {
      pipeline::PipelineOptions options;
      options.pipeline_parallel_size = stages;
      options.num_microbatches = int(flags.integer("microbatches", 3));
      pipe = std::make_unique<TorchPipeline>(acc, net, *sgd, options);
    } else {
      auto [m, o] = acc.prepare(net, *sgd);
      model.emplace(m);
      opt = &o;
    }
    const int replicas = pipe ? pipe->data_parallel_size() : acc.num_processes();
    const int replica = pipe ? pipe->data_parallel_rank() : acc.process_index();
    const std::int64_t local = kGlobalBatch / replicas;
    std::vector<torch::Tensor> mine;  // what this rank holds
    if (pipe)
      for (const auto& chunk : pipe->chunks())
        for (const auto& p : chunk->parameters()) mine.push_back(p);
    else
      mine = net->parameters();
    const bool contributes = !pipe || pipe->data_parallel_rank() == 0;

    if (!resume.empty()) {
      acc.load_state(resume);
      if (acc.is_main_process()) std::printf("loaded step %llu\n", (unsigned long long)acc.step());
    }
    const auto loss_fn = [](const at::Tensor& out, const at::Tensor& t) {
      return torch::mse_loss(out, t);
    };
    bool dumped_at_save = false;
    for (auto step = int(acc.step()); step < steps; ++step) {
      const std::int64_t first = step * kGlobalBatch + replica * local;
      const at::Tensor xs = x.narrow(0, first, local), ys = y.narrow(0, first, local);
      if (pipe) {
        pipe->step(xs, ys, loss_fn);
      } else {
        opt->zero_grad();
        acc.backward(loss_fn((*model)->forward(xs), ys));
        opt->step();
      }
      if (std::find(save_at.begin(), save_at.end(), step + 1) != save_at.end()) {
        ++save_index;
        acc.save_state(checkpoint);
        if (!dumped_at_save && flags.has("dump_at_save"))
          dump(acc, mine, contributes, pipe ? pipe->num_stages() : 0, flags.text("dump_at_save"));
        dumped_at_save = true;
      }
    }
    if (flags.has("dump"))
      dump(acc, mine, contributes, pipe ? pipe->num_stages() : 0, flags.text("dump"));
    return 0;
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "pipeline_resume_worker rank %s: %s\n", rank ? rank : "0", e.what());
    return 1;
  }
}
