// The Dataset form of TorchAccelerator::prepare_data_loader (dataset_loader.hpp): in this
// process (the world of one) it is LibTorch's own loop, bit for bit, with Normalize, a random
// per-sample transform, Stack and workers; over real processes (torch_data_worker does the
// checking) DDP at 2 and 4 ranks equals one process on the global batch, each rank reads only
// its own samples from disk, even_batches, gather_for_metrics, a kept DistributedSampler and a
// token stream split between the processes.

#include <torch/torch.h>
// LibTorch's logging header defines a CHECK of its own (fatal, uncounted); doctest's is meant.
#undef CHECK
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/disk_dataset.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;
namespace samplers = torch::data::samplers;

namespace {

AcceleratorOptions local_options(int accumulation = 1) {
  AcceleratorOptions options;
  options.communicator = "local";
  options.gradient_accumulation_steps = accumulation;
  return options;
}

// What a loop saw and where it ended.
struct Trace {
  std::vector<torch::Tensor> data, target;
  torch::Tensor parameters;
  void see(const torch::data::Example<>& batch) {
    data.push_back(batch.data.clone());
    target.push_back(batch.target.clone());
  }
};

void check_same(const Trace& plain, const Trace& accelerated) {
  REQUIRE(plain.data.size() == accelerated.data.size());
  for (std::size_t b = 0; b < plain.data.size(); ++b) {
    CAPTURE(b);
    CHECK(torch::equal(plain.data[b], accelerated.data[b]));
    CHECK(torch::equal(plain.target[b], accelerated.target[b]));
  }
  CHECK(torch::equal(plain.parameters, accelerated.parameters));
}

constexpr int kEpochs = 2;

// The plain LibTorch loop.
template <typename Sampler, typename Dataset>
Trace train_plain(Dataset dataset, torch::data::DataLoaderOptions options) {
  auto net = disk_mlp();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::manual_seed(5);
  auto loader = torch::data::make_data_loader<Sampler>(std::move(dataset), options);
  Trace trace;
  for (int epoch = 0; epoch < kEpochs; ++epoch)
    for (auto& batch : *loader) {
      trace.see(batch);
      sgd.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(net->forward(batch.data), batch.target);
      loss.backward();
      sgd.step();
    }
  trace.parameters = flat_parameters(*net);
  return trace;
}

// The same loop converted: prepare, prepare_data_loader, acc.backward.
template <typename Sampler, typename Dataset>
Trace train_accelerated(Dataset dataset, torch::data::DataLoaderOptions options) {
  TorchAccelerator acc(local_options());
  auto net = disk_mlp();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto [model, opt] = acc.prepare(net, sgd);
  torch::manual_seed(5);
  auto loader = acc.prepare_data_loader<Sampler>(std::move(dataset), options);
  Trace trace;
  for (int epoch = 0; epoch < kEpochs; ++epoch)
    for (const torch::data::Example<>& batch : *loader) {
      trace.see(batch);
      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      acc.backward(loss);
      opt.step();
    }
  CHECK(loader->size() == 7);  // 50 samples in batches of 8: the last one 2, not padded
  trace.parameters = flat_parameters(*net);
  return trace;
}

struct Samples {
  TempDir dir{"accel_torch_data"};
  std::size_t n;
  explicit Samples(std::size_t count) : n(count) { write_disk_samples(dir.path, n, 3); }
  DiskDataset dataset(std::shared_ptr<ReadLog> log = nullptr) const {
    return DiskDataset(dir.path.string(), n, std::move(log));
  }
};

// A dataset that cannot say how large it is.
struct Unsized : torch::data::datasets::Dataset<Unsized> {
  torch::data::Example<> get(std::size_t) override { return {torch::zeros({1}), torch::zeros({})}; }
  torch::optional<std::size_t> size() const override { return torch::nullopt; }
};

}  // namespace

TEST_CASE("world 1: Normalize, Stack and 2 workers give the plain LibTorch loop, bit for bit") {
  const Samples samples(50);  // batches of 8: the last one has 2
  const auto options = torch::data::DataLoaderOptions(8).workers(2);
  check_same(train_plain<samplers::RandomSampler>(normalised(samples.dataset()), options),
             train_accelerated<samplers::RandomSampler>(normalised(samples.dataset()), options));
}

TEST_CASE("world 1: a random per-sample transform draws what the plain loop draws") {
  // Workers 0: LibTorch's generator is then drawn in one order (with workers, the threads
  // race for it in the plain loop too).
  const Samples samples(50);
  const auto options = torch::data::DataLoaderOptions(8);
  check_same(train_plain<samplers::RandomSampler>(jittered(samples.dataset()), options),
             train_accelerated<samplers::RandomSampler>(jittered(samples.dataset()), options));
}

TEST_CASE("world 1: epochs count themselves, skipped batches are never read, the last syncs") {
  const Samples samples(10);
  auto log = std::make_shared<ReadLog>();
  TorchAccelerator acc(local_options(4));  // accumulation 4 > 3 batches: only the last syncs
  auto loader = acc.prepare_data_loader<samplers::SequentialSampler>(
      normalised(samples.dataset(log)), torch::data::DataLoaderOptions(4));
  CHECK(loader.size() == 3);
  std::vector<std::int64_t> rows, boundaries;
  for (auto& batch : *loader) {
    rows.push_back(batch.data.size(0));
    boundaries.push_back(acc.is_accumulation_boundary());
  }
  CHECK(rows == std::vector<std::int64_t>{4, 4, 2});
  CHECK(boundaries == std::vector<std::int64_t>{0, 0, 1});
  CHECK(loader.epoch() == 0);
  log->reads.clear();
  loader.skip_first_batches(2);  // resume at batch 2 of the next epoch
  CHECK(loader.batches_left() == 1);
  std::vector<std::size_t> indices;
  auto resumed = acc.progress(*loader, "resumed");  // its bar counts the 1 batch left
  for (auto& batch : resumed) {
    indices.push_back(loader.batch_index());
    CHECK(batch.data.size(0) == 2);
  }
  CHECK(loader.epoch() == 1);  // the finished pass moved it on
  CHECK(indices == std::vector<std::size_t>{2});
  CHECK(log->reads == std::vector<std::size_t>{8, 9});  // batches 0 and 1 were not read
  CHECK(resumed.bar().text().find("resumed 1/1 100%") == 0);
  CHECK(loader.batches_left() == 3);
  loader.set_epoch(7);
  std::size_t batches = 0;
  for (auto& batch : *loader) batches += batch.data.size(0) > 0;
  CHECK(batches == 3);
  CHECK(loader.epoch() == 7);
}

TEST_CASE("global_batch_size sets the batch of both loader forms, whatever the loop asked") {
  // At world 1 the whole global batch is the process's: 6, not the 4 the loop asks for.
  const Samples samples(10);
  AcceleratorOptions options = local_options();
  options.global_batch_size = 6;
  TorchAccelerator acc(options);
  auto loader = acc.prepare_data_loader<samplers::SequentialSampler>(
      normalised(samples.dataset(std::make_shared<ReadLog>())), torch::data::DataLoaderOptions(4));
  CHECK(loader.size() == 2);
  std::vector<std::int64_t> rows;
  for (auto& batch : *loader) rows.push_back(batch.data.size(0));
  CHECK(rows == std::vector<std::int64_t>{6, 4});
  auto tensors = acc.prepare_data_loader(torch::zeros({10, 3}), torch::zeros({10}),
                                         {.batch_size = 4, .shuffle = false});
  CHECK(tensors.size() == 2);
  CHECK(tensors.sampler().options().batch_size == 6);
}

TEST_CASE("a dataset without a size is refused, naming size()") {
  TorchAccelerator acc(local_options());
  CHECK_THROWS_WITH_AS(
      acc.prepare_data_loader(Unsized().map(torch::data::transforms::Stack<>()),
                              samplers::SequentialSampler(4), torch::data::DataLoaderOptions(2)),
      doctest::Contains("the dataset has no size()"), InvalidArgument);
}

TEST_CASE("DDP at 2 and 4 processes: a Dataset loop equals one process on the global batch") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    const auto result = run_ranks(world, "torch_data_worker", {});
    const Verdicts verdicts(result);
    {
      INFO(describe(result));
      REQUIRE(result.exit_code() == 0);
      CHECK_VERDICTS_PASSED(verdicts);
      for (const char* check :
           {"padded: training equals one process", "drop_last: training equals one process",
            "reads from disk only its own samples",
            "even_batches true: 5 batches of 3 on every rank",
            "even_batches false: nothing repeated", "gather_for_metrics yields every sample once",
            "RandomSampler: the ranks' batches are one permutation per epoch, reshuffled",
            "DistributedSequentialSampler kept: LibTorch's batches exactly",
            "token stream: the ranks' batchified shares are the global batch",
            "a custom sampler is refused"})
        CHECK_VERDICT(verdicts, check, world);
    }
    MESSAGE("padded: training equals one process: " << verdicts.detail(
                "padded: training equals one process", 0));
  }
}
