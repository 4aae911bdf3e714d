#pragma once
// A transformer-style LibTorch model for the ZeRO-3 checks, in the three forms a model takes
// units in (accelerate/torch/zero3/sharded_unit.hpp): token embedding plus learned positions,
// pre-LayerNorm blocks (attention written with matmul and softmax, causal; a GELU MLP),
// a final LayerNorm and the output projection tied to the embedding.
//  - Units::root: the blocks in a ModuleList, plain, under auto_wrap_policy NO_WRAP (the root
//    is the one unit);
//  - Units::automatic: the same model under TRANSFORMER_BASED_WRAP (the ModuleList's children
//    units, gathered when their parameters are first used);
//  - Units::wrapper: the same with each block a ShardedUnit (the ModuleList's children units);
//  - Units::sequential: a torch::nn::Sequential of embedding, blocks and head (the children
//    units; the tied weight, in two of them, is the root's).
// The same seed builds the same parameters in every form.

#include <cmath>
#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "accelerate/torch/zero3/sharded_unit.hpp"

namespace accel::test {

enum class Units { root, automatic, wrapper, sequential };

inline Units units_named(const std::string& name) {
  if (name == "automatic") return Units::automatic;
  if (name == "wrapper") return Units::wrapper;
  if (name == "sequential") return Units::sequential;
  return Units::root;
}

struct TransformerShape {
  std::int64_t vocab = 32, context = 6, width = 16, hidden = 32, blocks = 3;
  double dropout = 0;
};

struct AttentionBlockImpl : torch::nn::Module {
  AttentionBlockImpl(std::int64_t width, std::int64_t hidden, double dropout)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        q(register_module("q", torch::nn::Linear(width, width))),
        k(register_module("k", torch::nn::Linear(width, width))),
        v(register_module("v", torch::nn::Linear(width, width))),
        o(register_module("o", torch::nn::Linear(width, width))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc1(register_module("fc1", torch::nn::Linear(width, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, width))),
        drop(register_module("drop", torch::nn::Dropout(dropout))) {}

  // x: [batch, context, width]
  torch::Tensor forward(const torch::Tensor& x) {
    ++runs;  // a recompute (activation checkpointing) counts again
    const torch::Tensor h = ln1(x);
    const std::int64_t t = x.size(1);
    torch::Tensor scores = q(h).matmul(k(h).transpose(-2, -1)) / std::sqrt(double(x.size(2)));
    const torch::Tensor future = torch::ones({t, t}, torch::kBool).triu(1);
    scores = scores.masked_fill(future, -1e9);
    torch::Tensor y = x + drop(o(torch::softmax(scores, -1).matmul(v(h))));
    return y + drop(fc2(torch::gelu(fc1(ln2(y)))));
  }
  torch::nn::LayerNorm ln1;
  torch::nn::Linear q, k, v, o;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
  torch::nn::Dropout drop;
  int runs = 0;
};
TORCH_MODULE(AttentionBlock);

// Token ids [batch, context] to embeddings plus positions.
struct EmbedImpl : torch::nn::Module {
  EmbedImpl(const TransformerShape& s)
      : tokens(register_module("tokens", torch::nn::Embedding(s.vocab, s.width))),
        positions(register_parameter("positions", torch::randn({s.context, s.width}) * 0.1)) {}
  torch::Tensor forward(const torch::Tensor& ids) {
    return tokens(ids) + positions.narrow(0, 0, ids.size(1));
  }
  torch::nn::Embedding tokens;
  torch::Tensor positions;
};
TORCH_MODULE(Embed);

// Final LayerNorm and the projection onto the vocabulary by the embedding's own weight.
struct TiedHeadImpl : torch::nn::Module {
  TiedHeadImpl(std::int64_t width, torch::Tensor embedding)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        weight(register_parameter("weight", embedding)) {}
  torch::Tensor forward(const torch::Tensor& x) { return ln(x).matmul(weight.t()); }
  torch::nn::LayerNorm ln;
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl(const TransformerShape& s, bool wrapped) : wrapped(wrapped) {
    embed = register_module("embed", Embed(s));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (std::int64_t b = 0; b < s.blocks; ++b) {
      if (wrapped)
        blocks->push_back(ShardedUnit<AttentionBlockImpl>(s.width, s.hidden, s.dropout));
      else
        blocks->push_back(AttentionBlock(s.width, s.hidden, s.dropout));
    }
    head = register_module("head", TiedHead(s.width, embed->tokens->weight));
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    torch::Tensor x = embed(ids);
    for (const auto& block : *blocks)
      x = wrapped ? block->as<ShardedUnitImpl<AttentionBlockImpl>>()->forward(x)
                  : block->as<AttentionBlockImpl>()->forward(x);
    return head(x);
  }
  bool wrapped;
  Embed embed{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  TiedHead head{nullptr};
};
TORCH_MODULE(Transformer);

inline torch::nn::Sequential sequential_transformer(const TransformerShape& s) {
  torch::nn::Sequential seq;
  Embed embed(s);
  seq->push_back("embed", embed);
  for (std::int64_t b = 0; b < s.blocks; ++b)
    seq->push_back("block" + std::to_string(b), AttentionBlock(s.width, s.hidden, s.dropout));
  seq->push_back("head", TiedHead(s.width, embed->tokens->weight));
  return seq;
}

}  // namespace accel::test
