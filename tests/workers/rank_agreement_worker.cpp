// One rank of rank_agreement_test: the raw API's prepare and make_sampler with one thing
// different on rank 1 (and, with --also_rank2, on rank 2), so the test can see that every
// rank refuses with a message naming the rank and both values. Then one training step, so a
// job whose ranks agree (--differ none, or a legitimately different seed) runs through.
//   rank_agreement_worker --differ none|seed|hidden|name|count|dtype|group|lr|momentum|
//                                  accumulation|mixed_precision|strategy|dataset_size|
//                                  batch_size|sampler_seed|shuffle [--also_rank2]
// Exits 0 after the verdict "agreed", 3 after "mismatch: MESSAGE" (a RankMismatchError), 1
// otherwise.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "examples/raw_mlp/param_refs.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

int main(int argc, char** argv) {
  const accel::test::WorkerFlags flags(argc, argv);
  const std::string differ = flags.text("differ", "none");
  const bool also_rank2 = flags.has("also_rank2");
  const char* rank_env = std::getenv("RANK");
  const int env_rank = rank_env ? std::atoi(rank_env) : 0;
  const bool odd = env_rank == 1 || (also_rank2 && env_rank == 2);  // the rank that differs
  const auto pick = [&](const std::string& item) { return odd && differ == item; };

  AcceleratorOptions options;
  if (pick("accumulation")) options.gradient_accumulation_steps = 2;
  if (pick("mixed_precision")) options.mixed_precision = "bf16";
  if (pick("strategy")) options.distributed_type = "ZERO", options.zero_stage = 2;
  try {
    Accelerator acc(options);
    acc.set_seed(pick("seed") ? 7 : 42);  // rank 0's seed is everyone's: not a mismatch

    raw_mlp::Mlp model({16, pick("hidden") ? 16 : 32, 10}, acc.seed());
    std::vector<ParamRef> params =
        raw_mlp::param_refs(model, pick("name") ? "fc" : "layer", pick("group") ? 1 : 0);
    std::vector<float> extra(4, 0.0f), extra_grad(4, 0.0f);
    if (pick("count"))
      params.push_back({"extra", buffer_of(std::span(extra)), buffer_of(std::span(extra_grad))});
    if (pick("dtype")) params[1].data.dtype = params[1].grad.dtype = DType::i32;
    Sgd optimizer(std::vector<SgdOptions>(
        2, SgdOptions{.lr = pick("lr") ? 0.2 : 0.1, .momentum = pick("momentum") ? 0.5 : 0.9}));
    acc.prepare(params, optimizer);

    const std::size_t batch = pick("batch_size") ? 2 : 4;
    ShardedSampler sampler = acc.make_sampler(
        pick("dataset_size") ? 90 : 100,
        {batch, !pick("shuffle"), std::uint64_t(pick("sampler_seed") ? 5 : 11), false});

    // One step: a job whose ranks agree trains.
    std::vector<float> x(batch * 16, 0.5f);
    std::vector<int> labels(batch, 3);
    acc.begin_batch(0, sampler.num_batches());
    model.forward_backward(x, labels, acc.loss_scale(), [&](std::size_t l) {
      acc.grad_ready(2 * l);
      acc.grad_ready(2 * l + 1);
    });
    if (acc.sync_gradients()) acc.optimizer_step();
    accel::test::VerdictLog verdicts;
    verdicts.check(true, "agreed", "one step trained");
    return 0;
  } catch (const RankMismatchError& e) {
    std::printf("mismatch: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank_agreement_worker: %s\n", e.what());
    return 1;
  }
}
