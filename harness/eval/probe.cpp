#include "harness/eval/probe.h"

#include <ATen/ATen.h>

#include <cmath>

#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/paged_kv_cache.h"
#include "harness/kv/probe_view.h"
#include "harness/kv/twin_kv_cache.h"

namespace kvb {

namespace {

// The method's cache and an exact twin side by side (the engine follows the method); errors are
// recorded at probe steps.
class ProbeKvCache : public TwinKvCache {
 public:
  ProbeKvCache(std::unique_ptr<KvCache> method, std::unique_ptr<KvCache> exact, int64_t n_layers,
               int64_t every, int64_t first_decode_pos)
      : TwinKvCache(std::move(method), std::move(exact), every, first_decode_pos,
                    /*follow_exact=*/false) {
    r_.out_err.assign(n_layers, 0);
    r_.key_err.assign(n_layers, 0);
    r_.value_err.assign(n_layers, 0);
    r_.prob_tv.assign(n_layers, 0);
    r_.out_n.assign(n_layers, 0);
    r_.kv_n.assign(n_layers, 0);
  }
  std::string name() const override { return "probe(" + method().name() + ")"; }
  const ProbeSampleResult& result() const { return r_; }

 protected:
  void on_layer(const LayerInput& in, const at::Tensor& om, const at::Tensor& ox) override {
    const int l = in.layer;
    at::Tensor a = om.to(at::kFloat), e = ox.to(at::kFloat);
    r_.out_err[l] += ((a - e).norm() / e.norm().clamp_min(1e-30)).item<double>();
    r_.out_n[l] += 1;
    // A window layer holds the same window rows on both sides (WindowedKvCache, whatever the
    // method), indexed by sequence position rather than by row: nothing to compare there.
    if (in.window > 0) return;
    const int64_t seq = exact_batch().seq_ids[0];
    auto mv = probe_view_of(method(), l, seq);
    if (mv.empty()) return;
    auto xv = probe_view_of(exact(), l, seq);
    if (xv.empty()) return;
    at::Tensor q = in.q->to(at::kFloat)[0];  // [H, D] (decode: one token)
    const int64_t H = q.size(0), Hk = static_cast<int64_t>(xv.size()), G = H / Hk;
    double kerr = 0, verr = 0, tv = 0;
    for (int64_t h = 0; h < Hk; ++h) {
      at::Tensor kx = xv[h].k.index_select(0, mv[h].index), vx = xv[h].v.index_select(0, mv[h].index);
      kerr += ((mv[h].k - kx).norm() / kx.norm().clamp_min(1e-30)).item<double>();
      verr += ((mv[h].v - vx).norm() / vx.norm().clamp_min(1e-30)).item<double>();
      for (int64_t g = 0; g < G; ++g) {
        at::Tensor qh = q[h * G + g];
        at::Tensor px = at::softmax(at::mv(xv[h].k, qh) * in.sm_scale, 0);          // [len]
        at::Tensor pm_kept = at::softmax(at::mv(mv[h].k, qh) * in.sm_scale, 0);     // [n_kept]
        at::Tensor pm = at::zeros_like(px).index_add_(0, mv[h].index, pm_kept);
        tv += 0.5 * (px - pm).abs().sum().item<double>();
      }
    }
    r_.key_err[l] += kerr / Hk;
    r_.value_err[l] += verr / Hk;
    r_.prob_tv[l] += tv / H;
    r_.kv_n[l] += 1;
  }

 private:
  ProbeSampleResult r_;
};

nlohmann::json vec(const std::vector<double>& v) { return nlohmann::json(v); }

}  // namespace

ProbeSampleResult run_probe_sample(std::shared_ptr<Model> model, const std::string& method,
                                   const nlohmann::json& method_params,
                                   const std::vector<int64_t>& tokens, const ProbeOptions& opts) {
  const auto& c = model->config;
  CacheContext ctx{c, model->device, model->dtype, model};
  // The exact twin applies the model's windows as the method's store does (make_default_kv).
  std::unique_ptr<KvCache> exact = make_default_kv(*model, PagedKvCache::Options{}.block_size);
  const int64_t P = std::min<int64_t>(std::max<int64_t>(1, opts.prefill_tokens), tokens.size() - 1);
  auto probe = std::make_unique<ProbeKvCache>(MethodRegistry::instance().create(method, ctx, method_params),
                                              std::move(exact), c.n_layers, std::max<int64_t>(1, opts.every), P);
  ProbeKvCache* p = probe.get();
  Engine e(model, std::move(probe));
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {std::vector<int64_t>(tokens.begin(), tokens.begin() + P)});
  for (size_t i = P; i + 1 < tokens.size(); ++i) e.decode({seq}, {tokens[i]});
  return p->result();
}

nlohmann::json ProbeSampleResult::to_json() const {
  return {{"out_err", vec(out_err)}, {"key_err", vec(key_err)}, {"value_err", vec(value_err)},
          {"prob_tv", vec(prob_tv)}, {"out_n", out_n},          {"kv_n", kv_n}};
}

ProbeSampleResult ProbeSampleResult::from_json(const nlohmann::json& j) {
  ProbeSampleResult r;
  r.out_err = j.at("out_err").get<std::vector<double>>();
  r.key_err = j.at("key_err").get<std::vector<double>>();
  r.value_err = j.at("value_err").get<std::vector<double>>();
  r.prob_tv = j.at("prob_tv").get<std::vector<double>>();
  r.out_n = j.at("out_n").get<std::vector<int64_t>>();
  r.kv_n = j.at("kv_n").get<std::vector<int64_t>>();
  return r;
}

std::vector<Metric> probe_metrics(const std::vector<ProbeSampleResult>& samples) {
  if (samples.empty()) return {};
  const size_t L = samples[0].out_err.size();
  std::vector<Metric> m;
  struct Acc {
    const char* name;
    std::vector<double> ProbeSampleResult::*sum;
    std::vector<int64_t> ProbeSampleResult::*n;
  };
  const Acc accs[] = {{"attn_output_rel_err", &ProbeSampleResult::out_err, &ProbeSampleResult::out_n},
                      {"key_rel_err", &ProbeSampleResult::key_err, &ProbeSampleResult::kv_n},
                      {"value_rel_err", &ProbeSampleResult::value_err, &ProbeSampleResult::kv_n},
                      {"attn_prob_tv", &ProbeSampleResult::prob_tv, &ProbeSampleResult::kv_n}};
  for (const auto& a : accs) {
    double all = 0;
    int64_t layers_with_data = 0;
    for (size_t l = 0; l < L; ++l) {
      double s = 0;
      int64_t n = 0;
      for (const auto& x : samples) {
        s += (x.*a.sum)[l];
        n += (x.*a.n)[l];
      }
      if (n == 0) continue;
      Metric mm(a.name, s / n, "", Direction::kLower);
      mm.layer = static_cast<int64_t>(l);
      mm.n = n;
      m.push_back(mm);
      all += s / n;
      ++layers_with_data;
    }
    if (layers_with_data > 0) m.push_back(Metric(std::string(a.name), all / layers_with_data, "", Direction::kLower));
  }
  return m;
}

}  // namespace kvb
