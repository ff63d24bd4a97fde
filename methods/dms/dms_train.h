#pragma once
// `kvbench dms-train`: retrofits DMS's eviction adapters (dms_adapter.h) onto a frozen model by
// distillation (the NVIDIA code's adapter-only recipe). Per step:
//   teacher  the model without eviction (no gradient): log p_t;
//   student  the same weights with a soft delayed-eviction bias in every layer: for query i and key
//            j with i - j > window, score + log(1 - e_j), e_j = sigmoid((alpha_{j+1} + g) / tau), g
//            logistic noise (the difference of two Gumbels), alpha the adapter's logit;
//   loss     KL(student || teacher) per token + weight * max(0, target_frac - realized_frac), the
//            realized fraction the mean of e_j over the keys that leave the window inside the row,
//            target_frac = 1 - 1/CR with CR rising linearly from 1 to target_cr over the first
//            ramp_fraction of the steps.
// Only the adapters train (Adam); rows come from a `kvbench train` recipe's data mix.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace kvb {
class Model;
}

namespace kvb::dms {

struct TrainOptions {
  std::string recipe;  // a train recipe (configs/models/*.json): its data mix gives the rows
  std::string data_dir;
  std::string out;  // adapter path (.safetensors)
  int64_t steps = 200, batch = 2, seq_len = 512, window = 64;
  double target_cr = 4.0, ramp_fraction = 0.6, lr = 1e-3, tau = 0.1, compression_weight = 1.0;
  uint64_t seed = 1;
  int64_t log_every = 10;
  std::function<void(const std::string&)> log;  // progress lines (null: quiet)
};

struct TrainResult {
  int64_t steps = 0;
  double kl = 0, realized_frac = 0, target_frac = 0;  // over the last log interval
};

TrainResult train_adapter(const std::shared_ptr<Model>& model, const TrainOptions& o);

}  // namespace kvb::dms
