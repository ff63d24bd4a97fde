#include "harness/eval/profile.h"

#include <ATen/ATen.h>

#include <cmath>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/engine/engine.h"
#include "harness/eval/attention_measures.h"
#include "harness/kv/paged_kv_cache.h"
#include "harness/kv/probe_view.h"

namespace kvb {

namespace am = attention_measures;

namespace {

constexpr int64_t kSinkTokens = 4;
constexpr int64_t kRecencyAges[] = {16, 64, 256, 1024};
constexpr int32_t kQuantBits[] = {4, 2};

// What one (layer, KV head) carries from step to step.
struct HeadState {
  std::vector<int64_t> prev_topk;
  bool has_prev = false;
  am::TopKReuse reuse;
  std::unique_ptr<am::ClusteredKeyIndex> index;
  int64_t indexed_rows = 0;           // rows the index holds (positions 0 .. indexed_rows - 1)
  at::Tensor k_quant[2], v_quant[2];  // [n0, d] dequantized rows held at the first decode step
};

// The exact store, measured at every decode step after each layer has attended (the step's own
// token is then in the store).
class ProfileKvCache : public KvCache {
 public:
  ProfileKvCache(std::unique_ptr<KvCache> exact, int64_t n_layers, int64_t n_kv_heads,
                 const ProfileOptions& opts)
      : exact_(std::move(exact)),
        opts_(opts),
        state_(n_layers * n_kv_heads),
        kv_heads_(n_kv_heads) {
    r_.layers = n_layers;
    r_.kv_heads = n_kv_heads;
  }
  std::string name() const override { return "profile(" + exact_->name() + ")"; }
  const ProfileSampleResult& result() const { return r_; }

  void begin_step(const StepBatch& b) override {
    decoding_ = b.phase == Phase::kDecode;
    if (decoding_) ++step_;
    exact_->begin_step(b);
  }
  at::Tensor attend(const LayerInput& in) override {
    at::Tensor out = exact_->attend(in);
    if (decoding_ && in.window == 0) measure(in);
    return out;
  }
  void end_step(const StepBatch& b) override { exact_->end_step(b); }
  void end_prefill(int64_t seq) override { exact_->end_prefill(seq); }
  void release(int64_t seq) override { exact_->release(seq); }
  void fork(int64_t src, int64_t dst) override { exact_->fork(src, dst); }
  void truncate(int64_t seq, int64_t n) override { exact_->truncate(seq, n); }
  int64_t seq_len(int64_t seq) const override { return exact_->seq_len(seq); }
  Footprint footprint() const override { return exact_->footprint(); }
  bool serves_windows() const override { return exact_->serves_windows(); }

 private:
  void measure(const LayerInput& in) {
    const int l = in.layer;
    KVB_ASSERT(in.batch->batch_size() == 1, "profile", "one sequence per step");
    auto views = probe_view_of(*exact_, l, in.batch->seq_ids[0]);
    KVB_ASSERT(static_cast<int64_t>(views.size()) == kv_heads_, "profile",
               "the exact store shows every KV head");
    // The measures run on the host (index sets, k-means, the host quantizer), whatever the device.
    at::Tensor q = in.q->to(at::kFloat).cpu()[0];  // [H, d] (decode: one token)
    const int64_t G = q.size(0) / kv_heads_;
    const int64_t k = opts_.top_k;
    for (int64_t h = 0; h < kv_heads_; ++h) {
      const HeadSnapshot s{views[h].k.cpu(), views[h].v.cpu(), views[h].index.cpu()};
      HeadState& st = state_[l * kv_heads_ + h];
      const int64_t n = s.k.size(0);
      KVB_ASSERT(s.index[-1].item<int64_t>() == n - 1, "profile",
                 "the exact store holds every row in order");
      at::Tensor Q = q.narrow(0, h * G, G);                                     // [G, d]
      at::Tensor P = at::softmax(at::mm(Q, s.k.t()) * double(in.sm_scale), 1);  // [G, n]
      at::Tensor p = P.mean(0);                                                 // [n]
      auto put = [&](const std::string& m, double v) { r_.add(m, l, h, v); };

      for (int64_t age : kRecencyAges)
        put("recency_" + std::to_string(age), am::mass_within_age(p, s.index, age));
      put("sink_mass", am::sink_mass(p, s.index, kSinkTokens));
      const double e = am::entropy(p);
      put("entropy", e);
      put("entropy_norm", n > 1 ? e / std::log(static_cast<double>(n)) : 0.0);
      const int64_t support = am::support_count(p, 0.9);
      put("support90", static_cast<double>(support));
      put("support90_frac", static_cast<double>(support) / n);

      const std::vector<int64_t> top = am::top_k_positions(p, s.index, k);
      const double top_mass = std::max(am::mass_at(p, s.index, top), 1e-30);
      put("topk_mass", top_mass);
      put("temporal_capture", am::window_mass(p, s.index, k, kSinkTokens) / top_mass);
      const auto reuse = st.reuse.observe(step_, top);
      if (st.has_prev) {
        put("topk_jaccard", am::jaccard(top, st.prev_topk));
        put("speculative_capture", am::mass_at(p, s.index, st.prev_topk) / top_mass);
        if (reuse.reused > 0) put("reuse_distance", reuse.distance_sum / reuse.reused);
        put("topk_fresh_share", static_cast<double>(reuse.fresh) / top.size());
      }
      st.prev_topk = top;
      st.has_prev = true;

      if (!st.index) {
        st.index = std::make_unique<am::ClusteredKeyIndex>(s.k, s.index, opts_.cluster_rows,
                                                           opts_.kmeans_iterations);
        st.indexed_rows = n;
        for (int b = 0; b < 2; ++b) {
          st.k_quant[b] = am::quantize_dequantize(s.k, kQuantBits[b], opts_.quant_group,
                                                  kernels::QuantAxis::kColumn);
          st.v_quant[b] =
              am::quantize_dequantize(s.v, kQuantBits[b], std::min(opts_.quant_group, s.v.size(1)),
                                      kernels::QuantAxis::kRow);
        }
      }
      for (; st.indexed_rows < n; ++st.indexed_rows)
        st.index->add(s.k[st.indexed_rows], st.indexed_rows);
      const std::vector<int64_t> scanned = st.index->scan(Q, opts_.scan_share);
      at::Tensor scanned_mask = at::isin(s.index, at::tensor(scanned, at::kLong));
      std::vector<int64_t> found;
      std::set_intersection(top.begin(), top.end(), scanned.begin(), scanned.end(),
                            std::back_inserter(found));
      put("cluster_recall", static_cast<double>(found.size()) / top.size());
      put("content_capture", am::top_k_mass_among(p, scanned_mask, k) / top_mass);

      at::Tensor o = am::attention_output(Q, s.k, s.v, in.sm_scale);  // [G, d]
      for (int b = 0; b < 2; ++b) {
        const int64_t n0 = st.k_quant[b].size(0);
        at::Tensor kq = at::cat({st.k_quant[b], s.k.narrow(0, n0, n - n0)});
        at::Tensor vq = at::cat({st.v_quant[b], s.v.narrow(0, n0, n - n0)});
        const std::string bits = std::to_string(kQuantBits[b]);
        put("key_quant_err_" + bits,
            am::relative_error(am::attention_output(Q, kq, s.v, in.sm_scale), o));
        put("value_quant_err_" + bits,
            am::relative_error(am::attention_output(Q, s.k, vq, in.sm_scale), o));
      }
    }
  }

  std::unique_ptr<KvCache> exact_;
  ProfileOptions opts_;
  std::vector<HeadState> state_;  // [layer * kv_heads + head]
  int64_t kv_heads_;
  bool decoding_ = false;
  int64_t step_ = 0;
  ProfileSampleResult r_;
};

}  // namespace

const std::vector<std::string>& profile_measure_names() {
  static const std::vector<std::string> names = {
      "recency_16",          "recency_64",      "recency_256",      "recency_1024",
      "sink_mass",           "entropy",         "entropy_norm",     "support90",
      "support90_frac",      "topk_mass",       "temporal_capture", "topk_jaccard",
      "speculative_capture", "reuse_distance",  "topk_fresh_share", "cluster_recall",
      "content_capture",     "key_quant_err_4", "key_quant_err_2",  "value_quant_err_4",
      "value_quant_err_2"};
  return names;
}

std::string profile_measure_unit(const std::string& name) {
  if (name == "entropy") return "nats";
  if (name == "support90") return "tokens";
  if (name == "reuse_distance") return "steps";
  return "fraction";
}

void ProfileSampleResult::add(const std::string& measure, int64_t layer, int64_t head,
                              double value) {
  auto& s = sum[measure];
  auto& c = count[measure];
  if (s.empty()) {
    s.assign(layers * kv_heads, 0.0);
    c.assign(layers * kv_heads, 0);
  }
  s[layer * kv_heads + head] += value;
  c[layer * kv_heads + head] += 1;
}

nlohmann::json ProfileSampleResult::to_json() const {
  return {{"layers", layers}, {"kv_heads", kv_heads}, {"sum", sum}, {"count", count}};
}

ProfileSampleResult ProfileSampleResult::from_json(const nlohmann::json& j) {
  ProfileSampleResult r;
  r.layers = j.at("layers");
  r.kv_heads = j.at("kv_heads");
  r.sum = j.at("sum").get<std::map<std::string, std::vector<double>>>();
  r.count = j.at("count").get<std::map<std::string, std::vector<int64_t>>>();
  return r;
}

ProfileSampleResult run_profile_sample(std::shared_ptr<Model> model,
                                       const std::vector<int64_t>& tokens,
                                       const ProfileOptions& opts) {
  const auto& c = model->config;
  const int64_t steps = static_cast<int64_t>(tokens.size()) - 1;
  KVB_ASSERT(opts.decode_steps >= 2 && opts.decode_steps <= steps, "profile",
             "decode_steps within the window (checked by the protocol)");
  const int64_t P = static_cast<int64_t>(tokens.size()) - opts.decode_steps;
  auto cache = std::make_unique<ProfileKvCache>(
      make_default_kv(*model, PagedKvCache::Options{}.block_size), c.n_layers, c.n_kv_heads, opts);
  ProfileKvCache* profile = cache.get();
  Engine e(model, std::move(cache));
  const int64_t seq = e.new_sequence();
  e.prefill({seq}, {std::vector<int64_t>(tokens.begin(), tokens.begin() + P)});
  for (size_t i = P; i < tokens.size(); ++i) e.decode({seq}, {tokens[i]});
  return profile->result();
}

std::vector<Metric> profile_metrics(const std::vector<ProfileSampleResult>& samples) {
  std::vector<Metric> out;
  if (samples.empty()) return out;
  const int64_t L = samples[0].layers, Hk = samples[0].kv_heads;
  for (const auto& s : samples)
    KVB_CHECK(s.layers == L && s.kv_heads == Hk, "profile samples: a sample of ", s.layers, "x",
              s.kv_heads, " layers x KV heads among ones of ", L, "x", Hk);
  for (const std::string& name : profile_measure_names()) {
    const std::string unit = profile_measure_unit(name);
    const Direction dir =
        name.find("quant_err") != std::string::npos ? Direction::kLower : Direction::kNone;
    double all = 0;
    int64_t cells = 0, steps = 0;
    for (int64_t i = 0; i < L * Hk; ++i) {
      double sum = 0;
      int64_t n = 0;
      for (const auto& s : samples) {
        auto it = s.sum.find(name);
        if (it == s.sum.end()) continue;
        sum += it->second.at(i);
        n += s.count.at(name).at(i);
      }
      if (n == 0) continue;
      Metric m(name, sum / n, unit, dir);
      m.layer = i / Hk;
      m.head = i % Hk;
      m.n = n;
      out.push_back(m);
      all += sum / n;
      ++cells;
      steps += n;
    }
    if (cells == 0) continue;
    Metric m(name, all / cells, unit, dir);  // the mean over (layer, head) cells
    m.n = steps;
    out.push_back(m);
  }
  return out;
}

}  // namespace kvb
