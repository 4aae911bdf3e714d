// An LSTM language model on a token stream cut into BPTT windows, the hidden state carried
// from window to window (detached), gradients clipped to a global norm, the learning rate
// halved every 8 steps (StepLR). lstm_lm_plain.cpp is the plain LibTorch program, lstm_lm.cpp
// the same converted by the README's recipe (programs_test counts the changed lines).

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/programs/program.hpp"

using namespace programs;

constexpr std::int64_t kVocab = 16, kHidden = 16, kBptt = 6;
using State = std::tuple<torch::Tensor, torch::Tensor>;

struct LanguageModelImpl : torch::nn::Module {
  LanguageModelImpl()
      : embed(register_module("embed", torch::nn::Embedding(kVocab, kHidden))),
        lstm(register_module("lstm", torch::nn::LSTM(kHidden, kHidden))),
        decoder(register_module("decoder", torch::nn::Linear(kHidden, kVocab))) {}
  // tokens: [time, batch]; returns the next-token logits [time * batch, vocab] and leaves the
  // LSTM's last state in `state`.
  torch::Tensor forward(const torch::Tensor& tokens, State& state) {
    auto [out, next] = lstm(embed(tokens), state);
    state = next;
    return decoder(out).view({-1, kVocab});
  }
  torch::nn::Embedding embed;
  torch::nn::LSTM lstm;
  torch::nn::Linear decoder;
};
TORCH_MODULE(LanguageModel);

// The stream as `batch` columns of consecutive tokens, one row per time step.
torch::Tensor batchify(const torch::Tensor& tokens, std::int64_t batch) {
  const std::int64_t rows = tokens.size(0) / batch;
  return tokens.narrow(0, 0, rows * batch).view({batch, rows}).t().contiguous();
}

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  accel::TorchAccelerator acc;
  torch::manual_seed(1);
  torch::Tensor ids = markov_tokens(2000, kVocab);
  ids = ids.narrow(0, 0, ids.size(0) - ids.size(0) % (flags.batch * acc.num_processes()));
  const torch::Tensor train = batchify(acc.split_between_processes(ids), flags.batch);
  LanguageModel net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(1.0));
  auto [model, optimizer] = acc.prepare(net, sgd);
  torch::optim::StepLR scheduler(optimizer, /*step_size=*/8, /*gamma=*/0.5);
  int step = 0;
  while (step < flags.steps) {
    State state = {torch::zeros({1, train.size(1), kHidden}),
                   torch::zeros({1, train.size(1), kHidden})};
    for (std::int64_t i = 0; i + kBptt < train.size(0) && step < flags.steps; i += kBptt) {
      state = {std::get<0>(state).detach(), std::get<1>(state).detach()};
      const torch::Tensor input = train.narrow(0, i, kBptt);
      const torch::Tensor target = train.narrow(0, i + 1, kBptt).reshape(-1);
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(input, state), target);
      acc.backward(loss);
      acc.clip_grad_norm(0.5);
      optimizer.step();
      scheduler.step();
      print_loss(step++, loss);
    }
  }
  dump_parameters(acc.get_state_dict(model), flags.dump);  // whole under ZeRO-3 too
}
