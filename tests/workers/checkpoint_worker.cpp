// One rank of the checkpoint tests (run by checkpoint_test over real processes): the raw MLP
// on synthetic data with momentum SGD (its velocity a registered state), input noise drawn
// from acc.rng() (so the per-rank RNG must be restored exactly), and optionally a per-rank
// registered state. It trains to --epochs, resuming from --checkpoint when --resume finds
// one there, saves at the listed points, and can die right after a save or in the middle of
// one, as a crashed job would.
//
//   checkpoint_worker --epochs N [--accumulation K] [--checkpoint DIR] [--resume]
//                     [--save_at B1,B2,...]   save after these batches of this run (1-based)
//                     [--save_epochs]         save after every epoch
//                     [--die_after_save]      SIGKILL itself after the last --save_at save
//                     [--crash_stage STAGE]   rank 0 SIGKILLs itself at STAGE of that save
//                     [--crash_count N]       ...at the Nth time it reaches STAGE (default 1)
//                     [--per_rank_state]      register a per-rank state too
//                     [--out FILE]            rank 0 writes the final parameters' bytes
//   For elastic jobs (launch_elastic_test), the same global batches at any world size:
//                     [--samples N]           the dataset's size (default 90)
//                     [--no_noise]            no per-rank input noise
//                     [--save_every K]        save after every K-th batch of an epoch
//                     [--sleep_ms MS]         after each batch (a job that runs a while)
//                     [--progress DIR]        touch DIR/attempt<A>_world<W> when training
//                                             (A: ACCEL_RESTART_COUNT)
// It prints its pid first. Exit 0 on success, 2 with the error on stderr.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>

#include "accelerate/accelerator.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/momentum_sgd.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

const std::vector<int> kSizes = {12, 24, 5};
std::size_t g_dataset_size = 90;  // 4 per rank: padded at world 1 and 2
constexpr std::size_t kPerRank = 4;

struct Dataset {
  std::vector<float> x;
  std::vector<int> labels;
};

Dataset make_dataset() {
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  Dataset d;
  d.x.resize(g_dataset_size * kSizes.front());
  for (float& v : d.x) v = g(rng);
  for (std::size_t i = 0; i < g_dataset_size; ++i) d.labels.push_back(int(rng() % kSizes.back()));
  return d;
}

[[noreturn]] void die() {
  std::fflush(stdout);
  ::kill(::getpid(), SIGKILL);
  ::_exit(99);  // not reached
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 2, crash_count = 1, save_every = 0, sleep_ms = 0;
  std::string checkpoint, out_file, crash_stage, progress;
  bool resume = false, save_epochs = false, die_after_save = false, per_rank_state = false;
  bool noise_on = true;
  std::set<std::size_t> save_at;
  AcceleratorOptions options;
  const accel::test::WorkerFlags flags(argc, argv);
  flags.only({"epochs", "accumulation", "checkpoint", "resume", "save_epochs", "die_after_save",
              "crash_stage", "crash_count", "per_rank_state", "out", "samples", "no_noise",
              "save_every", "sleep_ms", "progress", "save_at"});
  epochs = int(flags.integer("epochs", epochs));
  if (flags.has("accumulation"))
    options.gradient_accumulation_steps = int(flags.integer("accumulation"));
  checkpoint = flags.text("checkpoint");
  resume = flags.has("resume");
  save_epochs = flags.has("save_epochs");
  die_after_save = flags.has("die_after_save");
  crash_stage = flags.text("crash_stage");
  crash_count = int(flags.integer("crash_count", crash_count));
  per_rank_state = flags.has("per_rank_state");
  out_file = flags.text("out");
  g_dataset_size = std::size_t(flags.integer("samples", std::int64_t(g_dataset_size)));
  noise_on = !flags.has("no_noise");
  save_every = int(flags.integer("save_every", 0));
  sleep_ms = int(flags.integer("sleep_ms", 0));
  progress = flags.text("progress");
  const std::string list = flags.text("save_at");
  for (std::size_t p = 0; p < list.size();) {
    const std::size_t comma = list.find(',', p);
    save_at.insert(std::stoul(list.substr(p, comma - p)));
    p = comma == std::string::npos ? list.size() : comma + 1;
  }
  options.ddp.first_bucket_bytes = 256;  // several buckets even for this small model
  options.ddp.bucket_cap_bytes = 1024;
  std::printf("pid %d\n", int(::getpid()));  // tests check that a rerun got the same one
  try {
    Accelerator acc(options);
    acc.set_seed(7);
    const Dataset data = make_dataset();
    raw_mlp::Mlp model(kSizes, 3);
    raw_mlp::MomentumSgd optimizer(model, 0.9f);
    acc.prepare_parameters(raw_mlp::param_refs(model));
    acc.register_state(
        "optimizer", [&] { return optimizer.save(); },
        [&](const std::string& b) { optimizer.load(b); });
    std::uint64_t micro_batches = 0;  // this rank's, since the start of training
    if (per_rank_state)
      acc.register_state(
          "counter", [&] { return std::to_string(micro_batches); },
          [&](const std::string& b) { micro_batches = std::stoull(b); }, StateScope::per_rank);

    if (resume && checkpoint_exists(checkpoint)) {
      acc.load_state(checkpoint);
      std::printf("resumed at epoch %llu batch %llu step %llu\n",
                  static_cast<unsigned long long>(acc.resume_epoch()),
                  static_cast<unsigned long long>(acc.resume_batch()),
                  static_cast<unsigned long long>(acc.step()));
    }

    ShardedSampler sampler = acc.make_sampler(g_dataset_size, {kPerRank, true, 0, false});
    if (!progress.empty()) {
      const char* attempt = std::getenv("ACCEL_RESTART_COUNT");
      std::ofstream(progress + "/attempt" + (attempt ? attempt : "0") + "_world" +
                    std::to_string(acc.num_processes()));
    }
    const std::size_t last_save = save_at.empty() ? 0 : *save_at.rbegin();
    std::size_t batches_run = 0;
    std::vector<float> x;
    std::vector<int> labels;
    std::normal_distribution<float> noise(0.0f, 0.1f);
    for (std::uint64_t epoch = acc.resume_epoch(); epoch < std::uint64_t(epochs); ++epoch) {
      acc.set_epoch(epoch);
      sampler.set_epoch(epoch);
      const auto idx = sampler.indices();
      for (std::size_t b = acc.batch_in_epoch(); b < sampler.num_batches(); ++b) {
        x.clear();
        labels.clear();
        const auto [begin, end] = sampler.batch_bounds(b);  // one process: a short last batch
        for (std::size_t k = begin; k < end; ++k) {
          const std::size_t i = idx[k];
          for (int f = 0; f < kSizes.front(); ++f)
            x.push_back(data.x[i * std::size_t(kSizes.front()) + std::size_t(f)] +
                        (noise_on ? noise(acc.rng()) : 0.0f));
          labels.push_back(data.labels[i]);
        }
        acc.begin_batch(b, sampler.num_batches());
        model.forward_backward(x, labels, acc.loss_scale(), [&](std::size_t l) {
          acc.grad_ready(2 * l);
          acc.grad_ready(2 * l + 1);
        });
        ++micro_batches;
        if (acc.sync_gradients()) {
          acc.clip_grad_norm(2.0);
          optimizer.step(0.05f);
          model.zero_grad();
        }
        ++batches_run;
        if (sleep_ms > 0) ::usleep(useconds_t(sleep_ms) * 1000);
        if (save_every > 0 && (b + 1) % std::size_t(save_every) == 0) {
          acc.save_state(checkpoint);
          std::printf("saved after batch %zu of epoch %llu at world %d\n", b + 1,
                      static_cast<unsigned long long>(epoch), acc.num_processes());
        }
        if (save_at.count(batches_run)) {
          const bool last = batches_run == last_save;
          if (last && !crash_stage.empty() && acc.is_main_process())
            checkpoint_testing::set_stage_hook([&, seen = 0](std::string_view stage) mutable {
              if (stage == crash_stage && ++seen == crash_count) die();
            });
          acc.save_state(checkpoint);
          std::printf("saved after batch %zu (epoch %llu, next batch %llu, step %llu)\n",
                      batches_run, static_cast<unsigned long long>(acc.epoch()),
                      static_cast<unsigned long long>(acc.batch_in_epoch()),
                      static_cast<unsigned long long>(acc.step()));
          if (last && die_after_save) die();
        }
      }
      if (save_epochs) acc.save_state(checkpoint);
    }
    std::printf("done: step %llu, %llu micro-batches on this rank\n",
                static_cast<unsigned long long>(acc.step()),
                static_cast<unsigned long long>(micro_batches));
    if (!out_file.empty() && acc.is_main_process()) {
      std::ofstream out(out_file, std::ios::binary);
      for (const ParamRef& p : raw_mlp::param_refs(model))
        out.write(static_cast<const char*>(p.data.data), std::streamsize(p.data.bytes()));
      if (!out) throw std::runtime_error(out_file + ": cannot write");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_worker: %s\n", e.what());
    return 2;
  }
  return 0;
}
