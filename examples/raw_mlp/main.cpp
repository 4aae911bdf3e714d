// A hand-written MLP (mlp.hpp: plain std::vector<float> buffers, no framework) trained on
// Fashion-MNIST through accelerate-cpp's raw API. The same binary runs as one process or
// distributed:
//
//   build/bin/raw_mlp --epochs 2
//   build/bin/accel launch --num_processes 2 build/bin/raw_mlp --epochs 2 --checkpoint_dir ck
//   build/bin/accel launch --use_zero --zero_stage 2 --num_processes 2 build/bin/raw_mlp
//   build/bin/accel launch --data_parallel --data_parallel_replicas 4 build/bin/raw_mlp
//
// With --checkpoint_dir it saves after every epoch (and every --save_every optimizer steps)
// and, when a checkpoint is there at start, continues from it, mid-epoch included.
// Progress is printed by the main process only: the loss per epoch and "test accuracy 0.xxxx".

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/idx_reader.hpp"
#include "examples/common/image_batches.hpp"
#include "examples/common/resume.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "examples/raw_mlp/unit_scopes.hpp"

namespace {

struct Flags {
  int epochs = 2;
  std::size_t batch_size = 64;  // per process
  float lr = 0.01f;
  float momentum = 0.9f;
  double clip = 5.0;  // max global gradient norm; 0 = no clipping
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint_dir;
  int hidden = 64;
  std::size_t train_samples = 0;  // 0 = all 60000
  std::size_t test_samples = 0;   // 0 = all 10000
  std::uint64_t seed = 42;
  std::uint64_t save_every = 0;  // optimizer steps between mid-epoch checkpoints; 0 = none
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "raw_mlp: %s\n"
               "usage: raw_mlp [--epochs N] [--batch_size N] [--lr X] [--momentum X] [--clip X]\n"
               "               [--data_dir DIR] [--checkpoint_dir DIR] [--save_every STEPS]\n"
               "               [--hidden N] [--train_samples N] [--test_samples N] [--seed N]\n",
               problem.c_str());
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  const auto values = examples::parse_flag_values(argc, argv, usage);
  Flags f;
  for (const auto& [key, value] : values) {
    try {
      if (key == "epochs")
        f.epochs = std::stoi(value);
      else if (key == "batch_size")
        f.batch_size = std::stoul(value);
      else if (key == "lr")
        f.lr = std::stof(value);
      else if (key == "momentum")
        f.momentum = std::stof(value);
      else if (key == "clip")
        f.clip = std::stod(value);
      else if (key == "data_dir")
        f.data_dir = value;
      else if (key == "checkpoint_dir")
        f.checkpoint_dir = value;
      else if (key == "hidden")
        f.hidden = std::stoi(value);
      else if (key == "train_samples")
        f.train_samples = std::stoul(value);
      else if (key == "test_samples")
        f.test_samples = std::stoul(value);
      else if (key == "seed")
        f.seed = std::stoull(value);
      else if (key == "save_every")
        f.save_every = std::stoull(value);
      else
        usage("unknown flag --" + key);
    } catch (const std::logic_error&) {
      usage("--" + key + ": bad value '" + value + "'");
    }
  }
  if (f.epochs < 0 || f.batch_size == 0 || f.hidden <= 0) usage("flags out of range");
  return f;
}

using examples::take_batch;
using Data = examples::FloatImages;

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  try {
    accel::Accelerator acc;
    acc.set_seed(flags.seed);
    const Data train = examples::to_floats(
        examples::load_mnist_split(flags.data_dir, "train", flags.train_samples));
    const Data test =
        examples::to_floats(examples::load_mnist_split(flags.data_dir, "t10k", flags.test_samples));
    acc.print(
        "raw_mlp: %zu training and %zu test images, %d processes x %d replica(s), %zu per batch "
        "each, MLP %zu-%d-10\n",
        train.count, test.count, acc.num_processes(), acc.data_parallel_replicas(),
        flags.batch_size, train.features, flags.hidden);

    raw_mlp::Mlp model({int(train.features), flags.hidden, 10}, acc.seed());
    // The built-in optimizer steps what the strategy hands it (every parameter under DDP, this
    // rank's slices under ZeRO, replica 0's under DataParallel), so this loop runs unchanged
    // under each; prepare() also puts its state into checkpoints, and under DATA_PARALLEL
    // copies the model into its replicas.
    accel::Sgd optimizer(accel::SgdOptions{.lr = flags.lr, .momentum = flags.momentum});
    acc.prepare(
        model, [](raw_mlp::Mlp& m) { return raw_mlp::param_refs(m); }, optimizer);

    // ZeRO-3: each layer a unit, gathered around its forward and backward (else nothing).
    raw_mlp::UnitScopes units(acc, model.layers().size());
    const bool checkpoints = !flags.checkpoint_dir.empty();
    examples::resume_if_saved(acc, flags.checkpoint_dir);

    accel::ShardedSampler sampler =
        acc.make_sampler(train.count, {flags.batch_size, true, 0, false});
    std::vector<float> x;
    std::vector<int> labels;
    for (std::uint64_t epoch = acc.resume_epoch(); epoch < std::uint64_t(flags.epochs); ++epoch) {
      const auto started = std::chrono::steady_clock::now();
      acc.set_epoch(epoch);
      sampler.set_epoch(epoch);
      const auto idx = sampler.indices();
      const std::size_t batches = sampler.num_batches();
      double loss_sum = 0;
      std::size_t loss_count = 0;
      for (std::size_t b = acc.batch_in_epoch(); b < batches; ++b) {  // mid-epoch after a resume
        const auto [begin, end] = sampler.batch_bounds(b);  // one process: a short last batch
        take_batch(train, idx, begin, end - begin, x, labels);
        acc.begin_batch(b, batches);
        // The batch's rows on `model`, or split between DataParallel's replicas.
        loss_sum +=
            examples::forward_backward_rows(acc, model, x, labels, train.features, units.scopes());
        ++loss_count;
        if (acc.sync_gradients()) {
          if (flags.clip > 0) acc.clip_grad_norm(flags.clip);
          acc.optimizer_step();
          model.zero_grad();
          if (checkpoints && flags.save_every > 0 && acc.step() % flags.save_every == 0 &&
              b + 1 < batches)
            acc.save_state(flags.checkpoint_dir);
        }
      }
      // The mean loss over every process's batches.
      float mean[2] = {float(loss_sum), float(loss_count)};
      acc.reduce(accel::buffer_of(std::span<float>(mean, 2)), accel::ReduceOp::sum);
      units.gather_all();  // predict() reads every layer
      const double accuracy = examples::test_accuracy(acc, model, test);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      acc.print("epoch %llu/%d: loss %.4f, test accuracy %.4f (%.1f s)\n",
                static_cast<unsigned long long>(epoch + 1), flags.epochs,
                mean[1] > 0 ? double(mean[0] / mean[1]) : 0.0, accuracy, seconds);
      if (checkpoints) acc.save_state(flags.checkpoint_dir);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "raw_mlp: %s\n", e.what());
    return 1;
  }
}
