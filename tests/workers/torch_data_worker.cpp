// One rank of the Dataset loader checks, run by torch_data_test over real processes:
//  - training: a disk Dataset with Normalize and Stack, 2 workers, SequentialSampler, batches
//    of 3 per rank that do not divide it: one epoch padded (even_batches), one with
//    drop_last, equal in fp64 to one plain LibTorch process on the same global batches
//    (the padded epoch's plain loop reads the wrapped samples Accelerate pads with) within
//    the bound tests/support/tolerance.hpp derives;
//  - this rank read from disk exactly its own samples;
//  - even_batches true/false: the batches and samples each rank gets;
//  - gather_for_metrics over an epoch yields exactly the dataset's size;
//  - RandomSampler: the ranks' batches in rank order are one shared permutation per epoch,
//    another in the next epoch;
//  - a DistributedSequentialSampler the loop passes is kept (LibTorch's batches exactly);
//  - a token stream split between the processes and batchified per rank is the global batch's
//    batchify, column for column;
//  - a sampler of the loop's own making is refused at several processes.
// Prints one "ok ..." line per check; exits 1 on any failure.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/disk_dataset.hpp"
#include "tests/support/files.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;
using namespace accel::test;
namespace samplers = torch::data::samplers;
using torch::data::DataLoaderOptions;

namespace {

test::VerdictLog verdicts;

// The samples a padded epoch reads: sample i % n at position i (Accelerate's wrap-around).
class Wrapped : public torch::data::datasets::Dataset<Wrapped> {
 public:
  Wrapped(DiskDataset base, std::size_t n, std::size_t total)
      : base_(std::move(base)), n_(n), total_(total) {}
  torch::data::Example<> get(std::size_t i) override { return base_.get(i % n_); }
  torch::optional<std::size_t> size() const override { return total_; }

 private:
  DiskDataset base_;
  std::size_t n_, total_;
};

// One plain LibTorch epoch on the global batches.
template <typename Loader>
void plain_epoch(Loader& loader, torch::nn::Sequential& net, torch::optim::Optimizer& opt) {
  for (auto& batch : *loader) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target).backward();
    opt.step();
  }
}

auto ids(std::size_t n) {
  return torch::data::datasets::TensorDataset(torch::arange(std::int64_t(n)))
      .map(torch::data::transforms::Stack<torch::data::TensorExample>());
}

// A sampler of the loop's own: every other sample.
struct EveryOther : samplers::Sampler<> {
  std::size_t n, next_index = 0;
  explicit EveryOther(std::size_t size) : n(size) {}
  void reset(torch::optional<std::size_t>) override { next_index = 0; }
  torch::optional<std::vector<std::size_t>> next(std::size_t batch) override {
    std::vector<std::size_t> out;
    for (; out.size() < batch && next_index < n; next_index += 2) out.push_back(next_index);
    if (out.empty()) return torch::nullopt;
    return out;
  }
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}
};

}  // namespace

int main() {
  torch::set_num_threads(1);
  try {
    TorchAccelerator acc;
    const int world = acc.num_processes(), rank = acc.process_index();
    const std::size_t b = 3, g = b * std::size_t(world), n = 4 * g + 5;  // 5 left: not dividing
    const std::size_t padding = g - 5;
    TempDir dir("accel_torch_data_worker");
    write_disk_samples(dir.path, n, 3);
    auto log = std::make_shared<ReadLog>();
    const auto disk = [&](std::shared_ptr<ReadLog> l = nullptr) {
      return DiskDataset(dir.path.string(), n, std::move(l));
    };

    // ---- training against one plain process
    auto net = disk_mlp(), reference = disk_mlp();
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD ref_sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto [model, opt] = acc.prepare(net, sgd);
    auto padded = acc.prepare_data_loader<samplers::SequentialSampler>(
        normalised(disk(log)), DataLoaderOptions(b).workers(2));
    auto dropped = acc.prepare_data_loader<samplers::SequentialSampler>(
        normalised(disk()), DataLoaderOptions(b).drop_last(true));
    auto plain_padded = torch::data::make_data_loader<samplers::SequentialSampler>(
        normalised(Wrapped(disk(), n, n + padding)), DataLoaderOptions(g));
    auto plain_dropped = torch::data::make_data_loader<samplers::SequentialSampler>(
        normalised(disk()), DataLoaderOptions(g).drop_last(true));
    int steps = 0;
    const auto train = [&](auto& loader) {
      for (auto& batch : *loader) {
        opt.zero_grad();
        acc.backward(
            torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target));
        opt.step();
        ++steps;
      }
    };
    // The longest sum in a gradient: the global batch's rows, then world partial sums and two
    // roundings of the 1 / rows scale; its terms (normalised randn inputs below 5,
    // activations below 25, softmax errors at most 2, weights below 1) sum well under 100.
    const auto compare = [&](const char* what) {
      const double diff =
          (flat_parameters(*net) - flat_parameters(*reference)).abs().max().item<double>();
      const double limit = reordering_bound({.lr = 0.1,
                                             .momentum = 0.9,
                                             .steps = steps,
                                             .longest_sum = g + std::size_t(world) + 2,
                                             .magnitude = 100});
      char line[200];
      std::snprintf(line, sizeof line, "max |diff| %.3g (limit %.3g, %d steps)", diff, limit,
                    steps);
      verdicts.check(diff <= limit && steps > 0,
                     std::string(what) + ": training equals one process", line);
    };
    train(padded);
    plain_epoch(plain_padded, reference, ref_sgd);
    verdicts.check(padded.size() == 5 && steps == 5, "padded: 5 batches of 3 on every rank");
    compare("padded");
    train(dropped);
    plain_epoch(plain_dropped, reference, ref_sgd);
    compare("drop_last");

    // ---- what this rank read
    std::vector<std::size_t> reads = log->reads, expected;
    const ShardedSampler share(n, world, rank, {.batch_size = b, .shuffle = false});
    expected = share.indices();
    std::sort(reads.begin(), reads.end());
    std::sort(expected.begin(), expected.end());
    verdicts.check(
        reads == expected, "reads from disk only its own samples",
        std::to_string(reads.size()) + " samples of " + std::to_string(n) + " (2 workers)");

    // ---- even_batches
    const auto count = [&](bool even, std::size_t& batches) {
      auto loader = acc.prepare_data_loader<samplers::SequentialSampler>(
          ids(n), DataLoaderOptions(b), {.even_batches = even});
      std::int64_t samples = 0;
      batches = 0;
      for (auto& batch : *loader) samples += batch.data.size(0), ++batches;
      verdicts.check(batches == loader.size(), "the loader yields its size() batches");
      return samples;
    };
    std::size_t batches = 0;
    std::int64_t mine = count(true, batches);
    torch::Tensor total = acc.reduce(torch::tensor(mine), ReduceOp::sum);
    verdicts.check(
        batches == 5 && mine == 15 && total.item<std::int64_t>() == std::int64_t(n + padding),
        "even_batches true: 5 batches of 3 on every rank",
        "padded to " + std::to_string(total.item<std::int64_t>()));
    mine = count(false, batches);
    total = acc.reduce(torch::tensor(mine), ReduceOp::sum);
    const std::size_t tail = std::min<std::size_t>(b, 5 - std::min<std::size_t>(5, b * rank));
    verdicts.check(batches == 4 + (tail > 0) && mine == std::int64_t(4 * b + tail) &&
                       total.item<std::int64_t>() == std::int64_t(n),
                   "even_batches false: nothing repeated",
                   std::to_string(batches) + " batches, " + std::to_string(mine) +
                       " samples here, " + std::to_string(total.item<std::int64_t>()) + " in all");

    // ---- gather_for_metrics
    {
      auto loader =
          acc.prepare_data_loader<samplers::SequentialSampler>(ids(n), DataLoaderOptions(b));
      std::vector<torch::Tensor> seen;
      for (auto& batch : *loader) seen.push_back(acc.gather_for_metrics(batch.data, loader));
      const torch::Tensor all = torch::cat(seen);
      const auto distinct = std::get<0>(at::_unique(all)).numel();
      verdicts.check(all.numel() == std::int64_t(n) && distinct == std::int64_t(n),
                     "gather_for_metrics yields every sample once",
                     std::to_string(all.numel()) + " samples, " + std::to_string(distinct) +
                         " distinct, of " + std::to_string(n));
    }

    // ---- RandomSampler: one permutation shared by the ranks, another next epoch
    {
      auto loader = acc.prepare_data_loader(ids(n), DataLoaderOptions(b));
      std::vector<torch::Tensor> epochs;
      for (int e = 0; e < 2; ++e) {
        std::vector<torch::Tensor> seen;
        for (auto& batch : *loader) seen.push_back(acc.gather(batch.data));
        epochs.push_back(torch::cat(seen));
      }
      bool permutation = true;
      for (const auto& e : epochs)
        permutation &=
            std::get<0>(at::_unique(e.narrow(0, 0, std::int64_t(n)))).numel() == std::int64_t(n);
      verdicts.check(permutation && !torch::equal(epochs[0], epochs[1]) && loader.epoch() == 1,
                     "RandomSampler: the ranks' batches are one permutation per epoch, reshuffled");
    }

    // ---- a DistributedSequentialSampler the loop built is kept
    {
      const auto size_t_world = std::size_t(world), size_t_rank = std::size_t(rank);
      auto loader = acc.prepare_data_loader(
          ids(n), samplers::DistributedSequentialSampler(n, size_t_world, size_t_rank),
          DataLoaderOptions(b));
      auto plain = torch::data::make_data_loader(
          ids(n), samplers::DistributedSequentialSampler(n, size_t_world, size_t_rank),
          DataLoaderOptions(b));
      std::vector<torch::Tensor> ours, theirs;
      for (auto& batch : *loader) ours.push_back(batch.data);
      for (auto& batch : *plain) theirs.push_back(batch.data);
      verdicts.check(ours.size() == theirs.size() && ours.size() == loader.size() &&
                         torch::equal(torch::cat(ours), torch::cat(theirs)),
                     "DistributedSequentialSampler kept: LibTorch's batches exactly",
                     std::to_string(theirs.size()) + " batches");
    }

    // ---- a token stream: each rank its contiguous share, batchified as before
    {
      const std::int64_t bsz = 2, columns = bsz * world;
      torch::manual_seed(9);
      torch::Tensor tokens = torch::randint(50, {997}, torch::kLong);
      const auto batchify = [](torch::Tensor t, std::int64_t batch) {
        const std::int64_t rows = t.size(0) / batch;
        return t.narrow(0, 0, rows * batch).view({batch, rows}).t().contiguous();
      };
      const torch::Tensor global = batchify(tokens, columns);  // the plain loop's
      tokens = tokens.narrow(0, 0, tokens.size(0) / columns * columns);
      const torch::Tensor train = batchify(acc.split_between_processes(tokens), bsz);
      const torch::Tensor columns_of_all = acc.gather(train.t().contiguous()).t();
      verdicts.check(torch::equal(columns_of_all, global),
                     "token stream: the ranks' batchified shares are the global batch",
                     std::to_string(global.size(0)) + " x " + std::to_string(global.size(1)));
    }

    // ---- a sampler of the loop's own making
    try {
      acc.prepare_data_loader(ids(n), EveryOther(n), DataLoaderOptions(b));
      verdicts.check(false, "a custom sampler is refused at several processes");
    } catch (const InvalidArgument& e) {
      verdicts.check(std::string(e.what()).find("only a RandomSampler") != std::string::npos,
                     "a custom sampler is refused", e.what());
    }
    acc.wait_for_everyone();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_data_worker: %s\n", e.what());
    return 2;
  }
  return verdicts.exit_code();
}
