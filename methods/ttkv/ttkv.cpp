// ttkv: TTKV, a temporal-tiered KV cache (arXiv 2604.19769: the
// abstract and a secondary summary only, no code: most of this is the [inferred] design the spec
// writes down). The sequence is cut into blocks of `block_size` tokens. The fast tier (the device)
// holds the first `sink_blocks` blocks and the newest `fast_blocks` complete blocks (plus the open
// block) exactly; older blocks are demoted to the slow tier (the host), quantized with keys at
// higher precision than values (keys per channel over the block's tokens, values per token in
// channel groups, quantize.h), and leave a per-head summary on the device: each channel's min and
// max key (fp16). At every query row once blocks are demoted, each KV head ranks the slow blocks by
// the Quest bound sum_c max(q_c min_c, q_c max_c) (the group's query heads aggregated by max),
// streams the top `top_k_blocks` in, dequantizes them and attends over fast tier + those blocks in
// one softmax. Demotion runs at the end of every step; a step attends exactly while nothing has
// been demoted (a prompt prefilled in one chunk).

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "harness/common/error.h"
#include "harness/kv/attention.h"
#include "harness/kv/method_registry.h"
#include "kvb/kernels/half.h"
#include "kvb/kernels/quantize.h"
#include "methods/common/kv_codec.h"
#include "methods/common/method_listing.h"
#include "methods/common/row_attention.h"
#include "methods/common/seq_store.h"

namespace kvb {
namespace {

struct TtkvOptions {
  int64_t block = 64;
  int64_t sink_blocks = 1;
  int64_t fast_blocks = 4;
  int64_t top_k = 4;
  int32_t k_bits = 8;
  int32_t v_bits = 4;
  int64_t v_group = 32;  // adapted to head_dim
};

// One demoted block of one layer: quantize.h matrices [block, kv_dim] for K (kColumn, group =
// block) and V (kRow, group = v_group), and per (head, channel) the min / max key as fp16.
struct SlowBlock {
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<uint16_t> k_scales, k_mins, v_scales, v_mins;
  std::vector<uint16_t> key_min, key_max;  // [kv_dim] fp16 (rounded down / up: a safe bound)
  int64_t bytes() const {
    return static_cast<int64_t>(
        k_codes.size() + v_codes.size() +
        2 * (k_scales.size() + k_mins.size() + v_scales.size() + v_mins.size()));
  }
};

struct TtkvLayer {
  // Fast tier rows [rows, kv_dim] fp32: the sink blocks' tokens, then tokens [fast_start, len).
  std::vector<float> k, v;
  std::vector<SlowBlock> slow;  // demoted blocks in order: logical blocks sink_blocks, ...
};
struct TtkvSeq {
  explicit TtkvSeq(int64_t n_layers) : layers(static_cast<size_t>(n_layers)) {}
  std::vector<TtkvLayer> layers;
  int64_t len = 0;
};

class TtkvKvCache : public SeqStore<TtkvSeq> {
 public:
  TtkvKvCache(const CacheContext& ctx, TtkvOptions o) : SeqStore("ttkv"), ctx_(ctx), o_(o) {
    o_.v_group = adapt_channel_group(o_.v_group, ctx_.config.head_dim);
    const int64_t W = ctx_.config.kv_dim();
    kshape_ = {o_.k_bits, o_.block, W, o_.block, kernels::QuantAxis::kColumn};
    vshape_ = {o_.v_bits, o_.block, W, o_.v_group, kernels::QuantAxis::kRow};
    for (const auto* s : {&kshape_, &vshape_}) {
      const std::string why = kernels::group_quant_check(*s);
      KVB_CHECK(why.empty(), "method ttkv: ", why);
    }
  }

  at::Tensor attend(const LayerInput& in) override {
    const StepBatch& batch = *in.batch;
    const auto& c = ctx_.config;
    const int64_t W = c.kv_dim(), D = c.head_dim, Hkv = c.n_kv_heads, Hq = c.n_heads,
                  G = c.group_size();
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      Layer& y = s.layers[in.layer];
      const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b], past = s.len;
      at::Tensor kn = in.k->narrow(0, start, n).to(at::kFloat).contiguous();
      at::Tensor vn = in.v->narrow(0, start, n).to(at::kFloat).contiguous();
      // Fast rows: tokens [fast_start, past + n) after the sink blocks' rows.
      y.k.insert(y.k.end(), kn.data_ptr<float>(), kn.data_ptr<float>() + n * W);
      y.v.insert(y.v.end(), vn.data_ptr<float>(), vn.data_ptr<float>() + n * W);
      at::Tensor q = in.q->narrow(0, start, n);
      if (y.slow.empty()) {  // everything is still in the fast tier: exact attention
        const int64_t L = static_cast<int64_t>(y.k.size()) / W;
        outs.push_back(attend_dense_rows(q, y.k.data(), y.v.data(), L, Hkv, D, in.sm_scale));
        continue;
      }
      at::Tensor qf = q.to(at::kFloat).contiguous();
      at::Tensor o = at::zeros({n, Hq, D}, at::kFloat);
      // Which slow blocks each row and head reads; each selected block is dequantized once.
      std::vector<std::vector<int64_t>> sel(static_cast<size_t>(n * Hkv));
      std::vector<int64_t> wanted;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < Hkv; ++h) {
          sel[i * Hkv + h] = rank_blocks(y, qf.data_ptr<float>() + (i * Hq + h * G) * D, h);
          wanted.insert(wanted.end(), sel[i * Hkv + h].begin(), sel[i * Hkv + h].end());
          // A head's share of a block (its channels of the codes and metadata) crosses the tiers.
          if (n == 1)
            streamed_decode_bytes_ += static_cast<double>(sel[i * Hkv + h].size()) *
                                      static_cast<double>(y.slow[0].bytes()) /
                                      static_cast<double>(Hkv);
        }
      // A decode row also measures how well the bound ranks: every block is dequantized then.
      const bool measure = n == 1 && static_cast<int64_t>(y.slow.size()) > o_.top_k;
      if (measure) {
        wanted.resize(y.slow.size());
        std::iota(wanted.begin(), wanted.end(), 0);
      }
      std::sort(wanted.begin(), wanted.end());
      wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
      std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> deq;
      for (int64_t blk : wanted) deq[blk] = dequantize(y.slow[blk]);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < Hkv; ++h) {
          const float* qi = qf.data_ptr<float>() + (i * Hq + h * G) * D;
          attend_row(s, y, h, qi, o.data_ptr<float>() + (i * Hq + h * G) * D, past + i, in.sm_scale,
                     sel[i * Hkv + h], deq);
          if (measure) block_recall(y, h, qi, in.sm_scale, sel[i * Hkv + h], deq);
        }
      outs.push_back(o.to(q.scalar_type()));
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  }

  void end_step(const StepBatch& batch) override {
    SeqStore::end_step(batch);
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      if (batch.new_tokens(b) == 1) decode_tokens_ += 1;
      demote(seqs_.at(batch.seq_ids[b]));
    }
  }

  void truncate(int64_t seq_id, int64_t new_len) override {
    Seq& s = seqs_.truncating(seq_id, new_len);
    const int64_t first_fast = fast_start(s);
    KVB_CHECK(new_len >= first_fast, "ttkv: cannot truncate sequence ", seq_id, " to ", new_len,
              " tokens: tokens before ", first_fast, " were demoted to the slow tier (quantized)");
    const int64_t W = ctx_.config.kv_dim();
    const int64_t sink_rows = std::min(s.len, o_.sink_blocks * o_.block);
    const int64_t keep_rows =
        new_len >= sink_rows && first_fast > 0 ? sink_rows + (new_len - first_fast) : new_len;
    for (auto& y : s.layers) {
      y.k.resize(static_cast<size_t>(keep_rows * W));
      y.v.resize(static_cast<size_t>(keep_rows * W));
    }
    s.len = new_len;
  }

  Footprint footprint() const override {
    return fp32_footprint(ctx_.config, [](const Seq& s, Footprint* f) {
      for (const auto& y : s.layers) {
        const auto exact = static_cast<int64_t>((y.k.size() + y.v.size()) * sizeof(float));
        f->device_payload_bytes += exact;
        // The exact tier's rows are in the model dtype; the slow tier is codes and fp16 bounds.
        f->model_dtype_device_bytes += exact;
        for (const auto& blk : y.slow) {
          f->device_metadata_bytes +=
              static_cast<int64_t>(2 * (blk.key_min.size() + blk.key_max.size()));
          f->host_bytes += blk.bytes();
        }
      }
    });
  }

  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m = {
        {"block_size", static_cast<double>(o_.block)},
        {"sink_blocks", static_cast<double>(o_.sink_blocks)},
        {"fast_blocks", static_cast<double>(o_.fast_blocks)},
        {"top_k_blocks", static_cast<double>(o_.top_k)},
        {"k_bits", static_cast<double>(o_.k_bits)},
        {"v_bits", static_cast<double>(o_.v_bits)},
        {"v_group_size", static_cast<double>(o_.v_group)},
        {"slow_k_bits_per_element", kernels::group_quant_bits_per_element(kshape_)},
        {"slow_v_bits_per_element", kernels::group_quant_bits_per_element(vshape_)}};
    // Per decoded token, all layers: the slow-tier bytes its KV heads streamed in.
    if (decode_tokens_ > 0)
      m["cross_tier_bytes_per_step"] = streamed_decode_bytes_ / decode_tokens_;
    if (decode_tokens_ > 0)
      m["decode_h2d_bytes_per_token"] = streamed_decode_bytes_ / decode_tokens_;
    if (recall_n_ > 0) m["block_recall"] = recall_sum_ / recall_n_;
    double slow = 0, fast = 0;
    for (const auto& [id, s] : seqs_) {
      slow += static_cast<double>(s.layers.empty() ? 0 : s.layers[0].slow.size()) * o_.block;
      fast +=
          static_cast<double>(s.len) - (s.layers.empty() ? 0 : s.layers[0].slow.size()) * o_.block;
    }
    m["slow_tokens"] = slow;
    m["fast_tokens"] = fast;
    return m;
  }

 private:
  using Layer = TtkvLayer;
  using Seq = TtkvSeq;

  Seq new_seq(int64_t) override { return Seq(ctx_.config.n_layers); }
  // First token of the fast tier's recent part (after the sinks and the demoted blocks).
  int64_t fast_start(const Seq& s) const {
    const int64_t demoted = s.layers.empty() ? 0 : static_cast<int64_t>(s.layers[0].slow.size());
    return demoted == 0 ? 0 : (o_.sink_blocks + demoted) * o_.block;
  }

  // Demotes every complete block older than the newest fast_blocks complete blocks.
  void demote(Seq& s) {
    const int64_t W = ctx_.config.kv_dim();
    const int64_t complete = s.len / o_.block;
    const int64_t demoted = static_cast<int64_t>(s.layers[0].slow.size());
    // Complete blocks after the sinks that are not among the newest fast_blocks.
    const int64_t target = std::max<int64_t>(0, complete - o_.sink_blocks - o_.fast_blocks);
    for (int64_t d = demoted; d < target; ++d) {
      // The block's rows in the fast arrays: after the sink rows, the oldest recent rows.
      const int64_t sink_rows = o_.sink_blocks * o_.block;
      for (auto& y : s.layers) {
        const float* kb = y.k.data() + sink_rows * W;
        const float* vb = y.v.data() + sink_rows * W;
        y.slow.push_back(quantize(kb, vb));
        y.k.erase(y.k.begin() + sink_rows * W, y.k.begin() + (sink_rows + o_.block) * W);
        y.v.erase(y.v.begin() + sink_rows * W, y.v.begin() + (sink_rows + o_.block) * W);
      }
    }
  }

  SlowBlock quantize(const float* k, const float* v) const {
    const int64_t W = ctx_.config.kv_dim();
    SlowBlock b;
    b.k_codes.resize(static_cast<size_t>(kernels::group_quant_code_bytes(kshape_)));
    b.k_scales.resize(static_cast<size_t>(kernels::group_quant_num_groups(kshape_)));
    b.k_mins.resize(b.k_scales.size());
    b.v_codes.resize(static_cast<size_t>(kernels::group_quant_code_bytes(vshape_)));
    b.v_scales.resize(static_cast<size_t>(kernels::group_quant_num_groups(vshape_)));
    b.v_mins.resize(b.v_scales.size());
    kernels::GroupQuantizeParams kp{kshape_,        k, 0, b.k_codes.data(), b.k_scales.data(),
                                    b.k_mins.data()};
    kernels::GroupQuantizeParams vp{vshape_,        v, 0, b.v_codes.data(), b.v_scales.data(),
                                    b.v_mins.data()};
    kernels::group_quantize_cpu(kp);
    kernels::group_quantize_cpu(vp);
    // The summary comes from the exact keys, rounded outward so it still bounds them.
    b.key_min.resize(static_cast<size_t>(W));
    b.key_max.resize(static_cast<size_t>(W));
    for (int64_t ch = 0; ch < W; ++ch) {
      float mn = INFINITY, mx = -INFINITY;
      for (int64_t t = 0; t < o_.block; ++t) {
        mn = std::min(mn, k[t * W + ch]);
        mx = std::max(mx, k[t * W + ch]);
      }
      b.key_min[ch] = kernels::float_to_half_down(mn);
      b.key_max[ch] = kernels::float_to_half_up(mx);
    }
    return b;
  }

  std::pair<std::vector<float>, std::vector<float>> dequantize(const SlowBlock& b) const {
    const int64_t W = ctx_.config.kv_dim();
    std::vector<float> k(static_cast<size_t>(o_.block * W)), v(k.size());
    kernels::GroupDequantizeParams kp{kshape_,         b.k_codes.data(), b.k_scales.data(),
                                      b.k_mins.data(), k.data(),         0};
    kernels::GroupDequantizeParams vp{vshape_,         b.v_codes.data(), b.v_scales.data(),
                                      b.v_mins.data(), v.data(),         0};
    kernels::group_dequantize_cpu(kp);
    kernels::group_dequantize_cpu(vp);
    return {std::move(k), std::move(v)};
  }

  // The top_k slow blocks of KV head h for the group's query rows q [G, D], ascending.
  std::vector<int64_t> rank_blocks(const Layer& y, const float* q, int64_t h) const {
    const int64_t D = ctx_.config.head_dim, G = ctx_.config.group_size();
    const int64_t nb = static_cast<int64_t>(y.slow.size());
    std::vector<float> score(static_cast<size_t>(nb), -INFINITY);
    for (int64_t j = 0; j < nb; ++j)
      for (int64_t g = 0; g < G; ++g) {
        float u = 0;
        for (int64_t c = 0; c < D; ++c) {
          const float qc = q[g * D + c];
          const float mn = kernels::half_to_float(y.slow[j].key_min[h * D + c]);
          const float mx = kernels::half_to_float(y.slow[j].key_max[h * D + c]);
          u += std::max(qc * mn, qc * mx);
        }
        score[j] = std::max(score[j], u);
      }
    std::vector<int64_t> idx(static_cast<size_t>(nb));
    std::iota(idx.begin(), idx.end(), 0);
    const int64_t k = std::min(o_.top_k, nb);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    });
    idx.resize(static_cast<size_t>(k));
    std::sort(idx.begin(), idx.end());
    return idx;
  }

  // One query row's group at position pos over the fast tier (causal) and the selected slow blocks.
  void attend_row(const Seq& s, const Layer& y, int64_t h, const float* q, float* out, int64_t pos,
                  float scale, const std::vector<int64_t>& sel,
                  const std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>>& deq) {
    const int64_t W = ctx_.config.kv_dim(), D = ctx_.config.head_dim, G = ctx_.config.group_size();
    const int64_t sink_rows = o_.sink_blocks * o_.block, first = fast_start(s);
    // Rows: (pointer to K row, pointer to V row) of every token this row reads.
    std::vector<std::pair<const float*, const float*>> rows;
    for (int64_t r = 0; r < sink_rows; ++r)
      rows.push_back({&y.k[r * W + h * D], &y.v[r * W + h * D]});
    for (int64_t t = first; t <= pos; ++t) {
      const int64_t r = sink_rows + (t - first);
      rows.push_back({&y.k[r * W + h * D], &y.v[r * W + h * D]});
    }
    for (int64_t blk : sel) {
      const auto& kv = deq.at(blk);
      for (int64_t t = 0; t < o_.block; ++t)
        rows.push_back({&kv.first[t * W + h * D], &kv.second[t * W + h * D]});
    }
    const auto m = static_cast<int64_t>(rows.size());
    std::vector<float> logit(rows.size());
    std::vector<double> acc(static_cast<size_t>(D));
    for (int64_t g = 0; g < G; ++g)
      attend_entries_f64(
          q + g * D, D, scale, m, m, [&](int64_t j) { return rows[j].first; },
          [&](int64_t j) { return rows[j].second; }, [](int64_t) { return 1.0; }, logit.data(),
          acc.data(), out + g * D);
  }

  // Of the slow blocks' attention mass under the dequantized keys (the best the slow tier can
  // tell), the share held by the selected blocks: how well the summary bound ranks.
  void block_recall(
      const Layer& y, int64_t h, const float* q, float scale, const std::vector<int64_t>& sel,
      const std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>>& deq) {
    const int64_t W = ctx_.config.kv_dim(), D = ctx_.config.head_dim, G = ctx_.config.group_size();
    const int64_t nb = static_cast<int64_t>(y.slow.size());
    std::vector<double> mass(static_cast<size_t>(nb), 0.0);
    std::vector<float> logit(static_cast<size_t>(nb * o_.block));
    for (int64_t g = 0; g < G; ++g) {
      float mx = -INFINITY;
      for (int64_t j = 0; j < nb; ++j) {
        const std::vector<float>& kb = deq.at(j).first;
        for (int64_t t = 0; t < o_.block; ++t) {
          float d = 0;
          for (int64_t e = 0; e < D; ++e) d += q[g * D + e] * kb[t * W + h * D + e];
          logit[j * o_.block + t] = d * scale;
          mx = std::max(mx, logit[j * o_.block + t]);
        }
      }
      double all = 0;
      std::vector<double> m(static_cast<size_t>(nb), 0.0);
      for (int64_t j = 0; j < nb; ++j)
        for (int64_t t = 0; t < o_.block; ++t) {
          const double p = std::exp(static_cast<double>(logit[j * o_.block + t] - mx));
          m[j] += p;
          all += p;
        }
      for (int64_t j = 0; j < nb; ++j) mass[j] += m[j] / all / static_cast<double>(G);
    }
    double kept = 0;
    for (int64_t j : sel) kept += mass[j];
    recall_sum_ += kept;
    recall_n_ += 1;
  }

  CacheContext ctx_;
  TtkvOptions o_;
  kernels::GroupQuantShape kshape_, vshape_;
  double decode_tokens_ = 0, streamed_decode_bytes_ = 0, recall_sum_ = 0, recall_n_ = 0;
};

MethodInfo ttkv_info() {
  MethodInfo m = method_listing(
      "ttkv",
      "TTKV: temporal tiers: sinks + recent blocks exact on the device, older blocks quantized "
      "(K > V bits) on the host; top-k blocks by a min/max key bound streamed in per query",
      "TTKV: temporal-tiered KV cache (arXiv 2604.19769; design inferred from the abstract)",
      {int_param("block_size", 64, 1, 4096,
                 "tokens per block (the unit of demotion and streaming)"),
       int_param("sink_blocks", 1, 0, 1 << 20, "first blocks kept in the fast tier"),
       int_param("fast_blocks", 4, 0, 1 << 20, "newest complete blocks kept in the fast tier"),
       int_param("top_k_blocks", 4, 0, 1 << 20,
                 "slow blocks streamed in per query row and KV head"),
       int_param("k_bits", 8, 2, 8,
                 "slow-tier key bits (2, 3, 4 or 8), per channel over the block"),
       int_param("v_bits", 4, 2, 8, "slow-tier value bits (2, 3, 4 or 8), per token"),
       int_param("v_group_size", 32, 1, 4096,
                 "channels per value group (reduced to the largest divisor of head_dim)")});
  m.caps.quantizes = true;
  m.caps.tiers = true;
  m.caps.query_aware = true;
  m.caps.cpu_only = true;  // its tiers are host fp32 code
  m.caps.fp32_only = true;
  return m;
}

std::unique_ptr<KvCache> make_ttkv(const CacheContext& ctx, const nlohmann::json& p) {
  TtkvOptions o;
  o.block = p["block_size"].get<int64_t>();
  o.sink_blocks = p["sink_blocks"].get<int64_t>();
  o.fast_blocks = p["fast_blocks"].get<int64_t>();
  o.top_k = p["top_k_blocks"].get<int64_t>();
  o.k_bits = p["k_bits"].get<int32_t>();
  o.v_bits = p["v_bits"].get<int32_t>();
  o.v_group = p["v_group_size"].get<int64_t>();
  for (auto [name, bits] :
       {std::pair<const char*, int32_t>{"k_bits", o.k_bits}, {"v_bits", o.v_bits}})
    KVB_CHECK(kernels::quant_bits_supported(bits), "method ttkv.", name, ": ", bits,
              " is not a supported width (allowed: 2, 3, 4, 8)");
  return std::make_unique<TtkvKvCache>(ctx, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(ttkv, kvb::ttkv_info, kvb::make_ttkv);
