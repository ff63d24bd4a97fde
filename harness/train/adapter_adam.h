#pragma once
// Adam (no weight decay) for the few small tensors an adapter trains on a frozen model (DMS's
// decision adapters, KV Packet's header and trailer). The full-model trainer has its own AdamW with
// checkpointed state (trainer.cpp); adapters train in minutes and keep no optimiser state.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h since LibTorch 2)

#include <cmath>
#include <vector>

namespace kvb {

class AdapterAdam {
 public:
  // params: leaves that require grad; they must outlive the optimiser.
  explicit AdapterAdam(std::vector<at::Tensor*> params) : params_(std::move(params)) {
    for (auto* p : params_) {
      m1_.push_back(at::zeros_like(*p));
      m2_.push_back(at::zeros_like(*p));
    }
  }

  // One update from the accumulated gradients (step counts from 0), which are then zeroed.
  void step(double lr, int64_t step) {
    at::NoGradGuard ng;
    const double bc1 = 1 - std::pow(kBeta1, step + 1), bc2 = 1 - std::pow(kBeta2, step + 1);
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor g = params_[i]->grad();
      if (!g.defined()) continue;
      m1_[i].mul_(kBeta1).add_(g, 1 - kBeta1);
      m2_[i].mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
      params_[i]->addcdiv_(m1_[i], (m2_[i] / bc2).sqrt_().add_(kEps), -lr / bc1);
      params_[i]->grad().zero_();
    }
  }

 private:
  static constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  std::vector<at::Tensor*> params_;
  std::vector<at::Tensor> m1_, m2_;
};

}  // namespace kvb
