// One rank of the LibTorch adapter checks, run by torch_accelerator_test over real processes:
//  - training: a LibTorch model prepared by TorchAccelerator and trained on this rank's shard
//    of every global batch (2 epochs of 10 batches, the last one padded) ends with the
//    parameters one process gets on the whole global batches, trained in this same program,
//    in fp64 within a bound derived from the sums' lengths (tests/support/tolerance.hpp: the
//    kernels LibTorch picks depend on the CPU, so fp32 would be within no stated bound), with
//    or without accumulation, clipping, an LR scheduler;
//  - every rank ends with bitwise the same parameters (and, for the CNN, BatchNorm buffers);
//  - gradients stay views of the DDP buckets for the whole run;
//  - evaluation: gather_for_metrics over an epoch yields exactly the dataset's size.
// Prints one "ok ..." line per check; exits 1 on any failure.
//   torch_worker [--model mlp|cnn] [--optimizer sgd|nesterov|adam|adamw] [--accumulation K]
//                [--clip MAX_NORM] [--scheduler] [--bf16] [--dump FILE] [--checkpoint]
//                [--differ_on_rank1 hidden|lr|batch_size]
// The strategy is the config's (ACCEL_DISTRIBUTED_TYPE=ZERO and ACCEL_ZERO_STAGE for ZeRO);
// --dump writes rank 0's final parameters (doubles, module order) for a comparison between
// strategies (torch_accelerator_test: ZeRO against DDP). --differ_on_rank1 gives rank 1 another
// hidden size, param group 0 learning rate or loader batch size: every rank must then exit 3
// with the RankMismatchError's message. --checkpoint runs the trained MLP's first layer and ReLU
// through acc.checkpoint (recomputed in backward; the reference runs plainly).

#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <string>

#include <torch/torch.h>

#include "accelerate/torch/activation_checkpoint.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "backends/ddp/ddp_strategy.hpp"
#include "backends/zero/zero_strategy.hpp"
#include "tests/support/global_batches.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

// Linear-ReLU-Linear as a TORCH_MODULE type (a ModuleHolder).
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(std::int64_t hidden = 32)
      : fc1(register_module("fc1", torch::nn::Linear(16, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++forwards;
    const auto first = [this](const torch::Tensor& in) {
      ++block_runs;  // more than forwards: recomputed in backward
      return torch::relu(fc1(in));
    };
    return fc2(checkpointed ? accel::checkpoint(first, x) : first(x));
  }
  torch::nn::Linear fc1, fc2;
  bool checkpointed = false;
  int forwards = 0, block_runs = 0;
};
TORCH_MODULE(Mlp);

// A tiny CNN with BatchNorm (running statistics are buffers DDP keeps equal).
torch::nn::Sequential make_cnn() {
  namespace nn = torch::nn;
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)), nn::BatchNorm2d(4),
                        nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(), nn::Linear(4 * 4 * 4, 10));
}

struct Model {
  Mlp mlp{nullptr};
  torch::nn::Sequential cnn{nullptr};
  torch::Tensor forward(const torch::Tensor& x) { return mlp ? mlp(x) : cnn->forward(x); }
  torch::nn::Module& module() { return mlp ? static_cast<torch::nn::Module&>(*mlp) : *cnn; }
};

Model make_model(const std::string& kind, std::uint64_t seed, std::int64_t hidden = 32) {
  torch::manual_seed(seed);
  Model m;
  if (kind == "cnn")
    m.cnn = make_cnn();
  else
    m.mlp = Mlp(hidden);
  return m;
}

// Two param groups with different settings: weights, and the rest (biases, BatchNorm).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, Model& m) {
  std::vector<torch::Tensor> weights, others;
  for (const auto& p : m.module().parameters()) (p.dim() > 1 ? weights : others).push_back(p);
  using torch::optim::OptimizerParamGroup;
  std::vector<OptimizerParamGroup> groups;
  if (kind == "nesterov") {
    groups.emplace_back(
        weights,
        std::make_unique<torch::optim::SGDOptions>(
            torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3)));
    groups.emplace_back(others,
                        std::make_unique<torch::optim::SGDOptions>(
                            torch::optim::SGDOptions(0.05).momentum(0.5).weight_decay(1e-2)));
    return std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(0.1));
  }
  if (kind == "sgd") {
    groups.emplace_back(weights, std::make_unique<torch::optim::SGDOptions>(
                                     torch::optim::SGDOptions(0.1).momentum(0.9)));
    groups.emplace_back(others, std::make_unique<torch::optim::SGDOptions>(
                                    torch::optim::SGDOptions(0.05).momentum(0.5)));
    return std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(0.1));
  }
  if (kind == "adam") {
    groups.emplace_back(
        weights, std::make_unique<torch::optim::AdamOptions>(torch::optim::AdamOptions(0.01)));
    groups.emplace_back(others, std::make_unique<torch::optim::AdamOptions>(
                                    torch::optim::AdamOptions(0.005).weight_decay(0.01)));
    return std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions());
  }
  groups.emplace_back(weights, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
  groups.emplace_back(others, std::make_unique<torch::optim::AdamWOptions>(
                                  torch::optim::AdamWOptions(0.005).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions());
}

torch::Tensor loss_of(Model& m, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(m.forward(x), y);
}

// The flat parameters (and buffers) of a module, for comparisons.
torch::Tensor flat_state(torch::nn::Module& m, bool with_buffers) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten().to(torch::kDouble));
  if (with_buffers)
    for (const auto& b : m.buffers()) parts.push_back(b.detach().flatten().to(torch::kDouble));
  return torch::cat(parts);
}

test::VerdictLog verdicts;

}  // namespace

int main(int argc, char** argv) {
  const test::WorkerFlags flags(argc, argv);
  const std::string model_kind = flags.text("model", "mlp");
  const std::string optimizer_kind = flags.text("optimizer", "sgd");
  const std::string dump = flags.text("dump"), differ = flags.text("differ_on_rank1");
  const double max_norm = flags.real("clip", 0);
  const bool scheduler = flags.has("scheduler"), checkpointed = flags.has("checkpoint");
  AcceleratorOptions options;
  if (flags.has("accumulation"))
    options.gradient_accumulation_steps = int(flags.integer("accumulation"));
  if (flags.has("bf16")) options.mixed_precision = "bf16";
  options.ddp.first_bucket_bytes = 256;  // several buckets even for these small models
  options.ddp.bucket_cap_bytes = 2048;
  options.zero.bucket_cap_bytes = 1024;
  torch::set_num_threads(1);
  try {
    TorchAccelerator acc(options);
    const int world = acc.num_processes(), rank = acc.process_index();
    const auto K = std::size_t(acc.gradient_accumulation_steps());
    const bool bf16 = acc.mixed_precision() == "bf16";
    const bool cnn = model_kind == "cnn";
    const auto dtype = bf16 ? torch::kFloat : torch::kDouble;  // see tests/support/tolerance.hpp

    // Each rank starts from other parameters: prepare must broadcast rank 0's. The reference
    // starts from rank 0's.
    const auto odd = [&](const char* item) { return rank == 1 && differ == item; };
    Model model = make_model(model_kind, 100 + std::uint64_t(rank), odd("hidden") ? 16 : 32);
    Model reference = make_model(model_kind, 100);
    if (checkpointed && model.mlp) model.mlp->checkpointed = true;
    model.module().to(dtype);
    reference.module().to(dtype);
    auto optimizer = make_optimizer(optimizer_kind, model);
    if (odd("lr")) optimizer->param_groups()[0].options().set_lr(0.2);
    auto ref_optimizer = make_optimizer(optimizer_kind, reference);
    AcceleratedOptimizer* opt = nullptr;
    if (cnn)
      opt = &acc.prepare(model.cnn, *optimizer).second;
    else
      opt = &acc.prepare(model.mlp, *optimizer).second;
    std::optional<torch::optim::StepLR> schedule, ref_schedule;
    const double initial_lr = optimizer->param_groups()[0].options().get_lr();
    if (scheduler) {
      schedule.emplace(opt->optimizer(), 2, 0.5);
      ref_schedule.emplace(*ref_optimizer, 2, 0.5);
    }

    auto* ddp = dynamic_cast<DdpStrategy*>(&acc.strategy());
    const auto& params = acc.prepared_parameters();
    std::vector<void*> grad_ptrs;
    bool views = true;
    if (ddp) {
      for (const auto& p : params) grad_ptrs.push_back(p.grad().data_ptr());
      for (std::size_t i = 0; i < params.size(); ++i)
        views &= grad_ptrs[i] == ddp->grad_slot(0, i).data;
    }

    // The same synthetic dataset on every rank: 10 global batches of 4 per rank, the last
    // one 3 short (padded by wrapping around).
    const std::int64_t per_rank = 4, global = per_rank * world;
    const std::int64_t n = 10 * global - 3;
    torch::manual_seed(7);
    const torch::Tensor x = (cnn ? torch::randn({n, 1, 8, 8}) : torch::randn({n, 16})).to(dtype);
    const torch::Tensor y = torch::randint(10, {n}, torch::kLong);
    auto loader = acc.prepare_data_loader(
        x, y, {std::size_t(odd("batch_size") ? 2 : per_rank), true, 11, false});
    const SamplerOptions sampling{std::size_t(per_rank), true, 11, false};

    double norm_diff = 0;
    std::size_t steps = 0, boundary_errors = 0;
    for (std::uint64_t epoch = 0; epoch < 2; ++epoch) {
      loader.set_epoch(epoch);
      const auto all = test::global_batches(std::size_t(n), world, sampling, epoch);
      for (const auto& batch : loader) {
        const std::size_t b = batch.index;
        const bool boundary = (b + 1) % K == 0 || b + 1 == loader.size();

        // The reference: one process on the whole global batch. With BatchNorm it runs each
        // rank's part separately (DDP normalises with each rank's own batch statistics) and
        // keeps the running statistics rank 0's part produced (those DDP broadcasts).
        const std::vector<std::int64_t> rows(all[b].begin(), all[b].end());
        const auto idx = torch::tensor(rows, torch::kLong);
        const auto gx = x.index_select(0, idx), gy = y.index_select(0, idx);
        torch::Tensor ref_loss;
        std::vector<torch::Tensor> saved;  // rank 0's part's running statistics
        if (!cnn) {
          ref_loss = loss_of(reference, gx, gy);
        } else {
          ref_loss = torch::zeros({});
          const std::int64_t part = gx.size(0) / world;  // equal: padded at N > 1
          for (std::int64_t r = 0; r < world; ++r) {
            ref_loss = ref_loss + loss_of(reference, gx.narrow(0, r * part, part),
                                          gy.narrow(0, r * part, part));
            if (r == 0)
              for (const auto& buf : reference.module().buffers()) saved.push_back(buf.clone());
          }
          ref_loss = ref_loss / double(world);
        }
        (ref_loss / double(K)).backward();
        if (!saved.empty()) {  // after backward: BatchNorm's backward holds the buffers
          torch::NoGradGuard no_grad;
          auto bufs = reference.module().buffers();
          for (std::size_t k = 0; k < bufs.size(); ++k) bufs[k].copy_(saved[k]);
        }

        // The accelerated loop, as a user writes it.
        opt->zero_grad();  // before the forward: a no-op while accumulating
        torch::Tensor loss;
        {
          auto autocast = acc.autocast();
          loss = loss_of(model, batch.data, batch.target);
        }
        const bool synced = acc.backward(loss);
        boundary_errors += synced != boundary;
        if (synced && max_norm > 0) {
          const double norm = acc.clip_grad_norm(max_norm);
          const double ref_norm =
              torch::nn::utils::clip_grad_norm_(reference.module().parameters(), max_norm);
          norm_diff = std::max(norm_diff, std::abs(norm - ref_norm));
        }
        opt->step();
        if (schedule && !opt->step_was_skipped()) schedule->step();
        steps += !opt->step_was_skipped();

        if (boundary) {
          ref_optimizer->step();
          ref_optimizer->zero_grad();
          if (ref_schedule) ref_schedule->step();
        }
      }
    }
    verdicts.check(boundary_errors == 0,
                   "backward synchronises exactly at the accumulation boundaries");

    if (ddp) {
      for (std::size_t i = 0; i < params.size(); ++i)
        views &= params[i].grad().data_ptr() == grad_ptrs[i] &&
                 grad_ptrs[i] == ddp->grad_slot(0, i).data;
      verdicts.check(views, "gradients stay views of the DDP buckets");
    } else {
      // ZeRO: the optimizer holds this rank's slices, and the parameters live in the flat buffer.
      auto& zero = dynamic_cast<ZeroStrategy&>(acc.strategy());
      std::size_t slice_elements = 0, optimizer_elements = 0;
      for (const ParamSegment& seg : zero.segments()) slice_elements += seg.values.count;
      for (const auto& group : opt->optimizer().param_groups())
        for (const auto& p : group.params()) optimizer_elements += std::size_t(p.numel());
      bool in_flat = true;
      for (std::size_t i = 0; i < params.size(); ++i)
        in_flat &= params[i].data_ptr() == zero.param_slot(i).data;
      verdicts.check(slice_elements == optimizer_elements && in_flat,
                     "the optimizer steps this rank's slices; parameters live in the flat buffers",
                     std::to_string(optimizer_elements) + " slice elements (" +
                         std::string(zero.name()) + ")");
    }

    // Bitwise the same state on every rank (parameters and, broadcast, the buffers).
    const torch::Tensor mine = flat_state(model.module(), true);
    const torch::Tensor everyone = acc.gather(mine.unsqueeze(0));
    verdicts.check(torch::equal(everyone, mine.unsqueeze(0).expand_as(everyone)),
                   "every rank holds the same parameters and buffers");

    char line[240];
    if (!bf16) {
      const double diff =
          (flat_state(model.module(), false) - flat_state(reference.module(), false))
              .abs()
              .max()
              .item<double>();
      const double buffer_diff =
          (flat_state(model.module(), true) - flat_state(reference.module(), true))
              .abs()
              .max()
              .item<double>();
      // The longest sum in a gradient: K micro-batches of the global batch (times the CNN's
      // 8 x 8 output positions, BatchNorm's sums are shorter), then world partial sums, and
      // two more roundings of each term's 1 / (rows K) scale. Its terms: randn inputs
      // (|x| < 5), activations below 25, the softmax error summed over a batch mean at most
      // 2, weights below 1: a sum of magnitudes well under 100.
      const std::size_t longest_sum = K * std::size_t(global) * (cnn ? 64 : 1) + world + 2;
      std::size_t elements = 0;
      for (const auto& p : model.module().parameters()) elements += std::size_t(p.numel());
      // Clipping: tolerance.hpp's ClippedRun, every element's S at most 100.
      const double magnitude =
          max_norm > 0 ? test::clipped_magnitude({.max_magnitude = 100,
                                                  .norm_magnitude = 100 * std::sqrt(elements),
                                                  .clip = max_norm,
                                                  .elements = elements,
                                                  .longest_sum = longest_sum})
                       : 100;
      const double lr = initial_lr;  // the weights' group's, the larger; the schedule lowers it
      const bool adam = optimizer_kind == "adam" || optimizer_kind == "adamw";
      const double limit = adam ? test::adam_reordering_bound({.lr = lr,
                                                               .steps = int(steps),
                                                               .longest_sum = longest_sum,
                                                               .magnitude = magnitude})
                                : test::reordering_bound({.lr = lr,
                                                          .momentum = 0.9,
                                                          .steps = int(steps),
                                                          .longest_sum = longest_sum,
                                                          .magnitude = magnitude});
      // BatchNorm's running statistics follow the batch statistics, which a weight difference
      // reaches through 9 inputs below 5 (the mean) and, doubled, outputs below 25 (the
      // variance): at most 2 * 25 * 9 * 5 times the weights' difference.
      const double buffer_limit = 2 * 25 * 9 * 5 * limit;
      const double norm_limit =
          test::norm_reordering_bound({.norm_magnitude = 100 * std::sqrt(elements),
                                       .elements = elements,
                                       .longest_sum = longest_sum});
      std::snprintf(line, sizeof line,
                    "max |diff| %.3g (limit %.3g), buffers %.3g (limit %.3g), clip norm diff %.3g "
                    "(limit %.3g) (%zu optimizer steps)",
                    diff, limit, buffer_diff, buffer_limit, norm_diff, norm_limit, steps);
      verdicts.check(diff <= limit && buffer_diff <= buffer_limit && norm_diff <= norm_limit,
                     "training equals one process", line);
    }
    if (!dump.empty() && rank == 0) {
      const torch::Tensor values = flat_state(model.module(), false).contiguous();
      std::FILE* out = std::fopen(dump.c_str(), "wb");
      const bool written =
          out && std::fwrite(values.data_ptr<double>(), sizeof(double), std::size_t(values.numel()),
                             out) == std::size_t(values.numel());
      if (out) std::fclose(out);
      verdicts.check(written, "parameters written", dump);
    }
    if (checkpointed && model.mlp) {
      const int recomputed = model.mlp->block_runs - model.mlp->forwards;
      verdicts.check(recomputed > 0, "checkpointed block recomputed in backward",
                     std::to_string(recomputed) + " recomputes (of " +
                         std::to_string(model.mlp->forwards) + " forwards)");
    }
    if (schedule) {
      const double lr = opt->optimizer().param_groups()[0].options().get_lr();
      const double ref_lr = ref_optimizer->param_groups()[0].options().get_lr();
      std::snprintf(line, sizeof line, "lr %.6g, one process %.6g", lr, ref_lr);
      verdicts.check(lr == ref_lr && lr < initial_lr,
                     "the LR scheduler on the wrapped optimizer follows one process", line);
    }

    // Evaluation: predictions and sample ids of an unshuffled epoch, gathered for metrics.
    const std::int64_t eval_n = 103;
    torch::manual_seed(8);
    const torch::Tensor ex =
        (cnn ? torch::randn({eval_n, 1, 8, 8}) : torch::randn({eval_n, 16})).to(dtype);
    auto eval = acc.prepare_data_loader(ex, torch::arange(eval_n), {5, false, 0, false});
    model.module().eval();
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> ids, predictions;
    for (const auto& batch : eval) {
      predictions.push_back(
          acc.gather_for_metrics(model.forward(batch.data).argmax(1), eval, batch.index));
      ids.push_back(acc.gather_for_metrics(batch.target, eval, batch.index));
    }
    const torch::Tensor all_ids = torch::cat(ids);
    const auto distinct = std::get<0>(at::_unique(all_ids)).numel();
    verdicts.check(all_ids.numel() == eval_n && distinct == eval_n &&
                       torch::cat(predictions).numel() == eval_n,
                   "gather_for_metrics yields every sample once",
                   std::to_string(all_ids.numel()) + " samples, " + std::to_string(distinct) +
                       " distinct, of " + std::to_string(eval_n));
    acc.wait_for_everyone();
  } catch (const RankMismatchError& e) {
    std::printf("mismatch: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_worker: %s\n", e.what());
    return 2;
  }
  return verdicts.exit_code();
}
