#pragma once
// SGD with momentum for the raw MLP, PyTorch's formulation (v = mu * v + g; w -= lr * v),
// with its velocity buffers as bytes so a checkpoint can keep them (Accelerator::register_state:
// a resumed run must continue with the very same momentum, or it drifts from the
// uninterrupted one).

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/raw_mlp/mlp.hpp"

namespace raw_mlp {

class MomentumSgd {
 public:
  MomentumSgd(Mlp& model, float momentum) : model_(model), momentum_(momentum) {
    for (const Layer& l : model.layers()) {
      velocity_.emplace_back(l.weight.size(), 0.0f);
      velocity_.emplace_back(l.bias.size(), 0.0f);
    }
  }

  void step(float lr) {
    std::size_t k = 0;
    for (Layer& l : model_.layers()) {
      update(l.weight, l.weight_grad, velocity_[k++], lr);
      update(l.bias, l.bias_grad, velocity_[k++], lr);
    }
  }

  std::string save() const {
    std::string out;
    for (const auto& v : velocity_)
      out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    return out;
  }

  // Checks the size before changing anything.
  void load(const std::string& bytes) {
    std::size_t total = 0;
    for (const auto& v : velocity_) total += v.size() * sizeof(float);
    if (bytes.size() != total)
      throw std::runtime_error("optimizer state has " + std::to_string(bytes.size()) +
                               " bytes, this model needs " + std::to_string(total));
    std::size_t at = 0;
    for (auto& v : velocity_) {
      std::memcpy(v.data(), bytes.data() + at, v.size() * sizeof(float));
      at += v.size() * sizeof(float);
    }
  }

 private:
  void update(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& v, float lr) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      v[i] = momentum_ * v[i] + g[i];
      w[i] -= lr * v[i];
    }
  }

  Mlp& model_;
  float momentum_;
  std::vector<std::vector<float>> velocity_;
};

}  // namespace raw_mlp
