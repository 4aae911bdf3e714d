// One rank of the LibTorch ZeRO-3 checks (torch_zero3_test): the tiny transformer
// (tests/support/tiny_transformer.hpp) in fp64, its units as --units says, trained for
// --steps optimizer steps of --accumulation micro-batches of 12 sequences (this rank's
// contiguous share of each), clipped with acc.clip_grad_norm, by AdamW with two param groups
// (matrices decayed; embeddings, LayerNorms and biases not). The reference, one process on the
// same global micro-batches, trains beside it (rank 0). Checks, one "ok ..." line each:
//  - the parameters (get_state_dict: gathered unit by unit under ZeRO-3) equal the
//    reference's within the bound the test passes (--limit), and every rank's are the same;
//  - under ZeRO-3, between steps the model's tensors hold only the persistent parameters, the
//    optimizer state is twice this rank's slices, and at most two units besides the root
//    were gathered at once (the strategy's slots).
//   torch_zero3_worker --units root|automatic|wrapper|sequential [--steps N] [--dropout P]
//                      [--dump FILE] [--limit L] [--misuse order|outside|direct] [--float]
//                      [--checkpoint DIR --save_at STEP] [--resume DIR]
// The strategy is the config's (ACCEL_DISTRIBUTED_TYPE, ACCEL_ZERO_STAGE ...). --dump writes
// rank 0's final parameters (doubles, module order). --misuse order: rank 1 runs the blocks
// in another order (every rank must fail naming both units); outside: a block called outside
// the prepared model's call; direct: the model's own forward (refused, naming the first
// parameter it uses). --float trains in fp32 (the optimizer state of a checkpoint reshards as
// float);
// --checkpoint saves after optimizer step STEP, --resume loads and goes on from there (the
// reference trains from the start); DIR "project" is save_state() / load_state() without one
// (automatic_checkpoint_naming). A failure prints "error: ..." and exits 3.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "backends/zero/zero_strategy.hpp"
#include "tests/support/tiny_transformer.hpp"
#include "tests/support/worker.hpp"

using namespace accel;
using namespace accel::test;

namespace {

test::VerdictLog verdicts;

// One model in the form --units names, as the loop holds it.
struct Net {
  Transformer list{nullptr};
  torch::nn::Sequential seq{nullptr};
  torch::nn::Module& module() { return list ? static_cast<torch::nn::Module&>(*list) : *seq; }
};

Net make_net(Units units, const TransformerShape& shape, std::uint64_t seed,
             torch::ScalarType dtype) {
  torch::manual_seed(seed);
  Net n;
  if (units == Units::sequential)
    n.seq = sequential_transformer(shape);
  else
    n.list = Transformer(shape, units == Units::wrapper);
  n.module().to(dtype);
  return n;
}

// The parameters, the tied weight once (as the optimizer and the accelerator hold them).
std::vector<torch::Tensor> unique_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  std::set<const void*> seen;
  for (const auto& p : m.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

std::unique_ptr<torch::optim::AdamW> make_adamw(torch::nn::Module& m) {
  std::vector<torch::Tensor> decayed, plain;
  // Decayed: the blocks' matrices; not: embeddings, LayerNorms, biases.
  std::set<const void*> seen;  // the tied weight once
  for (const auto& item : m.named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    const bool matrix = item.value().dim() > 1 && item.key().find("embed") == std::string::npos;
    (matrix ? decayed : plain).push_back(item.value());
  }
  using torch::optim::AdamWOptions;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  // eps 1e-5: Adam's sensitivity to a gradient difference is 1 / eps (tolerance.hpp).
  groups.emplace_back(
      decayed, std::make_unique<AdamWOptions>(AdamWOptions(0.01).weight_decay(0.1).eps(1e-5)));
  groups.emplace_back(
      plain, std::make_unique<AdamWOptions>(AdamWOptions(0.005).weight_decay(0.0).eps(1e-5)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), AdamWOptions());
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

torch::Tensor flat(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::vector<torch::Tensor> parts;
  for (const auto& [name, t] : state) parts.push_back(t.detach().flatten().to(torch::kDouble));
  return torch::cat(parts);
}

torch::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : m.named_parameters()) state.emplace_back(item.key(), item.value());
  return flat(state);
}

// Rank 0 writes the values (doubles) to `path`.
void write_doubles(const std::string& path, const torch::Tensor& values, int rank) {
  if (rank != 0) return;
  std::FILE* out = std::fopen(path.c_str(), "wb");
  const bool written =
      out && std::fwrite(values.data_ptr<double>(), sizeof(double), std::size_t(values.numel()),
                         out) == std::size_t(values.numel());
  if (out) std::fclose(out);
  verdicts.check(written, "parameters written", path);
}

// One step moves (as the Communicator counts, (n-1)/n of each all-gather's output and
// reduce-scatter's input): every gradient once, the persistent parameters once (after the
// step), per micro-batch the root once (kept to its backward) and the other units twice (once
// with reshard_after_forward false). Plus the clip norm's 8 bytes.
void report_bus_bytes(const std::vector<ParamRef>& refs, int world, int K, std::size_t threshold,
                      std::uint64_t last_step_bytes) {
  const char* keep = std::getenv("ACCEL_RESHARD_AFTER_FORWARD");
  const double unit_passes = keep != nullptr && std::string(keep) == "false" ? 1 : 2;
  double all = 0, kept = 0, root = 0, others = 0;
  for (const ParamRef& r : refs) {
    const double bytes = double(r.data.bytes());
    all += bytes;
    if (r.data.count < threshold)
      kept += bytes;
    else
      (r.unit == 0 ? root : others) += bytes;
  }
  const double expected =
      double(world - 1) / world * (all + kept + K * (root + unit_passes * others));
  char line[300];
  std::snprintf(line, sizeof line, "%llu, expected %.0f (%.2f x the parameters' bytes)",
                static_cast<unsigned long long>(last_step_bytes), expected,
                double(last_step_bytes) / all);
  verdicts.check(std::abs(double(last_step_bytes) - expected) <= 0.01 * expected,
                 "bus bytes of the last step", line);
}

}  // namespace

int main(int argc, char** argv) {
  const test::WorkerFlags flags(argc, argv);
  const Units units = flags.has("units") ? units_named(flags.text("units")) : Units::root;
  const int steps = int(flags.integer("steps", 20));
  const std::string dump = flags.text("dump"), misuse = flags.text("misuse");
  const std::string checkpoint = flags.text("checkpoint"), resume = flags.text("resume");
  const int save_at = int(flags.integer("save_at", -1));
  // fp32 for checkpoints (float optimizer state)
  const torch::ScalarType dtype = flags.has("float") ? torch::kFloat : torch::kDouble;
  const double limit = flags.real("limit", 0);
  TransformerShape shape;
  shape.dropout = flags.real("dropout", shape.dropout);
  torch::set_num_threads(1);
  AcceleratorOptions options;
  options.gradient_accumulation_steps = 4;
  options.zero.bucket_cap_bytes = 2048;  // several reduce-scatter buckets
  options.ddp.first_bucket_bytes = 1024;
  options.ddp.bucket_cap_bytes = 4096;
  if (units == Units::root) options.auto_wrap_policy = "NO_WRAP";  // the model is one unit
  try {
    TorchAccelerator acc(options);
    const int world = acc.num_processes(), rank = acc.process_index();
    const int K = acc.gradient_accumulation_steps();
    // Rank 1 starts from other values: prepare broadcasts rank 0's.
    Net net = make_net(units, shape, 100 + std::uint64_t(rank), dtype);
    Net reference = make_net(units, shape, 100, dtype);
    auto adamw = make_adamw(net.module());
    auto ref_adamw = make_adamw(reference.module());
    AcceleratedOptimizer* opt = nullptr;
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    std::function<std::vector<std::pair<std::string, at::Tensor>>()> state_dict;
    if (net.list) {
      auto prepared = acc.prepare(net.list, *adamw);
      opt = &prepared.second;
      forward = [model = prepared.first](const torch::Tensor& x) { return model(x); };
      state_dict = [&acc, model = prepared.first] { return acc.get_state_dict(model); };
    } else {
      auto prepared = acc.prepare(net.seq, *adamw);
      opt = &prepared.second;
      forward = [model = prepared.first](const torch::Tensor& x) { return model(x); };
      state_dict = [&acc, model = prepared.first] { return acc.get_state_dict(model); };
    }
    const auto ref_forward = [&](const torch::Tensor& x) {
      return reference.list ? reference.list->forward(x) : reference.seq->forward(x);
    };
    auto* zero = dynamic_cast<ZeroStrategy*>(&acc.strategy());
    const bool stage3 = zero != nullptr && zero->parameters_sharded();

    if (misuse == "outside") {  // a block called by itself, not through model(x)
      const torch::Tensor x = torch::zeros({2, shape.context, shape.width}, dtype);
      net.list->blocks[0]->as<ShardedUnitImpl<AttentionBlockImpl>>()->forward(x);
      verdicts.check(false, "a block ran outside the prepared call");
      return 1;
    }
    if (misuse == "direct") {  // the model's own forward, not the prepared call
      torch::NoGradGuard no_grad;
      net.list->forward(torch::zeros({2, shape.context}, torch::kLong));
      verdicts.check(false, "the model's forward ran on released parameters");
      return 1;
    }

    const std::int64_t global = 12, per_rank = global / world;
    torch::manual_seed(7);
    const std::int64_t micro_batches = std::int64_t(steps) * K;
    const torch::Tensor tokens =
        torch::randint(shape.vocab, {micro_batches * global, shape.context + 1}, torch::kLong);
    std::size_t synced_steps = 0;
    double max_gathered = 0;
    std::int64_t first_micro = 0;  // a resumed run starts after the checkpoint's steps
    if (!resume.empty()) {
      if (resume == "project")  // the newest of project_dir/checkpoints (Accelerate's naming)
        acc.load_state();
      else
        acc.load_state(resume);
      synced_steps = acc.step();
      first_micro = std::int64_t(synced_steps) * K;
    }
    std::uint64_t last_step_bytes = 0;  // the Communicator's bus bytes over the last step
    for (std::int64_t m = 0; m < micro_batches; ++m) {
      if (m == micro_batches - K) last_step_bytes = acc.comm().bus_bytes();
      const torch::Tensor batch = tokens.narrow(0, m * global, global);
      const torch::Tensor ids = batch.narrow(1, 0, shape.context);
      const torch::Tensor next = batch.narrow(1, 1, shape.context);
      // The reference on the whole global micro-batch.
      (loss_of(ref_forward(ids), next) / double(K)).backward();
      if ((m + 1) % K == 0) {
        torch::nn::utils::clip_grad_norm_(unique_parameters(reference.module()), 1.0);
        ref_adamw->step();
        ref_adamw->zero_grad();
      }
      if (m < first_micro) continue;
      // The accelerated loop on this rank's share.
      opt->zero_grad();
      const torch::Tensor mine = ids.narrow(0, rank * per_rank, per_rank);
      const torch::Tensor targets = next.narrow(0, rank * per_rank, per_rank);
      torch::Tensor out;
      if (misuse == "order" && rank == 1 && net.list) {
        // The blocks in reverse: another unit order than rank 0's.
        auto root = acc.root_forward(*net.list);
        torch::Tensor x = net.list->embed(mine);
        for (std::size_t b = net.list->blocks->size(); b-- > 0;)
          x = net.list->blocks[b]->as<ShardedUnitImpl<AttentionBlockImpl>>()->forward(x);
        out = net.list->head(x);
      } else {
        out = forward(mine);
      }
      const bool synced = acc.backward(loss_of(out, targets));
      if (synced) {
        acc.clip_grad_norm(1.0);
        ++synced_steps;
        if (stage3) max_gathered = std::max(max_gathered, double(zero->gathered_parameter_bytes()));
      }
      opt->step();
      if (synced && int(synced_steps) == save_at) {
        if (checkpoint == "project")
          acc.print("saved " + acc.save_state());
        else
          acc.save_state(checkpoint);
        if (!dump.empty()) write_doubles(dump + ".at_save", flat(state_dict()), rank);
      }
    }
    last_step_bytes = acc.comm().bus_bytes() - last_step_bytes;
    int block_runs = 0;
    for (const auto& m : net.module().modules())
      if (const auto* block = dynamic_cast<const AttentionBlockImpl*>(m.get()))
        block_runs += block->runs;
    std::printf("block forwards %d for %lld micro-batches\n", block_runs,
                static_cast<long long>(micro_batches - first_micro));
    verdicts.check(synced_steps == std::size_t(steps), "every step synchronised",
                   std::to_string(synced_steps) + " optimizer steps of " + std::to_string(K) +
                       " micro-batches");

    if (zero != nullptr) {
      std::size_t owned = 0;
      for (const ParamSegment& s : zero->segments()) owned += s.values.count;
      std::printf("ZeRO: gradient replicas %d, this rank steps %zu elements\n",
                  zero->gradient_replicas(), owned);
    }
    if (stage3) {
      // Between steps the model's tensors hold the persistent parameters only (fewer elements
      // than the threshold), the optimizer state is twice this rank's slices.
      const std::size_t threshold =
          std::stoul(std::getenv("ACCEL_ZERO3_PARAM_PERSISTENCE_THRESHOLD")
                         ? std::getenv("ACCEL_ZERO3_PARAM_PERSISTENCE_THRESHOLD")
                         : "100000");
      std::size_t held = 0, persistent = 0, total = 0;
      for (const at::Tensor& p : acc.prepared_parameters()) {
        held += p.unsafeGetTensorImpl()->storage().nbytes();
        total += std::size_t(p.numel());
        if (std::size_t(p.numel()) < threshold) persistent += std::size_t(p.numel());
      }
      std::size_t slices = 0, state = 0;
      for (const ParamSegment& s : zero->segments()) slices += s.values.count;
      for (const auto& [key, st] : adamw->state()) {
        const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*st);
        state += std::size_t(adam.exp_avg().numel() + adam.exp_avg_sq().numel());
      }
      char line[300];
      std::snprintf(
          line, sizeof line,
          "the model's tensors hold %zu bytes (its %zu persistent elements), slices of "
          "%zu of %zu elements, optimizer state %zu elements, gathered storage %.0f bytes",
          held, persistent, slices, total, state, max_gathered);
      // Slices: 1/N of each flat buffer, padded to a multiple of N (under N per buffer); N the
      // ranks sharing them (HYBRID_SHARD: one machine's).
      const std::size_t shards = std::size_t(world / zero->gradient_replicas());
      verdicts.check(held == persistent * std::size_t(c10::elementSize(dtype)) &&
                         state == 2 * slices && slices <= total / shards + 2 * shards &&
                         slices >= total / shards,
                     "ZeRO-3 memory", line);
      std::printf("prefetch hits %llu\n", static_cast<unsigned long long>(zero->prefetch_hits()));
      // HYBRID_SHARD's collectives run on its two groups, which acc.comm() does not count.
      if (zero->gradient_replicas() > 1)
        std::printf("bus bytes: HYBRID_SHARD (the machine's and the replicas' groups)\n");
      else
        report_bus_bytes(zero->params(), world, K, threshold, last_step_bytes);
    }

    // The whole parameters, as get_state_dict gathers them (every rank calls it).
    const torch::Tensor mine = flat(state_dict());
    const torch::Tensor everyone = acc.gather(mine.unsqueeze(0));
    verdicts.check(torch::equal(everyone, mine.unsqueeze(0).expand_as(everyone)),
                   "every rank's get_state_dict is the same");
    const double diff = (mine - flat_parameters(reference.module())).abs().max().item<double>();
    char line[200];
    std::snprintf(line, sizeof line, "max |diff| %.3g (limit %.3g)", diff, limit);
    // Dropout masks differ by rank; no --limit: fp32 (no bound, tolerance.hpp).
    if (shape.dropout == 0 && limit > 0)
      verdicts.check(rank != 0 || diff <= limit, "training equals one process", line);
    if (!dump.empty() && rank == 0) {
      std::FILE* out = std::fopen(dump.c_str(), "wb");
      const bool written =
          out && std::fwrite(mine.data_ptr<double>(), sizeof(double), std::size_t(mine.numel()),
                             out) == std::size_t(mine.numel());
      if (out) std::fclose(out);
      verdicts.check(written, "parameters written", dump);
    }
    // After training: evaluation without grad mode (each unit gathered, released again).
    {
      torch::NoGradGuard no_grad;
      const torch::Tensor ids = tokens.narrow(0, 0, per_rank).narrow(1, 0, shape.context);
      const double eval_diff = (forward(ids) - ref_forward(ids)).abs().max().item<double>();
      if (shape.dropout == 0 && limit > 0)
        verdicts.check(eval_diff <= 100 * limit + 1e-12,
                       "evaluation under no_grad matches the reference");
    }
    return verdicts.exit_code();
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    return 3;
  }
}
