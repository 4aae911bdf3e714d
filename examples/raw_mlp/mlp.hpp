#pragma once
// A hand-written MLP on plain std::vector<float> buffers: Linear -> ReLU -> ... -> Linear,
// softmax cross-entropy, SGD. No framework: the point is a training loop that accelerate-cpp
// distributes through its raw API (parameters and gradients registered as buffer views).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace raw_mlp {

// Called around each layer's use in forward_backward, when set (a ZeRO-3 loop gathers the
// layer's parameters there: Accelerator::gather_parameters).
struct LayerScopes {
  std::function<void(std::size_t)> enter_forward, leave_forward, enter_backward, leave_backward;
};

struct Layer {
  int in = 0, out = 0;
  std::vector<float> weight, bias;  // weight is out x in, row-major
  std::vector<float> weight_grad, bias_grad;
};

class Mlp {
 public:
  // sizes = {784, 256, 10}: input, hidden..., classes. Same seed, same initial weights.
  Mlp(std::vector<int> sizes, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
      Layer layer;
      layer.in = sizes[l];
      layer.out = sizes[l + 1];
      const float bound = 1.0f / std::sqrt(float(layer.in));  // LibTorch's Linear init range
      std::uniform_real_distribution<float> u(-bound, bound);
      layer.weight.resize(std::size_t(layer.out) * layer.in);
      layer.bias.resize(layer.out);
      for (float& w : layer.weight) w = u(rng);
      for (float& b : layer.bias) b = u(rng);
      layer.weight_grad.assign(layer.weight.size(), 0.0f);
      layer.bias_grad.assign(layer.bias.size(), 0.0f);
      layers_.push_back(std::move(layer));
    }
  }

  std::vector<Layer>& layers() { return layers_; }
  const std::vector<Layer>& layers() const { return layers_; }

  void zero_grad() {
    for (Layer& l : layers_) {
      std::fill(l.weight_grad.begin(), l.weight_grad.end(), 0.0f);
      std::fill(l.bias_grad.begin(), l.bias_grad.end(), 0.0f);
    }
  }

  // Forward and backward over `batch` samples (x: batch x in, labels in [0, classes)).
  // Gradients of (mean loss over the batch) * loss_scale are ADDED to the gradient buffers,
  // so several calls accumulate. on_layer_grads(l) is called as soon as layer l's gradients
  // are final, last layer first, as autograd would (DDP starts communicating there).
  // Returns the mean loss.
  template <typename OnLayerGrads>
  float forward_backward(std::span<const float> x, std::span<const int> labels, float loss_scale,
                         OnLayerGrads&& on_layer_grads, const LayerScopes& scopes = {}) {
    const auto call = [](const std::function<void(std::size_t)>& f, std::size_t l) {
      if (f) f(l);
    };
    const int batch = int(labels.size());
    std::vector<std::vector<float>> acts(layers_.size() + 1);
    acts[0].assign(x.begin(), x.end());
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      call(scopes.enter_forward, l);
      const Layer& L = layers_[l];
      std::vector<float>& out = acts[l + 1];
      out.assign(std::size_t(batch) * L.out, 0.0f);
      for (int n = 0; n < batch; ++n)
        for (int o = 0; o < L.out; ++o) {
          float s = L.bias[o];
          const float* w = &L.weight[std::size_t(o) * L.in];
          const float* a = &acts[l][std::size_t(n) * L.in];
          for (int i = 0; i < L.in; ++i) s += w[i] * a[i];
          out[std::size_t(n) * L.out + o] = (l + 1 < layers_.size()) ? std::max(s, 0.0f) : s;
        }
      call(scopes.leave_forward, l);
    }
    // Softmax cross-entropy; delta = d(loss * scale)/d(logits).
    const int classes = layers_.back().out;
    std::vector<float> delta(std::size_t(batch) * classes);
    double loss = 0;
    for (int n = 0; n < batch; ++n) {
      const float* z = &acts.back()[std::size_t(n) * classes];
      const float zmax = *std::max_element(z, z + classes);
      double sum = 0;
      for (int c = 0; c < classes; ++c) sum += std::exp(double(z[c] - zmax));
      loss += -(double(z[labels[n]] - zmax) - std::log(sum));
      for (int c = 0; c < classes; ++c) {
        const float p = float(std::exp(double(z[c] - zmax)) / sum);
        delta[std::size_t(n) * classes + c] =
            (p - (c == labels[n] ? 1.0f : 0.0f)) * loss_scale / float(batch);
      }
    }
    for (std::size_t l = layers_.size(); l-- > 0;) {
      call(scopes.enter_backward, l);
      Layer& L = layers_[l];
      const std::vector<float>& a = acts[l];
      std::vector<float> prev(std::size_t(batch) * L.in, 0.0f);
      for (int n = 0; n < batch; ++n)
        for (int o = 0; o < L.out; ++o) {
          const float d = delta[std::size_t(n) * L.out + o];
          L.bias_grad[o] += d;
          float* gw = &L.weight_grad[std::size_t(o) * L.in];
          const float* w = &L.weight[std::size_t(o) * L.in];
          const float* an = &a[std::size_t(n) * L.in];
          float* pn = &prev[std::size_t(n) * L.in];
          for (int i = 0; i < L.in; ++i) {
            gw[i] += d * an[i];
            pn[i] += d * w[i];
          }
        }
      on_layer_grads(l);
      call(scopes.leave_backward, l);
      if (l > 0)  // through the previous layer's ReLU
        for (std::size_t i = 0; i < prev.size(); ++i) prev[i] = a[i] > 0 ? prev[i] : 0.0f;
      delta = std::move(prev);
    }
    return float(loss / batch);
  }

  void sgd_step(float lr) {
    for (Layer& l : layers_) {
      for (std::size_t i = 0; i < l.weight.size(); ++i) l.weight[i] -= lr * l.weight_grad[i];
      for (std::size_t i = 0; i < l.bias.size(); ++i) l.bias[i] -= lr * l.bias_grad[i];
    }
  }

  // Predicted class per sample.
  std::vector<int> predict(std::span<const float> x, int batch) {
    std::vector<int> out;
    std::vector<float> a(x.begin(), x.end());
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      std::vector<float> next(std::size_t(batch) * L.out);
      for (int n = 0; n < batch; ++n)
        for (int o = 0; o < L.out; ++o) {
          float s = L.bias[o];
          for (int i = 0; i < L.in; ++i)
            s += L.weight[std::size_t(o) * L.in + i] * a[std::size_t(n) * L.in + i];
          next[std::size_t(n) * L.out + o] = (l + 1 < layers_.size()) ? std::max(s, 0.0f) : s;
        }
      a = std::move(next);
    }
    const int classes = layers_.back().out;
    for (int n = 0; n < batch; ++n)
      out.push_back(int(
          std::max_element(&a[std::size_t(n) * classes], &a[std::size_t(n) * classes] + classes) -
          &a[std::size_t(n) * classes]));
    return out;
  }

 private:
  std::vector<Layer> layers_;
};

}  // namespace raw_mlp
