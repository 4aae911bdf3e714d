// The main job: a LibTorch CNN trained on Fashion-MNIST with accelerate-cpp. A plain LibTorch
// loop (plain.cpp) with a handful of changed lines; the same binary runs as one process or
// distributed, whatever `accel launch` and the config chose:
//
//   build/bin/accel launch --num_processes 2 build/bin/fashion_mnist
//   build/bin/accel launch build/bin/fashion_mnist --epochs 2 --checkpoint_dir ck
//   build/bin/accel launch --data_parallel --data_parallel_replicas 2 build/bin/fashion_mnist
//
// Progress on the main process only, per epoch: "epoch 1: loss 0.4123, test accuracy 0.8765,
// 12.3 s". With --checkpoint_dir it saves after every epoch and, when a checkpoint is there
// at start, continues from it. With trackers (`accel launch --log_with tensorboard,csv
// --project_dir DIR ...`) it logs the loss, learning rate and step time of every step and the
// test accuracy of every epoch under DIR/fashion_mnist.

#include <chrono>
#include <cstdio>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "examples/common/resume.hpp"
#include "examples/fashion_mnist/fashion_mnist.hpp"

using namespace fashion_mnist;
namespace F = torch::nn::functional;

namespace fashion_mnist {
// The prepared optimizer's learning rate is that of the LibTorch optimizer it wraps.
void set_lr(accel::AcceleratedOptimizer& optimizer, double lr) {
  set_lr(optimizer.optimizer(), lr);
}
}  // namespace fashion_mnist

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv, "fashion_mnist", /*with_checkpoints=*/true);
  use_omp_num_threads();
  try {
    accel::TorchAccelerator acc;
    acc.set_seed(flags.seed);  // LibTorch's generators too, the same on every rank: dropout
    const Split train = load_split(flags.data_dir, "train", flags.train_samples);
    const Split test = load_split(flags.data_dir, "t10k", flags.test_samples);
    acc.print(
        "fashion_mnist: %lld training and %lld test images; %d process(es) x %zu per batch, "
        "%d thread(s) each; SGD lr %g momentum %g\n",
        static_cast<long long>(train.images.size(0)), static_cast<long long>(test.images.size(0)),
        acc.num_processes(), flags.batch_size, torch::get_num_threads(), flags.lr, flags.momentum);

    Net net;
    torch::optim::SGD sgd(net->parameters(),
                          torch::optim::SGDOptions(flags.lr).momentum(flags.momentum));
    // The same module (model->train() ...), and calling it, model(x), is the forward the
    // strategy may split (DATA_PARALLEL: over replicas on threads); sgd, wrapped.
    auto [model, optimizer] = acc.prepare(net, sgd);
    auto loader = acc.prepare_data_loader(train.images, train.labels,
                                          {.batch_size = flags.batch_size, .seed = flags.seed});
    auto test_loader =
        acc.prepare_data_loader(test.images, test.labels, {.batch_size = 500, .shuffle = false});

    // Checkpoints: save_state keeps the model, the optimizer's momentum, LibTorch's RNG
    // (dropout), the counters and the loop's position; load_state restores them.
    if (examples::resume_if_saved(acc, flags.checkpoint_dir)) {
      loader.set_epoch(acc.resume_epoch());  // the loader counts its epochs from here on
      loader.skip_first_batches(acc.resume_batch());
    }

    acc.init_trackers("fashion_mnist", {{"lr", std::to_string(flags.lr)},
                                        {"momentum", std::to_string(flags.momentum)},
                                        {"batch_size", std::to_string(flags.batch_size)},
                                        {"epochs", std::to_string(flags.epochs)},
                                        {"num_processes", std::to_string(acc.num_processes())}});
    for (int epoch = int(acc.resume_epoch()); epoch < flags.epochs; ++epoch) {
      const auto started = std::chrono::steady_clock::now();
      set_lr(optimizer, scheduled_lr(flags.lr, epoch, flags.epochs));
      model->train();
      double loss_sum = 0;
      double batches = 0;
      auto step_started = std::chrono::steady_clock::now();
      // A progress bar on the main process (--disable_progress_bar turns it off).
      for (auto& batch : acc.progress(*loader, "epoch " + std::to_string(epoch + 1))) {
        optimizer.zero_grad();
        auto loss = F::cross_entropy(model(batch.data), batch.target);
        acc.backward(loss);
        optimizer.step();
        loss_sum += loss.item<double>();
        batches += 1;
        const auto now = std::chrono::steady_clock::now();
        acc.log({{"train/loss", loss.item<double>()},  // this rank's (the main process's)
                 {"train/lr", optimizer.optimizer().param_groups()[0].options().get_lr()},
                 {"train/step_seconds", std::chrono::duration<double>(now - step_started).count()}},
                std::int64_t(acc.step()));
        step_started = now;
      }
      // The mean training loss over every process's batches.
      const torch::Tensor sums =
          acc.reduce(torch::tensor({loss_sum, batches}, torch::kDouble), accel::ReduceOp::sum);

      // Test accuracy: each process predicts its shard; gather_for_metrics drops the sampler's
      // padding, so exactly the test set's images are counted.
      model->eval();
      std::int64_t correct = 0, seen = 0;
      {
        torch::NoGradGuard no_grad;
        for (const auto& batch : test_loader) {
          const torch::Tensor predicted = model(batch.data).argmax(1);
          const torch::Tensor all_predicted =
              acc.gather_for_metrics(predicted, test_loader, batch.index);
          const torch::Tensor all_targets =
              acc.gather_for_metrics(batch.target, test_loader, batch.index);
          correct += all_predicted.eq(all_targets).sum().item<std::int64_t>();
          seen += all_predicted.size(0);
        }
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double summed_batches = sums[1].item<double>();
      const double mean_loss = summed_batches > 0 ? sums[0].item<double>() / summed_batches : 0.0;
      const double accuracy = seen > 0 ? double(correct) / double(seen) : 0.0;
      acc.print("epoch %d: loss %.4f, test accuracy %.4f, %.1f s\n", epoch + 1, mean_loss, accuracy,
                seconds);
      acc.log({{"epoch/loss", mean_loss}, {"epoch/test_accuracy", accuracy}},
              std::int64_t(acc.step()));
      if (!flags.checkpoint_dir.empty()) acc.save_state(flags.checkpoint_dir);
    }
    acc.end_training();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
