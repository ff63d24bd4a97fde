// retroinfer: RetroInfer (Chen et al., VLDB 2026, arXiv 2505.02922): the KV cache as a vector
// store. After the prompt, each KV head's middle keys (all but the first `sinks` and the last
// `steady_recent` prompt tokens) are clustered (wave_index.h) and move to the host tier; the device
// keeps the steady zone (sinks + the recent tail) exactly, and per cluster its centroid, value sum
// and size. Attention (tripartite, one softmax per query head):
//   steady zone      exact over the sinks and the tail (every query row, causal);
//   retrieval zone   exact over the members of the best `retrieval_ratio` of the clusters, ranked
//                    by q . c_j (the group's query heads aggregated by max or mean per KV head);
//   estimation zone  the next `estimation_ratio` of the clusters through their centroid: softmax
//                    mass n_j exp(z_j), numerator exp(z_j) V_j (V_j the value sum);
//   the rest of the clusters is ignored.
// Every `reindex_every` tokens that pass the tail, the oldest of them are clustered and indexed
// too. Retrieved clusters come from the host through a device cache of `cache_multiple` x the
// retrieval zone per KV head (LRU): hits and the bytes a miss moves are counted.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <list>
#include <numeric>
#include <unordered_map>

#include "harness/common/error.h"
#include "harness/kv/attention.h"
#include "harness/kv/method_registry.h"
#include "methods/common/method_listing.h"
#include "methods/common/row_attention.h"
#include "methods/common/seq_store.h"
#include "methods/retroinfer/wave_index.h"

namespace kvb {
namespace {

using retroinfer::Cluster;

struct RetroOptions {
  int64_t sinks = 4;
  int64_t steady_recent = 64;
  retroinfer::ClusterOptions clusters;
  double retrieval_ratio = 0.018;
  double estimation_ratio = 0.232;
  int64_t min_retrieved = 1;
  bool gqa_max = true;
  double cache_multiple = 3.0;
  int64_t reindex_every = 1024;
  bool measure_recall = true;
};

// An LRU set of cluster ids (the device-side cache of one KV head).
class LruCache {
 public:
  // Touches `id`; returns true on a hit. Evicts the least recently used beyond `capacity`.
  bool touch(int64_t id, size_t capacity, std::vector<int64_t>* evicted) {
    auto it = where_.find(id);
    if (it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return true;
    }
    order_.push_front(id);
    where_[id] = order_.begin();
    while (order_.size() > capacity) {
      evicted->push_back(order_.back());
      where_.erase(order_.back());
      order_.pop_back();
    }
    return false;
  }
  const std::list<int64_t>& ids() const { return order_; }
  LruCache() = default;
  LruCache(const LruCache& o) : order_(o.order_) {
    for (auto it = order_.begin(); it != order_.end(); ++it) where_[*it] = it;
  }
  LruCache& operator=(const LruCache& o) {
    order_ = o.order_;
    where_.clear();
    for (auto it = order_.begin(); it != order_.end(); ++it) where_[*it] = it;
    return *this;
  }

 private:
  std::list<int64_t> order_;
  std::unordered_map<int64_t, std::list<int64_t>::iterator> where_;
};

struct RetroHead {
  std::vector<Cluster> clusters;
  LruCache cache;
};
struct RetroLayer {
  std::vector<float> k, v;  // every token's rows [len, kv_dim] fp32 (steady and indexed alike)
  std::vector<RetroHead> heads;
};
struct RetroSeq {
  RetroSeq(int64_t n_layers, int64_t n_kv_heads)
      : layers(static_cast<size_t>(n_layers),
               RetroLayer{{}, {}, std::vector<RetroHead>(n_kv_heads)}) {}
  std::vector<RetroLayer> layers;
  int64_t len = 0;
  bool indexed = false;
  int64_t tail_start = 0;  // tokens >= tail_start are in the steady tail (with [0, sinks))
};

class RetroinferKvCache : public SeqStore<RetroSeq> {
 public:
  RetroinferKvCache(const CacheContext& ctx, RetroOptions o)
      : SeqStore("retroinfer"), ctx_(ctx), o_(o) {}

  at::Tensor attend(const LayerInput& in) override {
    const StepBatch& batch = *in.batch;
    const auto& c = ctx_.config;
    const int64_t W = c.kv_dim(), D = c.head_dim, Hkv = c.n_kv_heads, Hq = c.n_heads;
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      Layer& y = s.layers[in.layer];
      const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b], past = s.len, L = past + n;
      at::Tensor kn = in.k->narrow(0, start, n).to(at::kFloat).contiguous();
      at::Tensor vn = in.v->narrow(0, start, n).to(at::kFloat).contiguous();
      y.k.resize(static_cast<size_t>(L * W));
      y.v.resize(static_cast<size_t>(L * W));
      std::memcpy(y.k.data() + past * W, kn.data_ptr<float>(), static_cast<size_t>(n * W * 4));
      std::memcpy(y.v.data() + past * W, vn.data_ptr<float>(), static_cast<size_t>(n * W * 4));
      at::Tensor q = in.q->narrow(0, start, n);
      if (!s.indexed) {  // no index yet (the prompt): exact attention
        outs.push_back(attend_dense_rows(q, y.k.data(), y.v.data(), L, Hkv, D, in.sm_scale));
        continue;
      }
      at::Tensor qf = q.to(at::kFloat).contiguous();
      at::Tensor o = at::zeros({n, Hq, D}, at::kFloat);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < Hkv; ++h)
          attend_row(s, y, h, qf.data_ptr<float>() + (i * Hq + h * c.group_size()) * D,
                     o.data_ptr<float>() + (i * Hq + h * c.group_size()) * D, past + i, in.sm_scale,
                     n == 1);
      outs.push_back(o.to(q.scalar_type()));
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  }

  void end_step(const StepBatch& batch) override {
    SeqStore::end_step(batch);
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      if (batch.phase == Phase::kDecode && batch.new_tokens(b) == 1) decode_rows_ += 1;
      // Tokens that have passed the tail are clustered reindex_every at a time.
      while (s.indexed && s.len - s.tail_start >= o_.steady_recent + o_.reindex_every) {
        index_span(s, s.tail_start, s.tail_start + o_.reindex_every);
        s.tail_start += o_.reindex_every;
      }
    }
  }

  void end_prefill(int64_t seq_id) override {
    Seq& s = seqs_.at(seq_id);
    if (s.indexed) return;
    const int64_t begin = std::min(o_.sinks, s.len),
                  end = std::max(begin, s.len - o_.steady_recent);
    s.indexed = true;
    s.tail_start = end;
    index_span(s, begin, end);
  }

  void truncate(int64_t seq_id, int64_t new_len) override {
    Seq& s = seqs_.truncating(seq_id, new_len);
    KVB_CHECK(!s.indexed || new_len >= s.tail_start, "retroinfer: cannot truncate sequence ",
              seq_id, " to ", new_len, " tokens: tokens before ", s.tail_start,
              " are clustered in the index (truncate within the steady tail only)");
    const auto keep = static_cast<size_t>(new_len * ctx_.config.kv_dim());
    for (auto& y : s.layers) {
      y.k.resize(keep);
      y.v.resize(keep);
    }
    s.len = new_len;
  }

  Footprint footprint() const override {
    const auto& c = ctx_.config;
    const int64_t row = c.head_dim * 4;  // one fp32 row of one head
    return fp32_footprint(c, [&c, row](const Seq& s, Footprint* f) {
      for (const auto& y : s.layers)
        for (int64_t h = 0; h < c.n_kv_heads; ++h) {
          const Head& hd = y.heads[h];
          int64_t indexed = 0;
          for (const auto& cl : hd.clusters) indexed += static_cast<int64_t>(cl.members.size());
          // Device: steady rows (K and V), per cluster centroid + value sum (fp32) + size, and the
          // cached clusters' rows. Host: the indexed rows and their cluster page map.
          f->device_payload_bytes += 2 * (s.len - indexed) * row;
          f->device_metadata_bytes += static_cast<int64_t>(hd.clusters.size()) * (2 * row + 4);
          int64_t cached_rows = 0;
          for (int64_t cid : hd.cache.ids())
            cached_rows += 2 * static_cast<int64_t>(hd.clusters[cid].members.size()) * row;
          f->device_payload_bytes += cached_rows;
          f->host_bytes += 2 * indexed * row + indexed * 4;
          // K/V rows are in the model dtype; centroids and value sums are fp32 accumulators.
          f->model_dtype_device_bytes += 2 * (s.len - indexed) * row + cached_rows;
          f->model_dtype_host_bytes += 2 * indexed * row;
        }
    });
  }

  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m;
    m["sinks"] = static_cast<double>(o_.sinks);
    m["steady_recent"] = static_cast<double>(o_.steady_recent);
    m["cluster_size"] = static_cast<double>(o_.clusters.cluster_size);
    m["retrieval_ratio"] = o_.retrieval_ratio;
    m["estimation_ratio"] = o_.estimation_ratio;
    if (rows_ > 0) {
      m["retrieved_clusters_per_read"] = retrieved_clusters_ / rows_;
      m["estimated_clusters_per_read"] = estimated_clusters_ / rows_;
      m["exact_tokens_per_read"] = exact_tokens_ / rows_;
      m["visible_tokens_per_read"] = visible_tokens_ / rows_;
    }
    if (recall_n_ > 0) m["attention_mass_recall"] = recall_sum_ / recall_n_;
    if (cache_lookups_ > 0) m["cache_hit_rate"] = cache_hits_ / cache_lookups_;
    if (decode_rows_ > 0) {
      m["host_to_device_bytes_per_step"] = miss_bytes_ / decode_rows_;
      m["decode_h2d_bytes_per_token"] = miss_bytes_ / decode_rows_;  // shared name (kv_cache.h)
    }
    double clusters = 0;
    for (const auto& [id, s] : seqs_)
      for (const auto& y : s.layers)
        for (const auto& hd : y.heads) clusters += static_cast<double>(hd.clusters.size());
    m["clusters"] = clusters;
    return m;
  }

 private:
  using Head = RetroHead;
  using Layer = RetroLayer;
  using Seq = RetroSeq;

  Seq new_seq(int64_t) override { return Seq(ctx_.config.n_layers, ctx_.config.n_kv_heads); }

  void index_span(Seq& s, int64_t begin, int64_t end) {
    if (end <= begin) return;
    const auto& c = ctx_.config;
    const int64_t W = c.kv_dim(), D = c.head_dim;
    for (auto& y : s.layers)
      for (int64_t h = 0; h < c.n_kv_heads; ++h) {
        std::vector<Cluster> add = retroinfer::build_clusters(
            y.k.data() + h * D, y.v.data() + h * D, W, D, begin, end, o_.clusters);
        auto& cl = y.heads[h].clusters;
        cl.insert(cl.end(), std::make_move_iterator(add.begin()),
                  std::make_move_iterator(add.end()));
      }
  }

  // One query row's group (G query heads of KV head h) at position `pos`: q, out [G, D].
  void attend_row(Seq& s, Layer& y, int64_t h, const float* q, float* out, int64_t pos, float scale,
                  bool decode) {
    const auto& c = ctx_.config;
    const int64_t W = c.kv_dim(), D = c.head_dim, G = c.group_size();
    Head& hd = y.heads[h];
    const int64_t C = static_cast<int64_t>(hd.clusters.size());
    // Cluster scores z[g][j] and the per-KV-head ranking.
    std::vector<float> z(static_cast<size_t>(G * C));
    std::vector<float> agg(static_cast<size_t>(C), o_.gqa_max ? -INFINITY : 0.0f);
    for (int64_t j = 0; j < C; ++j) {
      const float* cj = hd.clusters[j].centroid.data();
      for (int64_t g = 0; g < G; ++g) {
        float d = 0;
        for (int64_t e = 0; e < D; ++e) d += q[g * D + e] * cj[e];
        z[g * C + j] = d * scale;
        agg[j] = o_.gqa_max ? std::max(agg[j], z[g * C + j]) : agg[j] + z[g * C + j] / G;
      }
    }
    std::vector<int64_t> order(static_cast<size_t>(C));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return agg[a] > agg[b]; });
    const auto zone = [&](double ratio) {
      return static_cast<int64_t>(std::ceil(ratio * static_cast<double>(C) - 1e-9));
    };
    const int64_t R = std::min(C, std::max(o_.min_retrieved, zone(o_.retrieval_ratio)));
    const int64_t E = std::min(C - R, zone(o_.estimation_ratio));
    // Exact tokens: sinks, the tail up to pos, the retrieved clusters' members.
    std::vector<int32_t> exact;
    for (int64_t t = 0; t < std::min(o_.sinks, s.tail_start); ++t)
      exact.push_back(static_cast<int32_t>(t));
    for (int64_t t = s.tail_start; t <= pos; ++t) exact.push_back(static_cast<int32_t>(t));
    const size_t cache_cap = static_cast<size_t>(
        std::max<double>(1.0, std::ceil(o_.cache_multiple * static_cast<double>(R))));
    std::vector<int64_t> evicted;
    for (int64_t r = 0; r < R; ++r) {
      const Cluster& cl = hd.clusters[order[r]];
      exact.insert(exact.end(), cl.members.begin(), cl.members.end());
      if (decode) {
        cache_lookups_ += 1;
        if (hd.cache.touch(order[r], cache_cap, &evicted)) {
          cache_hits_ += 1;
        } else {
          miss_bytes_ += 2.0 * static_cast<double>(cl.members.size()) * D * 4;
        }
      }
    }
    rows_ += 1;
    retrieved_clusters_ += static_cast<double>(R);
    estimated_clusters_ += static_cast<double>(E);
    exact_tokens_ += static_cast<double>(exact.size());
    visible_tokens_ += static_cast<double>(pos + 1);
    // One softmax over the exact tokens and the estimated clusters: a cluster j is one entry of
    // logit z_j + log n_j whose value is its mean V_j / n_j.
    const auto nx = static_cast<int64_t>(exact.size());
    std::vector<float> logit(exact.size() + static_cast<size_t>(E));
    std::vector<double> acc(static_cast<size_t>(D));
    auto estimated = [&](int64_t j) -> const Cluster& { return hd.clusters[order[R + j - nx]]; };
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = q + g * D;
      for (int64_t r = 0; r < E; ++r)
        logit[nx + r] = z[g * C + order[R + r]] +
                        std::log(static_cast<float>(hd.clusters[order[R + r]].members.size()));
      attend_entries_f64(
          qg, D, scale, nx, nx + E, [&](int64_t j) { return y.k.data() + exact[j] * W + h * D; },
          [&](int64_t j) {
            return j < nx ? y.v.data() + exact[j] * W + h * D : estimated(j).value_sum.data();
          },
          [&](int64_t j) {
            return j < nx ? 1.0 : 1.0 / static_cast<double>(estimated(j).members.size());
          },
          logit.data(), acc.data(), out + g * D);
      if (o_.measure_recall) recall(y, h, qg, pos, scale, exact);
    }
  }

  // The share of the exact softmax mass (over every visible token) that the exact set holds.
  void recall(const Layer& y, int64_t h, const float* qg, int64_t pos, float scale,
              const std::vector<int32_t>& exact) {
    const int64_t W = ctx_.config.kv_dim(), D = ctx_.config.head_dim;
    std::vector<float> l(static_cast<size_t>(pos + 1));
    float mx = -INFINITY;
    for (int64_t t = 0; t <= pos; ++t) {
      const float* kt = y.k.data() + t * W + h * D;
      float d = 0;
      for (int64_t e = 0; e < D; ++e) d += qg[e] * kt[e];
      l[t] = d * scale;
      mx = std::max(mx, l[t]);
    }
    double all = 0, kept = 0;
    for (int64_t t = 0; t <= pos; ++t) all += std::exp(static_cast<double>(l[t] - mx));
    for (int32_t t : exact) kept += std::exp(static_cast<double>(l[t] - mx));
    recall_sum_ += kept / all;
    recall_n_ += 1;
  }

  CacheContext ctx_;
  RetroOptions o_;
  double rows_ = 0, retrieved_clusters_ = 0, estimated_clusters_ = 0, exact_tokens_ = 0,
         visible_tokens_ = 0, recall_sum_ = 0, recall_n_ = 0, cache_lookups_ = 0, cache_hits_ = 0,
         miss_bytes_ = 0, decode_rows_ = 0;
};

MethodInfo retroinfer_info() {
  MethodInfo m = method_listing(
      "retroinfer",
      "RetroInfer: keys clustered after the prompt; exact steady zone + exact top clusters + "
      "centroid-estimated next clusters in one softmax; clustered KV on the host",
      "Chen et al., RetroInfer: A Vector-Storage Approach for Scalable Long-Context LLM Inference, "
      "VLDB 2026 (arXiv 2505.02922)",
      {int_param("sinks", 4, 0, 1 << 20, "first tokens kept exact on the device (steady zone)"),
       int_param("steady_recent", 64, 0, 1 << 20,
                 "last prompt tokens kept exact (steady zone); later tokens join the tail"),
       int_param("cluster_size", 16, 1, 4096, "average tokens per cluster"),
       int_param("segment", 8192, 1, 1 << 24, "tokens per k-means segment"),
       int_param("kmeans_iters", 10, 1, 100, "Lloyd rounds of the spherical k-means"),
       float_param("retrieval_ratio", 0.018, 0.0, 1.0,
                   "share of the clusters read exactly (the retrieval zone)"),
       float_param("estimation_ratio", 0.232, 0.0, 1.0,
                   "share of the clusters estimated from their centroid (0: no estimation zone)"),
       int_param("min_retrieved", 1, 0, 1 << 20, "at least this many clusters read exactly"),
       string_param("gqa_agg", "max", {"max", "mean"},
                    "how a KV head ranks clusters from its query heads' scores"),
       float_param("cache_multiple", 3.0, 0.0, 1000.0,
                   "device cache of retrieved clusters per KV head, in retrieval zones (LRU)"),
       int_param("reindex_every", 1024, 1, 1 << 24,
                 "tokens past the tail clustered into the index at a time"),
       bool_param("measure_recall", true,
                  "also compute exact attention to report attention_mass_recall (CPU cost)")});
  m.caps.tiers = true;
  m.caps.query_aware = true;
  m.caps.cpu_only = true;  // the wave index and its buffer are host fp32 code
  m.caps.fp32_only = true;
  return m;
}

std::unique_ptr<KvCache> make_retroinfer(const CacheContext& ctx, const nlohmann::json& p) {
  RetroOptions o;
  o.sinks = p["sinks"].get<int64_t>();
  o.steady_recent = p["steady_recent"].get<int64_t>();
  o.clusters.cluster_size = p["cluster_size"].get<int64_t>();
  o.clusters.segment = p["segment"].get<int64_t>();
  o.clusters.iters = p["kmeans_iters"].get<int>();
  o.retrieval_ratio = p["retrieval_ratio"].get<double>();
  o.estimation_ratio = p["estimation_ratio"].get<double>();
  o.min_retrieved = p["min_retrieved"].get<int64_t>();
  o.gqa_max = p["gqa_agg"] == "max";
  o.cache_multiple = p["cache_multiple"].get<double>();
  o.reindex_every = p["reindex_every"].get<int64_t>();
  o.measure_recall = p["measure_recall"].get<bool>();
  KVB_CHECK(o.retrieval_ratio + o.estimation_ratio <= 1.0 + 1e-9,
            "method retroinfer: retrieval_ratio + estimation_ratio is ",
            o.retrieval_ratio + o.estimation_ratio, " (at most 1: they share the clusters)");
  return std::make_unique<RetroinferKvCache>(ctx, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(retroinfer, kvb::retroinfer_info, kvb::make_retroinfer);
