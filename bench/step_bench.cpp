// step_bench: the time of one training step (zero_grad, forward, loss, backward, optimizer
// step) of a LibTorch model, in plain LibTorch or through accelerate-cpp's TorchAccelerator.
//
//   build/bin/step_bench --model mlp2m --optimizer sgd --mode plain --threads 2
//   build/bin/step_bench --model mlp2m --optimizer sgd --mode accel --threads 2      # world 1
//   build/bin/accel launch -q --num_processes 2 build/bin/step_bench --model mlp2m --mode accel
//
// --mode plain is the plain LibTorch loop: no accelerate-cpp object exists. --mode accel is
// the README's loop (prepare, acc.backward, the wrapped optimizer): alone it is world 1 over
// the world-of-one communicator, under `accel launch` or mpirun it is DDP over whatever
// communicator the launcher chose (ACCEL_COMM_BACKEND: gloo, mpi, ...).
//
// The data is synthetic: a few fixed random batches of the model's input shape (per rank its
// own), cycled, made before the clock starts; step time does not depend on the values. The
// models: the Fashion-MNIST CNN of examples/fashion_mnist (225k parameters, input 1x28x28),
// an MLP 784-1024-1024-10 (1.9M) and an MLP 1024-4096-4096-1024-10 (25M), ReLU between the
// layers, cross-entropy loss. bench/pytorch_ddp_step.py is the same in PyTorch.
//
// Rank 0 prints one line of key=value pairs (bench/run_step_bench.sh reads it):
//   step_bench: impl=accel-cpp mode=accel comm=gloo strategy=ddp world=2 model=mlp2m ...
//     median_ms=.. mean_ms=.. min_ms=.. max_ms=.. samples_per_s=.. (world x batch / mean step)
//     zero_ms= fwd_ms= bwd_ms= opt_ms= (medians of the phases; bwd includes the all-reduce
//     wait in accel mode) minflt_per_step= (minor page faults of the whole process per
//     timed step: memory touched fresh each step) cpu_ms_per_step= (CPU time of the whole
//     process, all threads, per timed step: less sensitive than wall time to other
//     processes on the machine; OpenMP's spin-waiting counts) zero_cpu_ms= fwd_cpu_ms=
//     bwd_cpu_ms= opt_cpu_ms= (medians of the whole process's CPU time in each phase: where
//     distributing adds work, not only waiting) bwd_main_cpu_ms= (median CPU time of the
//     thread running the loop during backward; with --threads 1 the rest of bwd_cpu_ms is the
//     communicator's worker) loss= (last step's, rank 0's)

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "examples/fashion_mnist/fashion_mnist.hpp"

namespace {

namespace F = torch::nn::functional;
using Clock = std::chrono::steady_clock;

const char* kUsage =
    "usage: step_bench [flags]   (see bench/README.md)\n"
    "  --model M        cnn | mlp2m | mlp25m                  (default mlp2m)\n"
    "  --optimizer O    sgd (lr 0.01, momentum 0.9) | adam (lr 0.001)   (default sgd)\n"
    "  --mode M         plain (LibTorch alone) | accel (TorchAccelerator) (default plain)\n"
    "  --steps N        timed steps                           (default 100)\n"
    "  --warmup N       untimed steps first                   (default 10)\n"
    "  --threads N      LibTorch intra-op threads; 0 = OMP_NUM_THREADS, else LibTorch's "
    "default (default 0)\n"
    "  --batch_size N   samples per step per process          (default 64)\n"
    "  --seed N         model init and data                   (default 42)\n";

struct Flags {
  std::string model = "mlp2m";
  std::string optimizer = "sgd";
  std::string mode = "plain";
  int steps = 100;
  int warmup = 10;
  int threads = 0;
  int batch_size = 64;
  int seed = 42;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "step_bench: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& text, int min) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value < min || value > 1'000'000'000)
    usage_error(flag + " '" + text + "' is not an integer >= " + std::to_string(min));
  return static_cast<int>(value);
}

std::string parse_choice(const std::string& flag, const std::string& text,
                         const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), text) == choices.end())
    usage_error(flag + " '" + text + "' is not one of the choices");
  return text;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::string value;
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      usage_error(flag + " needs a value");
    }
    if (flag == "--model")
      f.model = parse_choice(flag, value, {"cnn", "mlp2m", "mlp25m"});
    else if (flag == "--optimizer")
      f.optimizer = parse_choice(flag, value, {"sgd", "adam"});
    else if (flag == "--mode")
      f.mode = parse_choice(flag, value, {"plain", "accel"});
    else if (flag == "--steps")
      f.steps = parse_int(flag, value, 1);
    else if (flag == "--warmup")
      f.warmup = parse_int(flag, value, 0);
    else if (flag == "--threads")
      f.threads = parse_int(flag, value, 0);
    else if (flag == "--batch_size")
      f.batch_size = parse_int(flag, value, 1);
    else if (flag == "--seed")
      f.seed = parse_int(flag, value, 0);
    else
      usage_error("unknown flag '" + flag + "'");
  }
  return f;
}

// A model as the loop sees it: its module (for prepare and the optimizer) and its forward.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<std::int64_t> input_shape;  // one sample
};

torch::nn::Sequential mlp(const std::vector<std::int64_t>& widths) {
  torch::nn::Sequential seq;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) seq->push_back(torch::nn::ReLU());
    seq->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
  }
  return seq;
}

Model make_model(const std::string& name) {
  if (name == "cnn") {
    fashion_mnist::Net net;  // the main job's CNN, as it is
    return {
        net.ptr(), [net](const torch::Tensor& x) mutable { return net->forward(x); }, {1, 28, 28}};
  }
  torch::nn::Sequential seq =
      name == "mlp2m" ? mlp({784, 1024, 1024, 10}) : mlp({1024, 4096, 4096, 1024, 10});
  const std::int64_t in = name == "mlp2m" ? 784 : 1024;
  return {seq.ptr(), [seq](const torch::Tensor& x) mutable { return seq->forward(x); }, {in}};
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name,
                                                        torch::nn::Module& module) {
  if (name == "sgd")
    return std::make_unique<torch::optim::SGD>(module.parameters(),
                                               torch::optim::SGDOptions(0.01).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(module.parameters(), torch::optim::AdamOptions(1e-3));
}

// CPU time so far of the whole process (all threads) or of the calling thread, in ms.
double cpu_ms_of(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) / 1e6;
}
double process_cpu_ms() { return cpu_ms_of(CLOCK_PROCESS_CPUTIME_ID); }

// The whole process's minor page faults and CPU time (user + system, all threads) so far.
struct Usage {
  long minflt = 0;
  double cpu_ms = 0;
};

Usage usage_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_minflt, process_cpu_ms()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// What differs between the modes: how the gradients are zeroed, computed and applied.
struct Loop {
  std::function<void()> zero_grad;
  std::function<void(const torch::Tensor&)> backward;
  std::function<void()> step;
};

// Times warmup + steps steps; returns rank 0's result line's measurements.
struct Timings {
  std::vector<double> total, zero, fwd, bwd, opt;
  std::vector<double> zero_cpu, fwd_cpu, bwd_cpu, opt_cpu, bwd_main_cpu;
  long minflt = 0;
  double cpu_ms = 0;
  double last_loss = 0;
};

Timings run_steps(const Flags& flags, const Model& model, const Loop& loop, int rank) {
  // A few fixed batches (each rank its own), cycled: made before the clock starts.
  torch::manual_seed(std::uint64_t(flags.seed) * 1000 + std::uint64_t(rank) + 1);
  std::vector<std::int64_t> shape{flags.batch_size};
  shape.insert(shape.end(), model.input_shape.begin(), model.input_shape.end());
  constexpr int kBatches = 4;
  std::vector<torch::Tensor> inputs, targets;
  for (int b = 0; b < kBatches; ++b) {
    inputs.push_back(torch::randn(shape));
    targets.push_back(torch::randint(0, 10, {flags.batch_size}, torch::kLong));
  }

  Timings t;
  model.module->train();
  Usage before;
  for (int i = 0; i < flags.warmup + flags.steps; ++i) {
    if (i == flags.warmup) before = usage_now();
    const double c0 = process_cpu_ms();
    const auto t0 = Clock::now();
    loop.zero_grad();
    const auto t1 = Clock::now();
    const double c1 = process_cpu_ms();
    const torch::Tensor loss =
        F::cross_entropy(model.forward(inputs[i % kBatches]), targets[i % kBatches]);
    const auto t2 = Clock::now();
    const double c2 = process_cpu_ms();
    const double main2 = cpu_ms_of(CLOCK_THREAD_CPUTIME_ID);
    loop.backward(loss);
    const double main3 = cpu_ms_of(CLOCK_THREAD_CPUTIME_ID);
    const double c3 = process_cpu_ms();
    const auto t3 = Clock::now();
    loop.step();
    const auto t4 = Clock::now();
    const double c4 = process_cpu_ms();
    if (i < flags.warmup) continue;
    t.total.push_back(ms_between(t0, t4));
    t.zero.push_back(ms_between(t0, t1));
    t.fwd.push_back(ms_between(t1, t2));
    t.bwd.push_back(ms_between(t2, t3));
    t.opt.push_back(ms_between(t3, t4));
    t.zero_cpu.push_back(c1 - c0);
    t.fwd_cpu.push_back(c2 - c1);
    t.bwd_cpu.push_back(c3 - c2);
    t.opt_cpu.push_back(c4 - c3);
    t.bwd_main_cpu.push_back(main3 - main2);
    if (i + 1 == flags.warmup + flags.steps) t.last_loss = loss.item<double>();
  }
  const Usage after = usage_now();
  t.minflt = after.minflt - before.minflt;
  t.cpu_ms = after.cpu_ms - before.cpu_ms;
  return t;
}

void print_result(const Flags& flags, const std::string& comm, const std::string& strategy,
                  int world, std::int64_t params, const Timings& t) {
  const double mean = std::accumulate(t.total.begin(), t.total.end(), 0.0) / double(t.total.size());
  std::printf(
      "step_bench: impl=accel-cpp mode=%s comm=%s strategy=%s world=%d model=%s params=%lld "
      "optimizer=%s batch=%d threads=%d steps=%d warmup=%d median_ms=%.3f mean_ms=%.3f "
      "min_ms=%.3f max_ms=%.3f samples_per_s=%.1f zero_ms=%.3f fwd_ms=%.3f bwd_ms=%.3f opt_ms=%.3f "
      "minflt_per_step=%.1f cpu_ms_per_step=%.3f zero_cpu_ms=%.3f fwd_cpu_ms=%.3f "
      "bwd_cpu_ms=%.3f opt_cpu_ms=%.3f bwd_main_cpu_ms=%.3f loss=%.4f\n",
      flags.mode.c_str(), comm.c_str(), strategy.c_str(), world, flags.model.c_str(),
      static_cast<long long>(params), flags.optimizer.c_str(), flags.batch_size,
      at::get_num_threads(), flags.steps, flags.warmup, median(t.total), mean,
      *std::min_element(t.total.begin(), t.total.end()),
      *std::max_element(t.total.begin(), t.total.end()),
      double(world) * flags.batch_size * 1000.0 / mean, median(t.zero), median(t.fwd),
      median(t.bwd), median(t.opt), double(t.minflt) / flags.steps, t.cpu_ms / flags.steps,
      median(t.zero_cpu), median(t.fwd_cpu), median(t.bwd_cpu), median(t.opt_cpu),
      median(t.bwd_main_cpu), t.last_loss);
  std::fflush(stdout);
}

std::int64_t count_parameters(const torch::nn::Module& module) {
  std::int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  if (flags.threads > 0)
    at::set_num_threads(flags.threads);
  else
    fashion_mnist::use_omp_num_threads();
  try {
    torch::manual_seed(std::uint64_t(flags.seed));  // the same initial model on every rank
    const Model model = make_model(flags.model);
    const std::int64_t params = count_parameters(*model.module);
    const auto optimizer = make_optimizer(flags.optimizer, *model.module);

    if (flags.mode == "plain") {
      const Loop loop{[&] { optimizer->zero_grad(); },
                      [](const torch::Tensor& loss) { loss.backward(); },
                      [&] { optimizer->step(); }};
      print_result(flags, "none", "none", 1, params, run_steps(flags, model, loop, 0));
      return 0;
    }

    accel::TorchAccelerator acc;
    accel::AcceleratedOptimizer& opt = acc.prepare_module(*model.module, *optimizer);
    const Loop loop{[&] { opt.zero_grad(); },
                    [&](const torch::Tensor& loss) { acc.backward(loss); }, [&] { opt.step(); }};
    const Timings t = run_steps(flags, model, loop, acc.process_index());
    if (acc.is_main_process())
      print_result(flags, std::string(acc.comm().backend_name()),
                   std::string(acc.strategy().name()), acc.num_processes(), params, t);
    acc.wait_for_everyone();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "step_bench: %s\n", e.what());
    return 1;
  }
}
