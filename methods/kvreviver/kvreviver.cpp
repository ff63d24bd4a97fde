// kvreviver: recent + candidate tokens exact, the rest merged into per-head buckets (default) or
// folded into per-head count-sketches that attention reconstructs (see kvreviver.h and README.md).

#include "methods/kvreviver/kvreviver.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "kvb/kernels/cpu_ops.h"
#include "methods/common/eviction_select.h"
#include "methods/common/method_listing.h"
#include "methods/common/row_attention.h"

namespace kvb {
namespace kvreviver {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

CountSketch::CountSketch(int64_t depth, int64_t width, int64_t dim, uint64_t seed)
    : depth_(depth), width_(width), dim_(dim), seed_(seed) {
  KVB_CHECK(depth >= 1 && depth <= kMaxDepth, "kvreviver: sketch depth ", depth, " is outside 1..",
            kMaxDepth);
  KVB_CHECK(width >= 1 && dim >= 1, "kvreviver: sketch width ", width, " and dim ", dim,
            " must be >= 1");
}

uint64_t CountSketch::hash(int64_t row, uint64_t key) const {
  return splitmix64(splitmix64(seed_ ^ (static_cast<uint64_t>(row) * 0xd1b54a32d192ed03ULL)) ^ key);
}

int64_t CountSketch::bucket(int64_t row, uint64_t key) const {
  return static_cast<int64_t>(hash(row, key) % static_cast<uint64_t>(width_));
}

float CountSketch::sign(int64_t row, uint64_t key) const {
  return (hash(row, key) >> 63) != 0 ? -1.f : 1.f;
}

void CountSketch::add(uint64_t key, const float* x) {
  if (table_.empty()) table_.assign(static_cast<size_t>(depth_ * width_ * dim_), 0.f);
  for (int64_t r = 0; r < depth_; ++r) {
    const uint64_t hv = hash(r, key);
    const float s = (hv >> 63) != 0 ? -1.f : 1.f;
    float* b = table_.data() + (r * width_ + static_cast<int64_t>(hv % width_)) * dim_;
    for (int64_t c = 0; c < dim_; ++c) b[c] += s * x[c];
  }
}

void CountSketch::reconstruct(uint64_t key, float* out) const {
  if (table_.empty()) {
    std::fill(out, out + dim_, 0.f);
    return;
  }
  // depth <= kMaxDepth (the parameter's range).
  float e[kMaxDepth], signs[kMaxDepth];
  const float* rows[kMaxDepth];
  for (int64_t r = 0; r < depth_; ++r) {
    const uint64_t hv = hash(r, key);
    signs[r] = (hv >> 63) != 0 ? -1.f : 1.f;
    rows[r] = table_.data() + (r * width_ + static_cast<int64_t>(hv % width_)) * dim_;
  }
  for (int64_t c = 0; c < dim_; ++c) {
    for (int64_t r = 0; r < depth_; ++r) e[r] = signs[r] * rows[r][c];
    if (depth_ == 1) {
      out[c] = e[0];
    } else if (depth_ == 2) {
      out[c] = 0.5f * (e[0] + e[1]);
    } else {
      std::sort(e, e + depth_);
      out[c] = depth_ % 2 == 1 ? e[depth_ / 2] : 0.5f * (e[depth_ / 2 - 1] + e[depth_ / 2]);
    }
  }
}

MergeBuckets::MergeBuckets(int64_t width, int64_t dim, bool positions)
    : width_(width), dim_(dim), positions_(positions) {
  KVB_CHECK(width >= 1 && dim >= 1, "kvreviver: merge width ", width, " and dim ", dim,
            " must be >= 1");
}

int64_t MergeBuckets::nearest(const float* k) const {
  int64_t best = -1;
  double best_d = std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < used_; ++b) {
    const float* s = ksum_.data() + b * dim_;
    const double inv = 1.0 / static_cast<double>(count_[b]);
    double d = 0;
    for (int64_t c = 0; c < dim_; ++c) {
      const double e = static_cast<double>(s[c]) * inv - k[c];
      d += e * e;
    }
    if (d < best_d) {
      best_d = d;
      best = b;
    }
  }
  return best;
}

int64_t MergeBuckets::add(const float* k, const float* v, int64_t pos) {
  if (ksum_.empty()) {
    ksum_.assign(static_cast<size_t>(width_ * dim_), 0.f);
    vsum_.assign(static_cast<size_t>(width_ * dim_), 0.f);
    count_.assign(static_cast<size_t>(width_), 0);
    if (positions_) pos_sum_.assign(static_cast<size_t>(width_), 0);
  }
  const int64_t b = used_ < width_ ? used_++ : nearest(k);
  float* ks = ksum_.data() + b * dim_;
  float* vs = vsum_.data() + b * dim_;
  for (int64_t c = 0; c < dim_; ++c) {
    ks[c] += k[c];
    vs[c] += v[c];
  }
  count_[b] += 1;
  if (positions_) pos_sum_[b] += pos;
  return b;
}

int64_t MergeBuckets::tokens() const {
  int64_t n = 0;
  for (int64_t b = 0; b < used_; ++b) n += count_[b];
  return n;
}

int64_t MergeBuckets::position(int64_t b) const {
  KVB_ASSERT(positions_ && b >= 0 && b < used_, "kvreviver", "bucket ", b, " has no position");
  return std::llround(static_cast<double>(pos_sum_[b]) / static_cast<double>(count_[b]));
}

void MergeBuckets::centroid(int64_t b, float* k_out, float* v_out) const {
  const float inv = 1.f / static_cast<float>(count_[b]);
  const float* ks = ksum_.data() + b * dim_;
  const float* vs = vsum_.data() + b * dim_;
  for (int64_t c = 0; c < dim_; ++c) {
    k_out[c] = ks[c] * inv;
    v_out[c] = vs[c] * inv;
  }
}

int64_t MergeBuckets::bytes() const {
  if (ksum_.empty()) return 0;
  return width_ *
         (2 * dim_ * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(int32_t)) +
          (positions_ ? static_cast<int64_t>(sizeof(int64_t)) : 0));
}

}  // namespace kvreviver

namespace {
double sq_dist(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i] - b[i]) * (a[i] - b[i]);
  return s;
}
double sq_norm(const float* a, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
  return s;
}
}  // namespace

KvReviverKvCache::KvReviverKvCache(const CacheContext& ctx, Options opts)
    : SeqStore("kvreviver"),
      HeadGeometry(ctx),
      ctx_(ctx),
      opts_(std::move(opts)),
      heads_({"kvreviver", D_, at::kFloat, at::Device(at::kCPU), true, 16, true, opts_.codec}) {}

KvReviverKvCache::Seq KvReviverKvCache::new_seq(int64_t) {
  Seq s;
  s.heads.assign(static_cast<size_t>(L_), std::vector<Head>(static_cast<size_t>(Hkv_)));
  for (int64_t l = 0; l < L_; ++l) {
    for (int64_t h = 0; h < Hkv_; ++h) {
      const uint64_t hs = opts_.seed * 1000003ULL + static_cast<uint64_t>(l * Hkv_ + h) * 2;
      Head& hd = s.heads[l][h];
      hd.sk = kvreviver::CountSketch(opts_.depth, opts_.width, D_, hs);
      hd.sv = kvreviver::CountSketch(opts_.depth, opts_.width, D_, hs + 1);
      hd.mb = kvreviver::MergeBuckets(opts_.width, D_, opts_.keys_pre_rope);
      if (opts_.codec) heads_.make_streams(hd, static_cast<int>(l));
    }
  }
  return s;
}

void KvReviverKvCache::ensure_rope(int64_t n_pos) {
  if (n_pos <= rope_len_) return;
  const int64_t len = std::max<int64_t>({n_pos, 2 * rope_len_, 1024});
  compute_rope_tables(ctx_.config, len, &rope_cos_, &rope_sin_);
  rope_cos_ = rope_cos_.to(at::kFloat).contiguous();
  rope_sin_ = rope_sin_.to(at::kFloat).contiguous();
  rope_nsin_ = rope_sin_.neg().contiguous();
  rope_len_ = len;
}

void KvReviverKvCache::step_begins(Seq& s, const StepBatch& batch, int64_t b) {
  s.step_tokens = batch.new_tokens(b);
  s.pos.resize(static_cast<size_t>(s.seen + s.step_tokens));
  s.epoch.resize(static_cast<size_t>(s.seen + s.step_tokens));
  for (int64_t i = 0; i < s.step_tokens; ++i) {
    const int64_t p = batch.positions[batch.q_indptr[b] + i];
    KVB_CHECK(p >= 0 && p < (int64_t{1} << 31), "kvreviver: position ", p, " out of range");
    s.pos[s.seen + i] = static_cast<int32_t>(p);
    s.epoch[s.seen + i] = s.cur_epoch;
  }
  for (auto& layer : s.heads)
    for (auto& h : layer) heads_.reserve(h, h.len + s.step_tokens);
}

std::vector<int32_t> KvReviverKvCache::vague_tokens(const Seq&, const Head& h, int64_t seen) const {
  std::vector<int32_t> out;
  int64_t j = 0;
  for (int32_t t = 0; t < seen; ++t) {
    while (j < h.len && h.idx[j] < t) ++j;
    if (j < h.len && h.idx[j] == t) continue;
    out.push_back(t);
  }
  return out;
}

void KvReviverKvCache::reconstruct(const Seq& s, const Head& h, const std::vector<int32_t>& tokens,
                                   float* k_out, float* v_out) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = tokens[i];
    const uint64_t key = kvreviver::token_key(t, s.epoch[t]);
    h.sk.reconstruct(key, k_out + i * D_);
    h.sv.reconstruct(key, v_out + i * D_);
    pos[i] = s.pos[t];
  }
  if (opts_.keys_pre_rope && n > 0)
    kernels::rope_f32(k_out, n, 1, D_, D_, rope_cos_.data_ptr<float>(), rope_sin_.data_ptr<float>(),
                      pos.data(), ctx_.config.rope_style == RopeStyle::kInterleaved);
}

void KvReviverKvCache::bucket_entries(const Head& h, float* k_out, float* v_out) const {
  const int64_t n = h.mb.used();
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    h.mb.centroid(b, k_out + b * D_, v_out + b * D_);
    if (opts_.keys_pre_rope) pos[b] = h.mb.position(b);
  }
  if (opts_.keys_pre_rope && n > 0)
    kernels::rope_f32(k_out, n, 1, D_, D_, rope_cos_.data_ptr<float>(), rope_sin_.data_ptr<float>(),
                      pos.data(), ctx_.config.rope_style == RopeStyle::kInterleaved);
}

at::Tensor KvReviverKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const int64_t T = batch.num_tokens();
  const int layer = in.layer;
  const auto [q, k, v] = contiguous_rows(in);
  at::Tensor out = at::empty({T, Hq_, D_}, in.q->options());
  const float* Q = q.data_ptr<float>();
  const float* Kin = k.data_ptr<float>();
  const float* Vin = v.data_ptr<float>();
  float* O = out.data_ptr<float>();
  const float scale = in.sm_scale;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b];
    int32_t max_pos = 0;
    for (int64_t t = 0; t < s.seen; ++t) max_pos = std::max(max_pos, s.pos[t]);
    if (opts_.revive && opts_.keys_pre_rope) ensure_rope(max_pos + 1);
    for (int64_t h = 0; h < Hkv_; ++h) {
      Head& hd = s.heads[layer][h];
      // The vague entries first (before the append, so that the exact set is the old one):
      // sketch mode one reconstructed row per vague token, merge mode one centroid per bucket
      // with a log(count) logit bias.
      std::vector<int32_t> vague;
      if (opts_.revive) vague = vague_tokens(s, hd, s.seen);
      const int64_t nv = !opts_.revive ? 0
                         : merge()     ? hd.mb.used()
                                       : static_cast<int64_t>(vague.size());
      scratch_k_.resize(static_cast<size_t>(nv * D_));
      scratch_v_.resize(static_cast<size_t>(nv * D_));
      scratch_bias_.assign(static_cast<size_t>(nv), 0.f);
      if (nv > 0) {
        if (merge()) {
          bucket_entries(hd, scratch_k_.data(), scratch_v_.data());
          for (int64_t j = 0; j < nv; ++j)
            scratch_bias_[j] = std::log(static_cast<float>(hd.mb.count(j)));
        } else {
          reconstruct(s, hd, vague, scratch_k_.data(), scratch_v_.data());
        }
      }
      if (opts_.measure_error && nv > 0) {
        for (size_t i = 0; i < vague.size(); ++i) {
          const int64_t t = vague[i];
          const int64_t r = merge() ? hd.assign[t] : static_cast<int64_t>(i);
          attn_err_k_ += sq_dist(scratch_k_.data() + r * D_, hd.shadow_k.data() + t * D_, D_);
          attn_norm_k_ += sq_norm(hd.shadow_k.data() + t * D_, D_);
          attn_err_v_ += sq_dist(scratch_v_.data() + r * D_, hd.shadow_v.data() + t * D_, D_);
          attn_norm_v_ += sq_norm(hd.shadow_v.data() + t * D_, D_);
        }
      }
      // Append the step's tokens to the exact region (with a codec: as pending fp32 rows).
      const int64_t past = hd.len, rows = past + n;
      KVB_ASSERT(rows <= hd.cap, "kvreviver", "attend before begin_step reserved room");
      if (opts_.codec) {
        hd.pk.resize(static_cast<size_t>((hd.pend + n) * D_));
        hd.pv.resize(hd.pk.size());
      }
      float* K = opts_.codec ? hd.pk.data() + hd.pend * D_ : hd.kv.data_ptr<float>() + past * D_;
      float* V = opts_.codec ? hd.pv.data() + hd.pend * D_
                             : hd.kv.data_ptr<float>() + (hd.cap + past) * D_;  // kv: [2, cap, D]
      for (int64_t i = 0; i < n; ++i) {
        const int64_t src = ((start + i) * Hkv_ + h) * D_;
        float* kd = K + i * D_;
        float* vd = V + i * D_;
        std::memcpy(kd, Kin + src, sizeof(float) * D_);
        std::memcpy(vd, Vin + src, sizeof(float) * D_);
        hd.idx[past + i] = static_cast<int32_t>(s.seen + i);
        hd.acc[past + i] = 0.f;
      }
      if (opts_.codec) hd.pend += n;
      hd.len = rows;
      const float *EK = nullptr, *EV = nullptr;
      heads_.rows_f32(hd, &EK, &EV, &scratch_ek_, &scratch_ev_);
      // One softmax over [vague (all visible, with their logit bias) | exact entries (causal for
      // the new rows)].
      scratch_p_.resize(static_cast<size_t>(nv + rows));
      const float* p = scratch_p_.data();
      const float* VK = scratch_k_.data();
      const float* VV = scratch_v_.data();
      auto key = [&](int64_t j) { return j < nv ? VK + j * D_ : EK + (j - nv) * D_; };
      auto value = [&](int64_t j) { return j < nv ? VV + j * D_ : EV + (j - nv) * D_; };
      for (int64_t i = 0; i < n; ++i) {
        const int64_t m = past + i + 1;
        for (int64_t g = 0; g < G_; ++g) {
          const int64_t qo = ((start + i) * Hq_ + h * G_ + g) * D_;
          const float inv = attend_entries_f32(Q + qo, D_, scale, nv + m, key, value,
                                               scratch_bias_.data(), nv, scratch_p_.data(), O + qo);
          float vague_sum = 0.f;
          for (int64_t j = 0; j < nv; ++j) vague_sum += p[j];
          for (int64_t j = 0; j < m; ++j) hd.acc[j] += p[nv + j] * inv;
          if (nv > 0) {
            vague_mass_ += vague_sum * inv;
            vague_rows_ += 1;
          }
        }
      }
    }
  }
  return out;
}

void KvReviverKvCache::evict_head(Seq& s, int layer, int64_t head) {
  Head& hd = s.heads[layer][head];
  const int64_t B = opts_.budget.per_head(s.seen, Hkv_);
  if (hd.len <= B) return;
  const int64_t recent = std::min<int64_t>(
      B, static_cast<int64_t>(std::floor(opts_.recent_fraction * static_cast<double>(B) + 1e-9)));
  const int64_t heavy = B - recent;
  const int64_t recent_from = hd.len - recent;
  std::vector<int64_t> cand;
  for (int64_t j = 0; j < recent_from; ++j) cand.push_back(j);
  std::vector<int64_t> keep = top_k_slots(hd.acc.data(), cand, heavy);
  for (int64_t j = recent_from; j < hd.len; ++j) keep.push_back(j);
  // Fold the evicted entries into the buckets / sketches: with a codec, as the codec gives them
  // back (the exact rows of earlier steps are gone; this step's rows are still exact).
  const float *EK = nullptr, *EV = nullptr;
  std::vector<float> kbuf, vbuf;
  if (opts_.revive) heads_.rows_f32(hd, &EK, &EV, &kbuf, &vbuf);
  std::vector<float> row(static_cast<size_t>(D_)), rec(static_cast<size_t>(D_)),
      rec_v(static_cast<size_t>(D_));
  size_t ki = 0;
  for (int64_t j = 0; j < hd.len; ++j) {
    if (ki < keep.size() && keep[ki] == j) {
      ++ki;
      continue;
    }
    evicted_entries_++;
    if (!opts_.revive) continue;
    const int32_t t = hd.idx[j];
    const uint64_t key = kvreviver::token_key(t, s.epoch[t]);
    std::memcpy(row.data(), EK + j * D_, sizeof(float) * D_);
    if (opts_.keys_pre_rope) {
      ensure_rope(static_cast<int64_t>(s.pos[t]) + 1);
      const int64_t p = s.pos[t];
      kernels::rope_f32(row.data(), 1, 1, D_, D_, rope_cos_.data_ptr<float>(),
                        rope_nsin_.data_ptr<float>(), &p,
                        ctx_.config.rope_style == RopeStyle::kInterleaved);
    }
    int64_t bucket = -1;
    if (merge()) {
      // Error right after insertion against the bucket's centroid (in the merged space).
      bucket = hd.mb.add(row.data(), EV + j * D_, s.pos[t]);
      hd.mb.centroid(bucket, rec.data(), rec_v.data());
      evict_err_k_ += sq_dist(rec.data(), row.data(), D_);
      evict_err_v_ += sq_dist(rec_v.data(), EV + j * D_, D_);
    } else {
      hd.sk.add(key, row.data());
      hd.sv.add(key, EV + j * D_);
      // Error right after insertion (rotation-invariant: measured in the sketched space).
      hd.sk.reconstruct(key, rec.data());
      evict_err_k_ += sq_dist(rec.data(), row.data(), D_);
      hd.sv.reconstruct(key, rec.data());
      evict_err_v_ += sq_dist(rec.data(), EV + j * D_, D_);
    }
    evict_norm_k_ += sq_norm(row.data(), D_);
    evict_norm_v_ += sq_norm(EV + j * D_, D_);
    if (opts_.measure_error) {
      const size_t need = static_cast<size_t>((t + 1) * D_);
      if (hd.shadow_k.size() < need) {
        hd.shadow_k.resize(std::max(need, static_cast<size_t>(s.seen * D_)));
        hd.shadow_v.resize(hd.shadow_k.size());
      }
      std::memcpy(hd.shadow_k.data() + t * D_, EK + j * D_, sizeof(float) * D_);
      std::memcpy(hd.shadow_v.data() + t * D_, EV + j * D_, sizeof(float) * D_);
      if (merge()) {
        if (hd.assign.size() < static_cast<size_t>(t + 1))
          hd.assign.resize(std::max<size_t>(t + 1, static_cast<size_t>(s.seen)), -1);
        hd.assign[t] = static_cast<int32_t>(bucket);
      }
    }
  }
  heads_.compact(hd, keep);
}

void KvReviverKvCache::end_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    s.seen += s.step_tokens;
    s.step_tokens = 0;
    for (int l = 0; l < L_; ++l) {
      for (int64_t h = 0; h < Hkv_; ++h) {
        evict_head(s, l, h);
        heads_.flush(s.heads[l][h]);  // evict, then encode what is kept
      }
    }
  }
}

void KvReviverKvCache::truncate(int64_t seq_id, int64_t new_len) {
  Seq& s = seqs_.truncating(seq_id, new_len);
  for (auto& layer : s.heads) {
    for (auto& h : layer) {
      const int64_t keep =
          std::lower_bound(h.idx.begin(), h.idx.begin() + h.len, static_cast<int32_t>(new_len)) -
          h.idx.begin();
      // Vague tokens past the cut cannot be subtracted exactly: in sketch mode they stay as noise
      // in their buckets (the new epoch gives re-appended token indices fresh buckets); in merge
      // mode they stay in their buckets' sums and counts, i.e. they are still attended.
      const int64_t vague_before = s.seen - h.len, vague_after = new_len - keep;
      if (opts_.revive) stale_sketch_tokens_ += vague_before - vague_after;
      heads_.cut(h, new_len);
    }
  }
  s.seen = new_len;
  s.pos.resize(static_cast<size_t>(new_len));
  s.epoch.resize(static_cast<size_t>(new_len));
  s.cur_epoch++;
}

Footprint KvReviverKvCache::footprint() const {
  // CPU only: every host array is the device's. payload = exact K/V; metadata = accumulated scores
  // + both sketches (sketch mode) or the merge buckets (merge mode); index = exact entries' token
  // indices + per-token position and epoch.
  Footprint f;
  const int64_t entry_bytes = 2 * D_ * 4;
  int64_t entries_all = 0, model_rows = 0;
  for (const auto& [id, s] : seqs_) {
    const RaggedBytes b = heads_.bytes(s.heads);
    f.device_payload_bytes += b.payload;
    f.device_metadata_bytes += b.metadata;
    f.device_index_bytes += b.index;
    f.device_reserved_bytes += b.reserved;
    model_rows += b.model_dtype;
    for (const auto& layer : s.heads)
      for (const auto& h : layer)
        f.device_metadata_bytes += h.sk.bytes() + h.sv.bytes() + h.mb.bytes();
    f.device_index_bytes += static_cast<int64_t>(s.pos.size() + s.epoch.size()) * 4;
    entries_all += b.entries;
    f.tokens_held += b.entries / (L_ * Hkv_);
  }
  f.logical_bytes = entries_all * entry_bytes;
  // Exact rows are in the model dtype (fp32 here); scores and sketch or bucket sums stay fp32 in
  // any deployment (accumulators), so they are not counted.
  f.model_dtype_device_bytes = model_rows;
  return f;
}

std::map<std::string, double> KvReviverKvCache::counters() const {
  std::map<std::string, double> c;
  c["setting.merge"] = merge() ? 1.0 : 0.0;
  c["setting.depth"] = static_cast<double>(opts_.depth);
  c["setting.width"] = static_cast<double>(opts_.width);
  c["setting.recent_fraction"] = opts_.recent_fraction;
  c["setting.revive"] = opts_.revive ? 1.0 : 0.0;
  c["setting.keys_pre_rope"] = opts_.keys_pre_rope ? 1.0 : 0.0;
  c["evicted_entries"] = static_cast<double>(evicted_entries_);
  c["evicted_tokens"] = static_cast<double>(evicted_entries_) / static_cast<double>(L_ * Hkv_);
  c["stale_sketch_tokens"] = static_cast<double>(stale_sketch_tokens_);
  if (opts_.codec)
    for (const auto& [k, v] : opts_.codec->describe()) c["codec." + k] = v;
  double kept = 0, seen = 0, sketch = 0, vague = 0, shadow = 0, heads = 0, used = 0, merged = 0,
         bucket_bytes = 0;
  for (const auto& [id, s] : seqs_) {
    seen += static_cast<double>(s.seen * L_ * Hkv_);
    for (const auto& layer : s.heads) {
      for (const auto& h : layer) {
        kept += static_cast<double>(h.len);
        vague += static_cast<double>(s.seen - h.len);
        sketch += static_cast<double>(h.sk.bytes() + h.sv.bytes());
        shadow += static_cast<double>((h.shadow_k.size() + h.shadow_v.size()) * sizeof(float) +
                                      h.assign.size() * sizeof(int32_t));
        heads += 1;
        used += static_cast<double>(h.mb.used());
        merged += static_cast<double>(h.mb.tokens());
        bucket_bytes += static_cast<double>(h.mb.bytes());
      }
    }
  }
  if (seen > 0) c["kept_ratio"] = kept / seen;
  c["sketch_bytes"] = sketch;
  c["sketched_entries"] = opts_.revive && !merge() ? vague : 0.0;
  if (merge()) {
    c["merged_entries"] = opts_.revive ? vague : 0.0;
    c["merge.bucket_bytes"] = bucket_bytes;
    if (heads > 0) c["merge.buckets_used"] = used / heads;  // mean per head
    if (used > 0) c["merge.tokens_per_bucket"] = merged / used;
  }
  if (evict_norm_k_ > 0) {
    c["recon_rel_err_k.at_eviction"] = std::sqrt(evict_err_k_ / evict_norm_k_);
    c["recon_rel_err_v.at_eviction"] = std::sqrt(evict_err_v_ / evict_norm_v_);
  }
  if (attn_norm_k_ > 0) {
    c["recon_rel_err_k.at_attention"] = std::sqrt(attn_err_k_ / attn_norm_k_);
    c["recon_rel_err_v.at_attention"] = std::sqrt(attn_err_v_ / attn_norm_v_);
  }
  if (opts_.measure_error) c["measure.shadow_bytes_not_in_ledger"] = shadow;
  if (vague_rows_ > 0) c["vague_attention_mass"] = vague_mass_ / vague_rows_;
  return c;
}

std::vector<HeadSnapshot> KvReviverKvCache::probe_view(int layer, int64_t seq_id) const {
  return probe_seq(seq_id, layer, L_, [&](const Seq& s) -> std::vector<HeadSnapshot> {
    std::vector<HeadSnapshot> out;
    auto* self = const_cast<KvReviverKvCache*>(this);
    int32_t max_pos = 0;
    for (int64_t t = 0; t < s.seen; ++t) max_pos = std::max(max_pos, s.pos[t]);
    if (opts_.revive && opts_.keys_pre_rope) self->ensure_rope(max_pos + 1);
    if (opts_.revive && merge() && !opts_.measure_error) return out;  // token -> bucket unknown
    for (int64_t h = 0; h < Hkv_; ++h) {
      const Head& hd = s.heads[layer][h];
      std::vector<int32_t> vague;
      if (opts_.revive) vague = vague_tokens(s, hd, s.seen);
      const int64_t nv = static_cast<int64_t>(vague.size()), n = nv + hd.len;
      std::vector<float> rk(static_cast<size_t>(nv * D_)), rv(static_cast<size_t>(nv * D_));
      if (nv > 0 && merge()) {
        const int64_t nb = hd.mb.used();
        std::vector<float> bk(static_cast<size_t>(nb * D_)), bv(static_cast<size_t>(nb * D_));
        bucket_entries(hd, bk.data(), bv.data());
        for (int64_t i = 0; i < nv; ++i) {
          const int64_t b = hd.assign[vague[i]];
          std::memcpy(rk.data() + i * D_, bk.data() + b * D_, sizeof(float) * D_);
          std::memcpy(rv.data() + i * D_, bv.data() + b * D_, sizeof(float) * D_);
        }
      } else if (nv > 0) {
        reconstruct(s, hd, vague, rk.data(), rv.data());
      }
      // Merge both sets in token order.
      const float *EK = nullptr, *EV = nullptr;
      std::vector<float> kbuf, vbuf;
      heads_.rows_f32(hd, &EK, &EV, &kbuf, &vbuf);
      at::Tensor K = at::empty({n, D_}, at::kFloat), V = at::empty({n, D_}, at::kFloat);
      std::vector<int64_t> index;
      int64_t a = 0, e = 0;
      while (a < nv || e < hd.len) {
        const bool take_vague = e >= hd.len || (a < nv && vague[a] < hd.idx[e]);
        const int64_t r = static_cast<int64_t>(index.size());
        const float* ks = take_vague ? rk.data() + a * D_ : EK + e * D_;
        const float* vs = take_vague ? rv.data() + a * D_ : EV + e * D_;
        std::memcpy(K.data_ptr<float>() + r * D_, ks, sizeof(float) * D_);
        std::memcpy(V.data_ptr<float>() + r * D_, vs, sizeof(float) * D_);
        index.push_back(take_vague ? vague[a++] : hd.idx[e++]);
      }
      out.push_back({K, V, at::tensor(index, at::kLong)});
    }
    return out;
  });
}

const kvreviver::CountSketch& KvReviverKvCache::key_sketch(int64_t seq_id, int layer,
                                                           int64_t head) const {
  return seqs_.at(seq_id).heads.at(layer).at(head).sk;
}

const kvreviver::CountSketch& KvReviverKvCache::value_sketch(int64_t seq_id, int layer,
                                                             int64_t head) const {
  return seqs_.at(seq_id).heads.at(layer).at(head).sv;
}

const kvreviver::MergeBuckets& KvReviverKvCache::buckets(int64_t seq_id, int layer,
                                                         int64_t head) const {
  return seqs_.at(seq_id).heads.at(layer).at(head).mb;
}

namespace {

MethodInfo kvreviver_info() {
  MethodInfo m = method_listing(
      "kvreviver",
      "KVReviver-style: recent + heavy candidates exact, evicted tokens merged into width buckets "
      "attended with a log(count) bias (default) or, reconstruction=sketch, in a count-sketch "
      "that attention reconstructs (kvbench design; paper internals unpublished)",
      "KVReviver: reversible KV cache compression with sketch-based token reconstruction, arXiv "
      "2512.17917 (design inferred from the abstract: see methods/kvreviver/README.md)",
      budget_params(
          0.25, "ratio",
          "EXACT entries kept per KV head (recent window + candidates); the buckets / sketches "
          "come "
          "on top and are counted in the ledger: a fraction of the tokens seen (budget_unit=ratio, "
          "(0, 1]) or a token count"));
  m.params.push_back(float_param("recent_fraction", 0.5, 0.0, 1.0,
                                 "share of the exact budget given to the recent window; the rest "
                                 "goes to candidates by accumulated attention (H2O-style)"));
  m.params.push_back(enum_param(
      "reconstruction", kReconstructions, KvReviverKvCache::Reconstruction::kMerge,
      "how evicted tokens are kept and attended. merge: width buckets per head (new bucket until "
      "width are used, then the nearest centroid key, L2), each attended as one entry (centroid "
      "key/value, logit + log(count)); sketch: the literal count-sketch reading, every evicted "
      "token reconstructed (median over depth rows) and attended -- breaks the model unless the "
      "sketch is larger than the cache (README)"));
  m.params.push_back(int_param("depth", 3, 1, 64,
                               "sketch mode: count-sketch rows (median over rows); "
                               "ignored by merge"));
  m.params.push_back(int_param("width", 32, 1, 1 << 20,
                               "merge: buckets per layer, KV head and sequence, each 2 x head_dim "
                               "fp32 sums + int32 count (+ int64 position sum with "
                               "keys_pre_rope); sketch: buckets per row, one sketch holds depth x "
                               "width x head_dim fp32 for keys and as much for values"));
  m.params.push_back(bool_param("revive", true,
                                "attend the evicted tokens (merged or reconstructed); false: "
                                "plain eviction with the same exact region (nothing kept)"));
  m.params.push_back(bool_param("keys_pre_rope", true,
                                "fold keys with RoPE removed and re-rotate (sketch: at the "
                                "token's position; merge: at the bucket's count-weighted mean "
                                "position, rounded); false: fold post-RoPE keys"));
  m.params.push_back(int_param("seed", 0, 0, 2147483647.0, "hash seed of the sketches"));
  m.params.push_back(bool_param("measure_error", false,
                                "measurement only: keep shadow copies of evicted rows and "
                                "(merge) each token's bucket, NOT in the ledger, to report the "
                                "reconstruction error at attention time (merge: probe_view "
                                "needs it)"));
  for (auto& c : codec_params()) {
    c.doc = "exact region: " + c.doc + " (the buckets / sketches stay fp32 running sums)";
    m.params.push_back(c);
  }
  m.caps.evicts = true;
  m.caps.cpu_only = true;  // the bucket store and its reconstruction are host fp32 code
  m.caps.fp32_only = true;
  return m;
}

std::unique_ptr<KvCache> make_kvreviver(const CacheContext& ctx, const nlohmann::json& p) {
  KvReviverKvCache::Options o;
  o.budget = parse_budget(p, "kvreviver");
  o.recent_fraction = p.at("recent_fraction").get<double>();
  o.reconstruction = param_enum(p, "reconstruction", kReconstructions);
  o.depth = p.at("depth").get<int64_t>();
  o.width = p.at("width").get<int64_t>();
  o.revive = p.at("revive").get<bool>();
  o.keys_pre_rope = p.at("keys_pre_rope").get<bool>();
  o.seed = static_cast<uint64_t>(p.at("seed").get<int64_t>());
  o.measure_error = p.at("measure_error").get<bool>();
  o.codec = parse_codec(p, "kvreviver", ctx.config.head_dim);
  return std::make_unique<KvReviverKvCache>(ctx, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(kvreviver, kvb::kvreviver_info, kvb::make_kvreviver);
