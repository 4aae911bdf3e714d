// One rank of pipeline_test: an MLP of Linear and Tanh children trained with TorchPipeline, and
// beside it on every rank the same model trained by plain LibTorch on the whole global batch
// (its micro-batches accumulated, each loss over the global micro-batch count). Verdicts:
//   "the pieces cover the model"          bounds from 0 to the layer count, this stage's
//                                          chunks the pieces chunk * P + stage;
//   "the first loss is one process's"     step 0's returned mean loss, both from the same
//                                          parameters (2 gamma(D M + 2) of the sum, tolerance.hpp);
//   "pipeline training equals one process" this stage's parameters after --steps steps, within
//                                          the first-order bound of tests/support/tolerance.hpp.
//   pipeline_worker --stages P --microbatches M [--schedule S] [--chunks V] [--layers L]
//                   [--steps N] [--split uniform|parameters|first,names] [--vary_rows]
//                   [--from_config] [--max_grad_norm C] [--layer_specs] [--slow_first]
//                   [--fail_stage S --fail_step K --fail_how raise|kill|rows]
// --from_config: the pipeline settings from the config (accel launch --pipeline_parallel_size
// ...) through TorchPipeline(acc, model, optimizer); the flags above are then not given.
// --layer_specs: the model as LayerSpecs, each seeded (the reference builds them all); the
// verdict "a stage builds only its own layers" counts the builds (each layer once more for
// partition_method parameters: counting its parameters builds it).
// --slow_first: a first layer (an identity) that computes for ~1000x the others' time; with
// --split profile the verdict "the profile split puts the slow layer alone" checks stage 0.
// --max_grad_norm: the gradients clipped to C over all stages (the reference by
// clip_grad_norm_); the verdict "the gradient norm is one process's" compares the last step's.
// --vary_rows: step k's micro-batches have 2 + k rows (each step's activation shape is new).
// --fail_*: at step K, stage S's second forward raises (a layer that throws) or is SIGKILLed,
// or (rows) the last stage passes a target of half the rows; the model then has an identity
// layer after each child, so that every stage has one to fail in.
// fp64. Exit 0 when every verdict passed, 1 when one failed, 2 on an error.

#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/torch/pipeline/torch_pipeline.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

constexpr std::int64_t kWidth = 12, kOut = 3, kRowsPerMicro = 2;

// The failure a --fail_* run injects: armed on the failing stage at the failing step, it
// strikes at that rank's second forward through an identity layer.
struct Failure {
  std::string how;  // "", raise, kill, rows
  bool armed = false;
  int forwards = 0;
};
Failure failure;

at::Tensor identity_or_fail(const at::Tensor& x) {
  if (failure.armed && ++failure.forwards == 2) {
    if (failure.how == "kill") std::raise(SIGKILL);
    if (failure.how == "raise") throw std::runtime_error("a layer raised on purpose");
  }
  return x;
}

// An identity that first multiplies 256 x 256 matrices (~340 MFLOP: milliseconds, where the
// other layers take microseconds).
at::Tensor slow_identity(const at::Tensor& x) {
  at::Tensor a = torch::full({256, 256}, 1.0 / 256, torch::kDouble);
  for (int i = 0; i < 10; ++i) a = torch::mm(a, a);
  return x + 0 * a.sum();
}

// L children: Linear, Tanh, Linear, Tanh, ..., the last a Linear to kOut (seeded: the same on
// every rank and for the reference); with failure_layers an identity after each, with
// slow_first a slow identity before them.
torch::nn::Sequential make_model(int layers, bool failure_layers, bool slow_first) {
  torch::manual_seed(11);
  torch::nn::Sequential model;
  if (slow_first) model->push_back(torch::nn::Functional(slow_identity));
  for (int i = 0; i < layers; ++i) {
    if (i + 1 == layers)
      model->push_back(torch::nn::Linear(kWidth, kOut));
    else if (i % 2 == 0)
      model->push_back(torch::nn::Linear(kWidth, kWidth));
    else
      model->push_back(torch::nn::Tanh());
    if (failure_layers) model->push_back(torch::nn::Functional(identity_or_fail));
  }
  model->to(torch::kDouble);
  return model;
}

// The same layers as LayerSpecs, each built under a seed of its own (so any rank builds the
// same); builds[i] counts layer i's builds on this rank.
std::vector<int> builds;

torch::nn::AnyModule build_layer(int i, int layers) {
  ++builds[std::size_t(i)];
  torch::manual_seed(100 + i);
  torch::nn::AnyModule layer;
  if (i + 1 == layers)
    layer = torch::nn::AnyModule(torch::nn::Linear(kWidth, kOut));
  else if (i % 2 == 0)
    layer = torch::nn::AnyModule(torch::nn::Linear(kWidth, kWidth));
  else
    layer = torch::nn::AnyModule(torch::nn::Tanh());
  layer.ptr()->to(torch::kDouble);
  return layer;
}

std::vector<std::string> comma_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  try {
    const test::WorkerFlags flags(argc, argv);
    flags.only({"stages", "microbatches", "schedule", "chunks", "layers", "steps", "split",
                "vary_rows", "fail_stage", "fail_step", "fail_how", "from_config", "max_grad_norm",
                "layer_specs", "slow_first"});
    TorchAccelerator acc;
    test::VerdictLog verdicts(acc.process_index());
    const bool from_config = flags.has("from_config");
    pipeline::PipelineOptions options;
    options.pipeline_parallel_size = int(flags.integer("stages", 2));
    options.num_microbatches = int(flags.integer("microbatches", 4));
    options.pipeline_schedule = pipeline::parse_schedule(flags.text("schedule", "1F1B"));
    options.pipeline_chunks = int(flags.integer("chunks", 1));
    options.max_grad_norm = flags.real("max_grad_norm", 0);
    const std::string split = flags.text("split", "parameters");
    if (split == "uniform" || split == "parameters" || split == "profile")
      options.partition_method = pipeline::parse_partition_method(split);
    else
      options.split_points = comma_list(split);
    const int layers = int(flags.integer("layers", 9));
    const int steps = int(flags.integer("steps", 3));
    const bool vary_rows = flags.has("vary_rows");
    failure.how = flags.text("fail_how");
    const int fail_stage = int(flags.integer("fail_stage", -1));
    const int fail_step = int(flags.integer("fail_step", -1));
    const double lr = 0.05;

    const bool failure_layers = !failure.how.empty(), layer_specs = flags.has("layer_specs");
    const bool slow_first = flags.has("slow_first");
    torch::nn::Sequential model, reference;
    std::vector<pipeline::LayerSpec> specs;
    if (layer_specs) {
      builds.assign(std::size_t(layers), 0);
      for (int i = 0; i < layers; ++i)
        specs.push_back({"", [i, layers] { return build_layer(i, layers); }});
      for (int i = 0; i < layers; ++i) reference->push_back(specs[std::size_t(i)].build());
      builds.assign(std::size_t(layers), 0);
    } else {
      model = make_model(layers, failure_layers, slow_first);
      reference = make_model(layers, failure_layers, slow_first);
    }
    torch::optim::SGD reference_sgd(reference->parameters(), lr);
    std::optional<torch::optim::SGD> sgd;
    if (!layer_specs) sgd.emplace(model->parameters(), lr);
    if (from_config) options = acc.pipeline_options();
    const auto make_sgd = [lr](std::vector<at::Tensor> params) {
      return std::make_unique<torch::optim::SGD>(std::move(params), lr);
    };
    torch::manual_seed(7);
    const at::Tensor sample = torch::randn({kRowsPerMicro, kWidth}, torch::kDouble);
    TorchPipeline pipe = layer_specs   ? TorchPipeline(acc, specs, make_sgd, options, sample)
                         : from_config ? TorchPipeline(acc, model, *sgd, sample)
                                       : TorchPipeline(acc, model, *sgd, options, sample);
    const int p = pipe.num_stages(), d = pipe.data_parallel_size(), m = options.num_microbatches;

    // The pieces: every layer once, in order; this stage's chunks the pieces it should hold.
    const pipeline::PieceBounds& bounds = pipe.piece_bounds();
    bool cover = bounds.size() == std::size_t(p * options.pipeline_chunks + 1) &&
                 bounds.front() == 0 && bounds.back() == reference->size();
    for (std::size_t k = 0; cover && k + 1 < bounds.size(); ++k) cover = bounds[k] < bounds[k + 1];
    for (std::size_t c = 0; cover && c < pipe.chunks().size(); ++c) {
      const std::size_t v = c * std::size_t(p) + std::size_t(pipe.stage());
      cover = pipe.chunks()[c]->size() == bounds[v + 1] - bounds[v];
    }
    if (slow_first && options.partition_method == pipeline::PartitionMethod::profile) {
      const std::vector<double>& seconds = pipe.profiled_seconds();
      double rest = 0;
      for (std::size_t i = 1; i < seconds.size(); ++i) rest += seconds[i];
      char detail[200];
      std::snprintf(detail, sizeof detail,
                    "first piece ends at %zu; slow layer %.3g s, the rest %.3g s", bounds[1],
                    seconds.empty() ? 0.0 : seconds[0], rest);
      verdicts.check(bounds[1] == 1 && seconds.size() == reference->size() && seconds[0] > rest,
                     "the profile split puts the slow layer alone", detail);
    }
    if (layer_specs) {
      // Built here: this stage's layers, and every layer once more to count its parameters.
      const int counted = options.partition_method != pipeline::PartitionMethod::uniform &&
                                  options.split_points.empty()
                              ? 1
                              : 0;
      bool only_own = true;
      std::string built;
      for (int i = 0; i < layers; ++i) {
        bool own = false;
        for (std::size_t c = 0; c < pipe.chunks().size(); ++c) {
          const std::size_t v = c * std::size_t(p) + std::size_t(pipe.stage());
          own = own || (std::size_t(i) >= bounds[v] && std::size_t(i) < bounds[v + 1]);
        }
        only_own = only_own && builds[std::size_t(i)] == counted + (own ? 1 : 0);
        built += (built.empty() ? "" : " ") + std::to_string(builds[std::size_t(i)]);
      }
      verdicts.check(only_own, "a stage builds only its own layers", "builds per layer: " + built);
    }
    std::string bounds_text;
    for (std::size_t b : bounds)
      bounds_text += (bounds_text.empty() ? "" : " ") + std::to_string(b);
    verdicts.check(cover, "the pieces cover the model", bounds_text);

    const auto loss_fn = [](const at::Tensor& out, const at::Tensor& y) {
      return torch::mse_loss(out, y);
    };
    double first_loss = 0, first_reference = 0, first_terms = 0, reference_norm = 0;
    std::int64_t most_rows = kRowsPerMicro;  // per micro-batch, over the steps
    for (int step = 0; step < steps; ++step) {
      const std::int64_t micro_rows = kRowsPerMicro + (vary_rows ? step : 0);
      most_rows = std::max(most_rows, micro_rows);
      const std::int64_t replica_rows = std::int64_t(m) * micro_rows;
      const std::int64_t global_rows = std::int64_t(d) * replica_rows;
      failure.armed = pipe.stage() == fail_stage && step == fail_step;
      torch::manual_seed(1000 + step);
      const at::Tensor x = torch::randn({global_rows, kWidth}, torch::kDouble);
      const at::Tensor y = torch::randn({global_rows, kOut}, torch::kDouble);
      const std::int64_t mine = std::int64_t(pipe.data_parallel_rank()) * replica_rows;
      // (rows: the last stage's target has half the rows the first stage's input has.)
      const std::int64_t target_rows =
          failure.armed && failure.how == "rows" ? replica_rows / 2 : replica_rows;
      const double loss =
          pipe.step(x.narrow(0, mine, replica_rows), y.narrow(0, mine, target_rows), loss_fn);
      failure.armed = false;  // (the reference's forwards below go through the same layers)
      // The reference: the replicas' micro-batches in order, each loss over D M.
      double reference_loss = 0, terms = 0;
      for (int r = 0; r < d * m; ++r) {
        const at::Tensor l = loss_fn(reference->forward(x.narrow(0, r * micro_rows, micro_rows)),
                                     y.narrow(0, r * micro_rows, micro_rows));
        (l / double(d * m)).backward();
        reference_loss += l.item<double>() / double(d * m);
        terms += std::abs(l.item<double>());
      }
      if (options.max_grad_norm > 0)
        reference_norm =
            torch::nn::utils::clip_grad_norm_(reference->parameters(), options.max_grad_norm);
      reference_sgd.step();
      reference_sgd.zero_grad();
      if (step == 0) {
        first_loss = loss;
        first_reference = reference_loss;
        first_terms = terms;
      }
    }
    const double loss_bound =
        2 * test::gamma_n(std::size_t(d * m + 2), test::kUnitRoundoffF64) * first_terms;
    char line[200];
    std::snprintf(line, sizeof line, "%.17g vs %.17g (bound %.3g)", first_loss, first_reference,
                  loss_bound);
    verdicts.check(std::abs(first_loss - first_reference) <= loss_bound,
                   "the first loss is one process's", line);

    // This stage's parameters against the reference's same layers.
    double diff = 0;
    const auto reference_children = reference->named_children();
    for (std::size_t c = 0; c < pipe.chunks().size(); ++c) {
      const std::size_t v = c * std::size_t(p) + std::size_t(pipe.stage());
      const auto children = pipe.chunks()[c]->children();
      for (std::size_t i = bounds[v]; i < bounds[v + 1]; ++i) {
        const auto mine = children[i - bounds[v]]->parameters();
        const auto theirs = reference_children[i].value()->parameters();
        for (std::size_t k = 0; k < mine.size(); ++k)
          diff = std::max(diff, (mine[k] - theirs[k]).abs().max().item<double>());
      }
    }
    // A gradient element sums D M micro-batches of kRowsPerMicro rows, then the replicas'
    // average (D terms) and the 1 / M and 1 / D scalings: D M rows + D + 2 terms. Their
    // magnitudes: inputs |x| < 6 (randn), tanh below 1, the MSE error below 2 (|y| < 6, outputs
    // below 1 + the bias) over the rows and outputs of a micro-batch: a sum well under 100.
    const std::size_t longest_sum =
        std::size_t(d * m) * std::size_t(most_rows) + std::size_t(d) + 2;
    std::size_t elements = 0;
    for (const at::Tensor& t : reference->parameters()) elements += std::size_t(t.numel());
    // Clipping: tolerance.hpp's ClippedRun, every element's S at most 100.
    const double magnitude =
        options.max_grad_norm > 0
            ? test::clipped_magnitude({.max_magnitude = 100,
                                       .norm_magnitude = 100 * std::sqrt(elements),
                                       .clip = options.max_grad_norm,
                                       .elements = elements,
                                       .longest_sum = longest_sum})
            : 100;
    const double limit = test::reordering_bound(
        {.lr = lr, .steps = steps, .longest_sum = longest_sum, .magnitude = magnitude});
    std::snprintf(line, sizeof line,
                  "stage %d of %d, replica %d of %d: max |diff| %.3g (limit %.3g)", pipe.stage(), p,
                  pipe.data_parallel_rank(), d, diff, limit);
    verdicts.check(diff <= limit, "pipeline training equals one process", line);
    if (options.max_grad_norm > 0) {
      const double norm_limit =
          test::norm_reordering_bound({.norm_magnitude = 100 * std::sqrt(elements),
                                       .elements = elements,
                                       .longest_sum = longest_sum});
      std::snprintf(line, sizeof line, "%.17g vs %.17g (limit %.3g)", pipe.last_grad_norm(),
                    reference_norm, norm_limit);
      verdicts.check(std::abs(pipe.last_grad_norm() - reference_norm) <= norm_limit &&
                         reference_norm > options.max_grad_norm,
                     "the gradient norm is one process's", line);
    }
    return verdicts.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_worker: %s\n", e.what());
    return 2;
  }
}
