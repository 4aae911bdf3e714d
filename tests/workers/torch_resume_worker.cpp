// One rank of the LibTorch resume checks (torch_accelerator_test runs it over real processes):
// a CNN with BatchNorm (buffers) and dropout (LibTorch's RNG), Adam (moments and step counts)
// under a StepLR scheduler, gradient accumulation 2, trained for --epochs with save_state at
// the end of every epoch when --checkpoint is given, and resumed from it when it is there.
// Nothing is registered by hand: the adapter saves model, optimizer, scheduler and RNG.
//   torch_resume_worker --epochs E [--checkpoint DIR] [--die_after_epoch K] [--out FILE]
//                       [--seed_per_rank]
// --die_after_epoch K: SIGKILL itself right after the save at the end of epoch K (1-based).
// --out FILE: rank 0 writes the final parameters and buffers, raw bytes, for comparison.
// --seed_per_rank: LibTorch's generator seeded differently per rank (dropout masks differ).
// With --checkpoint, rank 0 also checks at the end that the checkpoint's state.model (when
// there: state_dict_type FULL_STATE_DICT) loads into a fresh plain LibTorch model
// (torch::load) with exactly the prepared model's values.
//   torch_resume_worker --load_archive FILE --out OUT: no training; a plain model loads FILE
//   (an accel merge-weights output) and writes its values to OUT.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "config/config.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

torch::nn::Sequential make_net() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)), nn::BatchNorm2d(4),
                        nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(), nn::Dropout(0.3),
                        nn::Linear(4 * 4 * 4, 10));
}

std::string raw_values(torch::nn::Module& m) {
  std::string out;
  auto append = [&](const torch::Tensor& t) {
    const torch::Tensor c = t.detach().contiguous();
    out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  };
  for (const auto& p : m.parameters()) append(p);
  for (const auto& b : m.buffers()) append(b);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const accel::test::WorkerFlags flags(argc, argv);
  const int epochs = int(flags.integer("epochs", 2));
  const int die_after_epoch = int(flags.integer("die_after_epoch", 0));
  const std::string checkpoint = flags.text("checkpoint"), out = flags.text("out");
  const std::string load_archive = flags.text("load_archive");
  const bool seed_per_rank = flags.has("seed_per_rank");
  torch::set_num_threads(1);
  if (!load_archive.empty()) {
    auto plain = make_net();
    torch::load(plain, load_archive);
    std::ofstream(out, std::ios::binary | std::ios::trunc) << raw_values(*plain);
    return 0;
  }
  try {
    AcceleratorOptions options;
    options.gradient_accumulation_steps = 2;
    TorchAccelerator acc(options);
    acc.set_seed(5);
    torch::manual_seed(seed_per_rank ? 5 + std::uint64_t(acc.process_index()) : 5);

    auto net = make_net();
    torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(0.01));
    auto [model, opt] = acc.prepare(net, adam);
    torch::optim::StepLR step_lr(adam, /*step_size=*/3, /*gamma=*/0.5);
    auto& scheduler = acc.prepare_scheduler(step_lr);

    // 8 batches of 4 per rank per epoch, the last epoch batch ending an accumulation.
    torch::manual_seed(9);  // the data: the same on every rank, whatever the model's seed
    const std::int64_t n = 8 * 4 * acc.num_processes();
    const torch::Tensor x = torch::randn({n, 1, 8, 8});
    const torch::Tensor y = torch::randint(10, {n}, torch::kLong);
    torch::manual_seed(seed_per_rank ? 77 + std::uint64_t(acc.process_index()) : 77);
    auto loader = acc.prepare_data_loader(x, y, {.batch_size = 4, .seed = 3});

    if (!checkpoint.empty() && checkpoint_exists(checkpoint)) {
      acc.load_state(checkpoint);
      loader.set_epoch(acc.resume_epoch());
      loader.skip_first_batches(acc.resume_batch());
      acc.print("resumed at epoch %llu, step %llu, lr %g\n",
                static_cast<unsigned long long>(acc.resume_epoch() + 1),
                static_cast<unsigned long long>(acc.step()),
                adam.param_groups()[0].options().get_lr());
    }
    model->train();
    for (int epoch = int(acc.resume_epoch()); epoch < epochs; ++epoch) {
      for (auto& batch : *loader) {
        opt.zero_grad();
        acc.backward(
            torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        opt.step();
        scheduler.step();
      }
      if (!checkpoint.empty()) {
        acc.save_state(checkpoint);
        if (epoch + 1 == die_after_epoch) {
          ::kill(::getpid(), SIGKILL);
          ::_exit(99);  // not reached
        }
      }
    }
    acc.print("done: step %llu, lr %g\n", static_cast<unsigned long long>(acc.step()),
              adam.param_groups()[0].options().get_lr());

    if (acc.is_main_process() && !out.empty())
      std::ofstream(out, std::ios::binary | std::ios::trunc) << raw_values(*model);
    if (acc.is_main_process() && !checkpoint.empty() &&
        acc.state_dict_type() == accel::config::StateDictType::FULL_STATE_DICT) {
      auto plain = make_net();
      torch::load(plain, checkpoint + "/state.model");
      const bool same = raw_values(*plain) == raw_values(*model);
      accel::test::VerdictLog verdicts;
      verdicts.check(same, "state.model loads into a plain LibTorch model with the same values");
      if (!same) return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "torch_resume_worker rank %s: %s\n", rank ? rank : "0", e.what());
    return 1;
  }
}
