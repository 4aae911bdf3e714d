// examples/raw_mlp's hand-written MLP on a GPU (cuda_mlp.hpp: cudaMalloc'd buffers, cuBLAS
// for the matrix products, small kernels for the rest), trained on Fashion-MNIST through the
// raw Accelerator API exactly as raw_mlp is: prepare(model, params_of, optimizer) with
// ParamRefs over GPU memory, forward_backward reporting each layer's gradients as ready,
// sync_gradients, clip_grad_norm, optimizer_step (the built-in SGD / AdamW, whose CUDA
// kernels step GPU segments). So the config chooses DDP or ZeRO stage 1/2 over NCCL, or
// DataParallel over the GPUs of one process, and the loop does not change:
//
//   build/bin/accel launch --multi_gpu --num_processes 2 build/bin/raw_cuda --epochs 2
//   build/bin/accel launch --use_zero --zero_stage 2 --num_processes 2 build/bin/raw_cuda
//   build/bin/accel launch --data_parallel --gpu_ids 0,1 build/bin/raw_cuda
//   build/bin/raw_cuda --mixed_precision fp16     (one process, one GPU)
//
// With --checkpoint_dir it saves after every epoch (every --save_every optimizer steps, and
// when --max_steps stops it) and, when a checkpoint is there at start, continues from it,
// mid-epoch included, as raw_mlp does: the GPU parameters and optimizer state are copied
// through host memory (Accelerator::save_state / load_state).
//
// --mixed_precision fp16|bf16 (or the config's mixed_precision) computes with f16/bf16 copies
// of the fp32 master weights; under fp16 the Accelerator's dynamic loss scaling scales the
// loss, unscales the gradients on the GPU and skips steps that overflowed.
// Without a CUDA device it says so and exits 1.

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "accelerate/checkpointing/checkpoint.hpp"
#include "backends/optim/adamw.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/idx_reader.hpp"
#include "examples/common/image_batches.hpp"
#include "examples/common/resume.hpp"
#include "examples/raw_cuda/cuda_mlp.hpp"

namespace {

struct Flags {
  int epochs = 2;
  std::size_t batch_size = 64;    // per process
  std::string optimizer = "sgd";  // sgd | adamw
  float lr = 0.01f;               // AdamW: use ~1e-3
  float momentum = 0.9f;          // SGD
  float weight_decay = 0.0f;
  double clip = 5.0;            // max global gradient norm; 0 = no clipping
  std::string mixed_precision;  // "" = the config's; no | fp16 | bf16
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int hidden = 64;
  std::size_t train_samples = 0;  // 0 = all 60000
  std::size_t test_samples = 0;   // 0 = all 10000
  std::uint64_t seed = 42;
  std::uint64_t max_steps = 0;  // stop after this many optimizer steps; 0 = run every epoch
  std::uint64_t log_every = 0;  // print "step S loss X" every this many steps; 0 = never
  std::string save_params;      // the main process writes the final fp32 parameters here
  std::string checkpoint_dir;
  std::uint64_t save_every = 0;  // optimizer steps between mid-epoch checkpoints; 0 = none
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "raw_cuda: %s\n"
               "usage: raw_cuda [--epochs N] [--batch_size N] [--optimizer sgd|adamw] [--lr X]\n"
               "                [--momentum X] [--weight_decay X] [--clip X]\n"
               "                [--mixed_precision no|fp16|bf16] [--data_dir DIR] [--hidden N]\n"
               "                [--train_samples N] [--test_samples N] [--seed N]\n"
               "                [--max_steps N] [--log_every N] [--save_params FILE]\n"
               "                [--checkpoint_dir DIR] [--save_every STEPS]\n",
               problem.c_str());
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (const auto& [key, value] : examples::parse_flag_values(argc, argv, usage)) {
    try {
      if (key == "epochs")
        f.epochs = std::stoi(value);
      else if (key == "batch_size")
        f.batch_size = std::stoul(value);
      else if (key == "optimizer")
        f.optimizer = value;
      else if (key == "lr")
        f.lr = std::stof(value);
      else if (key == "momentum")
        f.momentum = std::stof(value);
      else if (key == "weight_decay")
        f.weight_decay = std::stof(value);
      else if (key == "clip")
        f.clip = std::stod(value);
      else if (key == "mixed_precision")
        f.mixed_precision = value;
      else if (key == "data_dir")
        f.data_dir = value;
      else if (key == "hidden")
        f.hidden = std::stoi(value);
      else if (key == "train_samples")
        f.train_samples = std::stoul(value);
      else if (key == "test_samples")
        f.test_samples = std::stoul(value);
      else if (key == "seed")
        f.seed = std::stoull(value);
      else if (key == "max_steps")
        f.max_steps = std::stoull(value);
      else if (key == "log_every")
        f.log_every = std::stoull(value);
      else if (key == "save_params")
        f.save_params = value;
      else if (key == "checkpoint_dir")
        f.checkpoint_dir = value;
      else if (key == "save_every")
        f.save_every = std::stoull(value);
      else
        usage("unknown flag --" + key);
    } catch (const std::logic_error&) {
      usage("--" + key + ": bad value '" + value + "'");
    }
  }
  if (f.epochs < 0 || f.batch_size == 0 || f.hidden <= 0) usage("flags out of range");
  if (f.optimizer != "sgd" && f.optimizer != "adamw")
    usage("--optimizer: '" + f.optimizer + "' is not sgd or adamw");
  if (!f.mixed_precision.empty() && f.mixed_precision != "no" && f.mixed_precision != "fp16" &&
      f.mixed_precision != "bf16")
    usage("--mixed_precision: '" + f.mixed_precision + "' is not no, fp16 or bf16");
  return f;
}

accel::DType compute_dtype(const std::string& mixed_precision) {
  if (mixed_precision == "fp16") return accel::DType::f16;
  if (mixed_precision == "bf16") return accel::DType::bf16;
  return accel::DType::f32;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "raw_cuda: no CUDA device visible (%s): this example needs a GPU\n",
                 rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return 1;
  }
  try {
    accel::AcceleratorOptions options;
    if (!flags.mixed_precision.empty()) options.mixed_precision = flags.mixed_precision;
    accel::Accelerator acc(options);
    // The GPU the config gives this process (LOCAL_RANK's, or DataParallel's replica 0's).
    if (acc.cuda_device() < 0)
      throw std::runtime_error(
          "the configuration runs on the CPU (use_cpu true or MULTI_CPU); "
          "raw_cuda needs use_cpu false (MULTI_GPU, ZERO or DATA_PARALLEL "
          "on GPUs, or NO on a GPU)");
    if (acc.cuda_device() >= devices)
      throw std::runtime_error("this process's GPU is " + std::to_string(acc.cuda_device()) +
                               ", but " + std::to_string(devices) + " are visible");
    if (cudaSetDevice(acc.cuda_device()) != cudaSuccess)
      throw std::runtime_error("cudaSetDevice(" + std::to_string(acc.cuda_device()) + ") failed");
    acc.set_seed(flags.seed);
    const auto train = examples::to_floats(
        examples::load_mnist_split(flags.data_dir, "train", flags.train_samples));
    const auto test =
        examples::to_floats(examples::load_mnist_split(flags.data_dir, "t10k", flags.test_samples));
    const accel::DType dtype = compute_dtype(acc.mixed_precision());
    acc.print(
        "raw_cuda: %zu training and %zu test images, %d processes x %d replica(s), %zu per "
        "batch each, MLP %zu-%d-10, %s compute, %s\n",
        train.count, test.count, acc.num_processes(), acc.data_parallel_replicas(),
        flags.batch_size, train.features, flags.hidden,
        std::string(accel::dtype_name(dtype)).c_str(), flags.optimizer.c_str());

    raw_cuda::CudaMlp model({int(train.features), flags.hidden, 10}, acc.seed(), dtype,
                            int(std::max<std::size_t>(flags.batch_size, 256)));
    // The built-in optimizers step GPU segments with their CUDA kernels: every parameter under
    // DDP, this rank's slices of the flat buffers under ZeRO, replica 0's under DataParallel
    // (whose replicas are copies of the model, each made on its own GPU).
    std::unique_ptr<accel::Optimizer> optimizer;
    if (flags.optimizer == "sgd")
      optimizer = std::make_unique<accel::Sgd>(accel::SgdOptions{
          .lr = flags.lr, .momentum = flags.momentum, .weight_decay = flags.weight_decay});
    else
      optimizer = std::make_unique<accel::AdamW>(
          accel::AdamWOptions{.lr = flags.lr, .weight_decay = flags.weight_decay});
    acc.prepare(
        model, [](raw_cuda::CudaMlp& m) { return m.param_refs(); }, *optimizer);
    acc.print("raw_cuda: strategy %s\n", std::string(acc.strategy().name()).c_str());

    const bool checkpoints = !flags.checkpoint_dir.empty();
    examples::resume_if_saved(acc, flags.checkpoint_dir);

    accel::ShardedSampler sampler =
        acc.make_sampler(train.count, {flags.batch_size, true, 0, false});
    std::vector<float> x;
    std::vector<int> labels;
    std::uint64_t skipped = 0;
    bool done = flags.max_steps > 0 && acc.step() >= flags.max_steps;
    for (std::uint64_t epoch = acc.resume_epoch(); epoch < std::uint64_t(flags.epochs) && !done;
         ++epoch) {
      const auto started = std::chrono::steady_clock::now();
      acc.set_epoch(epoch);
      sampler.set_epoch(epoch);
      const auto idx = sampler.indices();
      const std::size_t batches = sampler.num_batches();
      double loss_sum = 0;
      std::size_t loss_count = 0;
      for (std::size_t b = acc.batch_in_epoch(); b < batches; ++b) {  // mid-epoch on a resume
        const auto [begin, end] = sampler.batch_bounds(b);  // one process: a short last batch
        examples::take_batch(train, idx, begin, end - begin, x, labels);
        acc.begin_batch(b, batches);
        // The batch's rows on `model`, or split between DataParallel's replicas (each with its
        // GPU current).
        const float loss = examples::forward_backward_rows(acc, model, x, labels, train.features);
        loss_sum += loss;
        ++loss_count;
        if (acc.sync_gradients()) {
          if (flags.clip > 0) acc.clip_grad_norm(flags.clip);
          acc.optimizer_step();
          model.zero_grad();
          if (flags.log_every > 0 && acc.step() % flags.log_every == 0)
            acc.print("step %llu loss %.6f\n", static_cast<unsigned long long>(acc.step()),
                      double(loss));
          if (flags.max_steps > 0 && acc.step() >= flags.max_steps) {
            done = true;
            break;
          }
          if (checkpoints && flags.save_every > 0 && acc.step() % flags.save_every == 0 &&
              b + 1 < batches)
            acc.save_state(flags.checkpoint_dir);
        } else if (acc.optimizer_step_was_skipped()) {
          ++skipped;  // fp16 overflow: the Accelerator zeroed the gradients
        }
      }
      float mean[2] = {float(loss_sum), float(loss_count)};
      acc.reduce(accel::buffer_of(std::span<float>(mean, 2)), accel::ReduceOp::sum);
      const double accuracy = examples::test_accuracy(acc, model, test);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      acc.print("epoch %llu/%d: loss %.4f, test accuracy %.4f (%.1f s)\n",
                static_cast<unsigned long long>(epoch + 1), flags.epochs,
                mean[1] > 0 ? double(mean[0] / mean[1]) : 0.0, accuracy, seconds);
      if (checkpoints) acc.save_state(flags.checkpoint_dir);  // at --max_steps too
    }
    if (acc.loss_scaler())
      acc.print("fp16: %llu steps skipped on overflow, loss scale now %g\n",
                static_cast<unsigned long long>(skipped), acc.loss_scaler()->scale());
    if (!flags.save_params.empty() && acc.is_main_process()) {
      const std::vector<float> params = model.download_parameters();
      std::ofstream out(flags.save_params, std::ios::binary);
      out.write(reinterpret_cast<const char*>(params.data()),
                std::streamsize(params.size() * sizeof(float)));
      if (!out) throw std::runtime_error("cannot write " + flags.save_params);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "raw_cuda: %s\n", e.what());
    return 1;
  }
}
