#include "methods/dms/dms_train.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h since LibTorch 2)

#include <cmath>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/formats/tokenizer.h"
#include "harness/model/model.h"
#include "harness/train/adapter_adam.h"
#include "harness/train/train_config.h"
#include "harness/train/train_data.h"
#include "harness/train/trainer.h"
#include "methods/common/adapter_training.h"
#include "methods/dms/dms_adapter.h"

namespace kvb::dms {

TrainResult train_adapter(const std::shared_ptr<Model>& model, const TrainOptions& o) {
  const ModelConfig& c = model->config;
  KVB_CHECK(model->device.is_cpu(), "dms-train: runs on the CPU so far");
  KVB_CHECK(!model->tokenizer_path.empty(), "dms-train: model ", c.name, " has no tokenizer");
  KVB_CHECK(o.window >= 1 && o.window < o.seq_len, "dms-train: --window ", o.window,
            " must be in [1, seq_len ", o.seq_len, ")");
  KVB_CHECK(o.target_cr >= 1.0, "dms-train: --target-cr ", o.target_cr, " is below 1");
  TrainConfig cfg = load_train_config(o.recipe);
  auto tok = std::make_shared<Tokenizer>(model->tokenizer_path);
  TrainData data(cfg, tok, resolve_data_dir(o.data_dir));

  TrainWeights w = train_weights_from_model(model->weights, c, "cpu");
  for (auto& t : w.tensors) t.requires_grad_(false);
  at::Tensor cos, sin;
  compute_rope_tables(c, o.seq_len, &cos, &sin);

  Adapter a = Adapter::fresh(c, o.window);
  std::vector<at::Tensor*> params;
  for (size_t l = 0; l < a.norm.size(); ++l)
    for (at::Tensor* t : {&a.norm[l], &a.weight[l], &a.bias[l]}) params.push_back(t);

  const int64_t T = o.seq_len, W = o.window;
  // far[i][j] = 1 where key j is outside query i's window (i - j > W): there the keep probability
  // applies. Keys j >= T - 1 - W leave no query's window inside the row: not counted in the
  // realized fraction.
  at::Tensor idx = at::arange(T, at::kLong);
  at::Tensor far = (idx.unsqueeze(1) - idx.unsqueeze(0)).gt(W).to(at::kFloat);  // [T, T]
  const int64_t counted = T - 1 - W;
  at::Generator gen = at::detail::createCPUGenerator(o.seed);

  TrainResult res;
  // Per step: KL, the realized evicted fraction, its target.
  auto train_step = [&](int64_t step, AdapterAdam& adam) -> std::vector<double> {
    std::vector<int64_t> flat;
    for (int64_t r = 0; r < o.batch; ++r) {
      TrainRow row = data.row(step, r, T);
      flat.insert(flat.end(), row.tokens.begin(), row.tokens.begin() + T);
    }
    at::Tensor tokens = at::tensor(flat, at::kLong).view({o.batch, T});
    at::Tensor logp_t;
    {
      at::NoGradGuard ng;
      logp_t = at::log_softmax(train_forward(w, c, tokens, cos, sin, at::kFloat), -1);
    }
    const double ramp = std::max(1.0, o.ramp_fraction * static_cast<double>(o.steps));
    const double cr = 1.0 + (o.target_cr - 1.0) * std::min(1.0, static_cast<double>(step) / ramp);
    const double target = 1.0 - 1.0 / cr;
    std::vector<at::Tensor> evict;  // per layer [B, T, Hkv]: soft eviction of token j
    AttentionBiasFn bias = [&](int64_t l, const at::Tensor& x) {
      at::Tensor alpha = a.alpha(l, x);  // [B, T, Hkv]
      at::Tensor u = at::rand(alpha.sizes(), gen).clamp(1e-6, 1 - 1e-6);
      at::Tensor e = at::sigmoid((alpha + at::log(u) - at::log1p(-u)) / o.tau);
      // The decision at position j + 1 decides token j; the last token has none yet.
      at::Tensor ej = at::cat({e.narrow(1, 1, T - 1), at::zeros({o.batch, 1, c.n_kv_heads})}, 1);
      evict.push_back(ej);
      at::Tensor keep_log = at::log1p(-ej.clamp_max(1 - 1e-6)).permute({0, 2, 1}).unsqueeze(2);
      return keep_log * far;  // [B, Hkv, T, T]
    };
    at::Tensor logits = train_forward(w, c, tokens, cos, sin, at::kFloat, bias);
    at::Tensor logp_s = at::log_softmax(logits, -1);
    at::Tensor kl = (logp_s.exp() * (logp_s - logp_t)).sum(-1).mean();
    at::Tensor realized = at::stack(evict).narrow(2, 0, counted).mean();
    at::Tensor loss = kl + o.compression_weight * at::relu(target - realized);
    loss.backward();
    adam.step(o.lr, step);
    return {kl.item<double>(), realized.item<double>(), target};
  };
  auto interval = [&res](const std::vector<double>& means, std::ostream& line) {
    res.kl = means[0];
    res.realized_frac = means[1];
    res.target_frac = means[2];
    line << "KL " << res.kl << ", evicted fraction " << res.realized_frac << " (target "
         << res.target_frac << ")";
  };
  train_adapter_tensors(params, {o.steps, o.log_every, o.log}, train_step, interval);
  res.steps = o.steps;
  a.save(o.out,
         trained_adapter_metadata(c.name, o.steps,
                                  {{"recipe", o.recipe},
                                   {"target_cr", std::to_string(o.target_cr)},
                                   {"seq_len", std::to_string(o.seq_len)},
                                   {"final_kl", std::to_string(res.kl)},
                                   {"final_evicted_fraction", std::to_string(res.realized_frac)}}));
  return res;
}

}  // namespace kvb::dms
