// One rank of the LibTorch resharding checks (torch_accelerator_test runs it over real
// processes): an MLP whose weights and biases are two param groups (their own learning rate
// and weight decay; under Adam amsgrad on the weights only, so the groups keep different
// numbers of state arrays) with a StepLR scheduler, trained on a fixed global batch per step
// that the ranks split evenly, so any number of processes and any strategy computes the same
// steps. The strategy comes from the environment (ACCEL_DISTRIBUTED_TYPE, ACCEL_ZERO_STAGE).
//   torch_reshard_worker --optimizer adam|adamw|sgd --steps T [--checkpoint DIR --save_at K]
//                        [--resume DIR] [--dump FILE] [--predict FILE]
// --save_at K: save_state(DIR) after optimizer step K; the run goes on to step T.
// --resume DIR: load_state(DIR) first, then train from its step to T.
// --dump FILE: rank 0 writes the final parameters as doubles (module order).
// --predict FILE: at the save, rank 0 writes a fixed input and the model's outputs on it
//   (floats), for a plain LibTorch model loaded from the checkpoint to reproduce.
// After a save and after a load every rank prints "optimizer state: sum of squares S, step N,
// lr L": S sums the squares of every element of every optimizer state tensor over the job
// (this rank's slices under ZeRO, summed over ranks), N is Adam's step count (0 for SGD), so
// the test sees the state arrive whatever the layout it was saved in.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr std::int64_t kIn = 10, kOut = 5, kGlobalBatch = 12;  // 12: split by 1, 2, 3 or 4

torch::nn::Sequential make_net() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Linear(kIn, 16), nn::Tanh(), nn::Linear(16, 12), nn::Tanh(),
                        nn::Linear(12, kOut));
}

struct StateSummary {
  double sum_squares = 0;
  std::int64_t step = 0;
};

template <typename AdamState>
bool add_adam(const torch::optim::OptimizerParamState& s, StateSummary& out) {
  const auto* a = dynamic_cast<const AdamState*>(&s);
  if (!a) return false;
  for (const torch::Tensor& t : {a->exp_avg(), a->exp_avg_sq(), a->max_exp_avg_sq()})
    if (t.defined()) out.sum_squares += t.to(torch::kDouble).pow(2).sum().item<double>();
  out.step = a->step();
  return true;
}

// Over what this rank's optimizer holds; the caller sums over ranks under ZeRO.
StateSummary summarize(const torch::optim::Optimizer& optimizer) {
  StateSummary out;
  for (const auto& [key, state] : optimizer.state()) {
    if (add_adam<torch::optim::AdamParamState>(*state, out) ||
        add_adam<torch::optim::AdamWParamState>(*state, out))
      continue;
    const auto& sgd = dynamic_cast<const torch::optim::SGDParamState&>(*state);
    if (sgd.momentum_buffer().defined())
      out.sum_squares += sgd.momentum_buffer().to(torch::kDouble).pow(2).sum().item<double>();
  }
  return out;
}

void print_state(TorchAccelerator& acc, const torch::optim::Optimizer& optimizer) {
  StateSummary s = summarize(optimizer);
  if (acc.strategy().gradients_sharded())  // each rank holds its slices' state only
    s.sum_squares =
        acc.reduce(torch::tensor(s.sum_squares, torch::kDouble), ReduceOp::sum).item<double>();
  std::printf("optimizer state: sum of squares %.17g, step %lld, lr %.17g\n", s.sum_squares,
              static_cast<long long>(s.step), optimizer.param_groups()[0].options().get_lr());
  std::fflush(stdout);
}

void write_predictions(torch::nn::Sequential& model, const std::string& file) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(123);
  const torch::Tensor x = torch::randn({7, kIn});
  const torch::Tensor y = model->forward(x).contiguous();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(x.data_ptr()), std::streamsize(x.nbytes()));
  out.write(static_cast<const char*>(y.data_ptr()), std::streamsize(y.nbytes()));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        torch::nn::Sequential& net) {
  std::vector<torch::Tensor> weights, biases;
  for (const auto& p : net->named_parameters())
    (p.key().find("bias") != std::string::npos ? biases : weights).push_back(p.value());
  using namespace torch::optim;
  if (name == "sgd")
    return std::make_unique<SGD>(
        std::vector<OptimizerParamGroup>{
            {weights,
             std::make_unique<SGDOptions>(SGDOptions(0.05).momentum(0.9).weight_decay(0.01))},
            {biases, std::make_unique<SGDOptions>(SGDOptions(0.1).momentum(0.5))}},
        SGDOptions(0.05));
  if (name == "adam")
    return std::make_unique<Adam>(
        std::vector<OptimizerParamGroup>{
            {weights,
             std::make_unique<AdamOptions>(AdamOptions(0.01).weight_decay(0.01).amsgrad(true))},
            {biases, std::make_unique<AdamOptions>(AdamOptions(0.02))}},
        AdamOptions(0.01));
  if (name == "adamw")
    return std::make_unique<AdamW>(
        std::vector<OptimizerParamGroup>{
            {weights, std::make_unique<AdamWOptions>(AdamWOptions(0.01).weight_decay(0.05))},
            {biases, std::make_unique<AdamWOptions>(AdamWOptions(0.02).weight_decay(0))}},
        AdamWOptions(0.01));
  throw std::invalid_argument("--optimizer must be adam, adamw or sgd, not '" + name + "'");
}

}  // namespace

int main(int argc, char** argv) {
  std::string optimizer_name = "adam", checkpoint, resume, dump, predict;
  std::int64_t steps = 8, save_at = -1;
  const accel::test::WorkerFlags flags(argc, argv);
  flags.only({"optimizer", "steps", "checkpoint", "save_at", "resume", "dump", "predict"});
  optimizer_name = flags.text("optimizer", optimizer_name);
  steps = flags.integer("steps", steps);
  checkpoint = flags.text("checkpoint");
  save_at = flags.integer("save_at", save_at);
  resume = flags.text("resume");
  dump = flags.text("dump");
  predict = flags.text("predict");
  torch::set_num_threads(1);
  try {
    TorchAccelerator acc;
    acc.set_seed(5);
    torch::manual_seed(5);
    auto net = make_net();
    auto optimizer = make_optimizer(optimizer_name, net);
    auto [model, opt] = acc.prepare(net, *optimizer);
    torch::optim::StepLR step_lr(*optimizer, /*step_size=*/3, /*gamma=*/0.5);
    auto& scheduler = acc.prepare_scheduler(step_lr);

    torch::manual_seed(9);  // the data: the same in every run
    const torch::Tensor x = torch::randn({steps * kGlobalBatch, kIn});
    const torch::Tensor y = torch::randn({steps * kGlobalBatch, kOut});
    const std::int64_t local = kGlobalBatch / acc.num_processes();

    if (!resume.empty()) {
      acc.load_state(resume);
      print_state(acc, *optimizer);
    }
    for (auto step = std::int64_t(acc.step()); step < steps; ++step) {
      const std::int64_t first = step * kGlobalBatch + acc.process_index() * local;
      opt.zero_grad();
      acc.backward(
          torch::mse_loss(model->forward(x.narrow(0, first, local)), y.narrow(0, first, local)));
      opt.step();
      scheduler.step();
      if (step + 1 == save_at) {
        acc.save_state(checkpoint);
        print_state(acc, *optimizer);
        if (acc.is_main_process() && !predict.empty()) write_predictions(model, predict);
      }
    }
    if (acc.is_main_process() && !dump.empty()) {
      std::vector<double> values;
      for (const auto& p : model->parameters()) {
        const torch::Tensor d = p.detach().to(torch::kDouble).contiguous().flatten();
        values.insert(values.end(), d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
      }
      std::ofstream(dump, std::ios::binary | std::ios::trunc)
          .write(reinterpret_cast<const char*>(values.data()),
                 std::streamsize(values.size() * sizeof(double)));
    }
    return 0;
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "torch_reshard_worker rank %s: %s\n", rank ? rank : "0", e.what());
    return 1;
  }
}
