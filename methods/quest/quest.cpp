// quest: query-aware page selection with per-page key min/max bounds (see quest.h).

#include "methods/quest/quest.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "harness/kv/method_registry.h"
#include "methods/common/head_snapshots.h"
#include "methods/common/method_listing.h"
#include "methods/common/row_attention.h"

namespace kvb {
namespace quest {

float page_upper_bound(const float* q, const float* mn, const float* mx, int64_t head_dim) {
  float u = 0.f;
  for (int64_t c = 0; c < head_dim; ++c) u += std::max(q[c] * mn[c], q[c] * mx[c]);
  return u;
}

std::vector<int64_t> select_pages(const float* score, int64_t n_pages, int64_t k_pages,
                                  bool keep_first) {
  std::vector<int64_t> out;
  if (n_pages <= 0) return out;
  if (k_pages >= n_pages) {
    for (int64_t p = 0; p < n_pages; ++p) out.push_back(p);
    return out;
  }
  std::vector<int64_t> forced = {n_pages - 1};
  if (keep_first && n_pages > 1) forced.insert(forced.begin(), 0);
  std::vector<int64_t> cand;
  for (int64_t p = keep_first ? 1 : 0; p < n_pages - 1; ++p) cand.push_back(p);
  const int64_t extra = std::max<int64_t>(0, k_pages - static_cast<int64_t>(forced.size()));
  return merge_slots(top_k_slots(score, cand, extra), forced);
}

int64_t pages_for_budget(int64_t budget_tokens, int64_t visible, int64_t page_size) {
  const int64_t n_pages = (visible + page_size - 1) / page_size;
  if (budget_tokens >= visible) return n_pages;
  return std::max<int64_t>(1, budget_tokens / page_size);
}

}  // namespace quest

namespace {
int64_t round_up(int64_t x, int64_t g) { return (x + g - 1) / g * g; }
}  // namespace

QuestKvCache::QuestKvCache(const CacheContext& ctx, Options opts)
    : SeqStore("quest"), HeadGeometry(ctx, opts.force_generic), ctx_(ctx), opts_(std::move(opts)) {
  KVB_CHECK(opts_.page_size >= 1, "method quest.page_size: ", opts_.page_size, " must be >= 1");
  KVB_CHECK(!opts_.codec || fast_, "quest: the codec '", opts_.codec ? opts_.codec->name() : "",
            "' needs the CPU fp32 path (codec stores run on the CPU only so far)");
}

void QuestKvCache::reallocate(Seq& s, int64_t capacity) {
  auto opts = at::TensorOptions().dtype(ctx_.dtype).device(ctx_.device);
  const int64_t pcap = capacity / opts_.page_size;
  const int64_t pages = (s.len + opts_.page_size - 1) / opts_.page_size;
  s.k.resize(static_cast<size_t>(L_));
  s.v.resize(static_cast<size_t>(L_));
  s.mn.resize(static_cast<size_t>(L_));
  s.mx.resize(static_cast<size_t>(L_));
  if (opts_.codec && s.ks.empty()) {
    s.pk.assign(static_cast<size_t>(L_), {});
    s.pv.assign(static_cast<size_t>(L_), {});
    for (int64_t l = 0; l < L_; ++l) {
      s.ks.push_back(opts_.codec->make_stream(KvKind::kKey, static_cast<int>(l), Hkv_ * D_, D_));
      s.vs.push_back(opts_.codec->make_stream(KvKind::kValue, static_cast<int>(l), Hkv_ * D_, D_));
    }
  }
  for (int64_t l = 0; l < L_; ++l) {
    for (auto* t :
         opts_.codec ? std::vector<at::Tensor*>{} : std::vector<at::Tensor*>{&s.k[l], &s.v[l]}) {
      at::Tensor fresh = at::empty({capacity, Hkv_, D_}, opts);
      if (s.len > 0) fresh.narrow(0, 0, s.len).copy_(t->narrow(0, 0, s.len));
      *t = fresh;
    }
    for (auto* t : {&s.mn[l], &s.mx[l]}) {
      at::Tensor fresh = at::empty({pcap, Hkv_, D_}, opts);
      if (pages > 0) fresh.narrow(0, 0, pages).copy_(t->narrow(0, 0, pages));
      *t = fresh;
    }
  }
  s.capacity = capacity;
}

QuestKvCache::Seq QuestKvCache::new_seq(int64_t) {
  Seq fresh;
  fresh.last_pages.assign(static_cast<size_t>(L_),
                          std::vector<std::vector<int64_t>>(static_cast<size_t>(Hkv_)));
  return fresh;
}

void QuestKvCache::step_begins(Seq& s, const StepBatch& batch, int64_t b) {
  s.step_tokens = batch.new_tokens(b);
  s.decoding = batch.phase == Phase::kDecode;
  const int64_t need = s.len + s.step_tokens;
  if (need > s.capacity)
    reallocate(s, round_up(std::max<int64_t>(need, 2 * s.capacity), opts_.page_size));
}

void QuestKvCache::recompute_page(Seq& s, int layer, int64_t page, int64_t len) {
  const int64_t a = page * opts_.page_size;
  const int64_t b = std::min(len, a + opts_.page_size);
  if (b <= a) return;
  at::Tensor rows = rows_of(s, layer, b).first.narrow(0, a, b - a);  // [rows, Hkv, D]
  s.mn[layer][page].copy_(std::get<0>(rows.min(0)));
  s.mx[layer][page].copy_(std::get<0>(rows.max(0)));
}

std::pair<at::Tensor, at::Tensor> QuestKvCache::rows_of(const Seq& s, int layer,
                                                        int64_t rows) const {
  if (!opts_.codec) return {s.k[layer].narrow(0, 0, rows), s.v[layer].narrow(0, 0, rows)};
  const auto& ks = *s.ks[layer];
  const auto& vs = *s.vs[layer];
  const int64_t row = Hkv_ * D_, pend = static_cast<int64_t>(s.pk[layer].size()) / row;
  const int64_t total = ks.rows() + pend;
  KVB_ASSERT(total >= rows, "quest", rows, " rows asked of ", total);
  for (auto* t : {&scratch_k_, &scratch_v_})
    if (!t->defined() || t->size(0) < total)
      *t = at::empty({std::max<int64_t>(total, 2 * (t->defined() ? t->size(0) : 0)), Hkv_, D_},
                     at::kFloat);
  ks.decode(scratch_k_.data_ptr<float>());
  vs.decode(scratch_v_.data_ptr<float>());
  if (pend > 0) {
    std::memcpy(scratch_k_.data_ptr<float>() + ks.rows() * row, s.pk[layer].data(),
                sizeof(float) * pend * row);
    std::memcpy(scratch_v_.data_ptr<float>() + ks.rows() * row, s.pv[layer].data(),
                sizeof(float) * pend * row);
  }
  return {scratch_k_.narrow(0, 0, rows), scratch_v_.narrow(0, 0, rows)};
}

void QuestKvCache::append(Seq& s, int layer, const at::Tensor& k, const at::Tensor& v,
                          int64_t start, int64_t n) {
  const int64_t ps = opts_.page_size, row = Hkv_ * D_;
  if (fast_) {
    float* MN = s.mn[layer].data_ptr<float>();
    float* MX = s.mx[layer].data_ptr<float>();
    const float* kp = k.data_ptr<float>() + start * row;
    const float* vp = v.data_ptr<float>() + start * row;
    if (opts_.codec) {
      // The step's rows stay exact while the step attends (as in KIVI, where the current token's
      // K/V come straight from the forward); they reach the codec at end_step when decoding, at
      // end_prefill for the prompt.
      auto& pk = s.pk[layer];
      auto& pv = s.pv[layer];
      KVB_ASSERT(s.ks[layer]->rows() + static_cast<int64_t>(pk.size()) / row == s.len, "quest",
                 "stream rows ", s.ks[layer]->rows(), " + pending vs ", s.len);
      pk.insert(pk.end(), kp, kp + n * row);
      pv.insert(pv.end(), vp, vp + n * row);
    } else {
      std::memcpy(s.k[layer].data_ptr<float>() + s.len * row, kp, sizeof(float) * n * row);
      std::memcpy(s.v[layer].data_ptr<float>() + s.len * row, vp, sizeof(float) * n * row);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = s.len + i, p = t / ps;
      const float* src = kp + i * row;
      float* mn = MN + p * row;
      float* mx = MX + p * row;
      if (t % ps == 0) {
        std::memcpy(mn, src, sizeof(float) * row);
        std::memcpy(mx, src, sizeof(float) * row);
      } else {
        for (int64_t e = 0; e < row; ++e) {
          mn[e] = std::min(mn[e], src[e]);
          mx[e] = std::max(mx[e], src[e]);
        }
      }
    }
    return;
  }
  s.k[layer].narrow(0, s.len, n).copy_(k.narrow(0, start, n));
  s.v[layer].narrow(0, s.len, n).copy_(v.narrow(0, start, n));
  for (int64_t p = s.len / ps; p * ps < s.len + n; ++p) recompute_page(s, layer, p, s.len + n);
}

void QuestKvCache::count_read(int layer, int64_t read, int64_t visible, int64_t pages) {
  reads_ += 1;
  read_tokens_ += static_cast<double>(read);
  visible_tokens_ += static_cast<double>(visible);
  const double kv_row = 2.0 * static_cast<double>(D_ * elem_);
  bytes_read_ += static_cast<double>(read) * kv_row;
  bytes_dense_ += static_cast<double>(visible) * kv_row;
  if (layer >= opts_.skip_layers) {
    sel_reads_ += 1;
    sel_read_tokens_ += static_cast<double>(read);
    sel_visible_tokens_ += static_cast<double>(visible);
    sel_pages_ += static_cast<double>(pages);
    if (read < visible) sparse_reads_ += 1;
    bytes_read_ += static_cast<double>((visible + opts_.page_size - 1) / opts_.page_size) * kv_row;
  }
}

at::Tensor QuestKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const int64_t T = batch.num_tokens();
  const int layer = in.layer;
  const auto [q, k, v] = contiguous_rows(in);
  at::Tensor out;
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b];
    append(s, layer, k, v, start, n);
    // Dense when prefilling, in the skipped layers, or when the budget covers every page of every
    // row (then the read is exactly the full cache's, bit for bit).
    bool dense = !s.decoding || layer < opts_.skip_layers;
    for (int64_t i = 0; i < n && !dense; ++i) {
      const int64_t vis = s.len + i + 1;
      const int64_t P = (vis + opts_.page_size - 1) / opts_.page_size;
      const int64_t kp =
          quest::pages_for_budget(opts_.budget.per_head(vis, Hkv_), vis, opts_.page_size);
      if (kp < P) break;
      if (i == n - 1) dense = true;
    }
    const auto [K, V] = rows_of(s, layer, s.len + n);
    if (dense) {
      at::Tensor o = attend_dense(q.narrow(0, start, n), K, V, in.sm_scale);
      if (s.decoding) {
        for (int64_t i = 0; i < n; ++i) {
          const int64_t vis = s.len + i + 1;
          for (int64_t h = 0; h < Hkv_; ++h)
            count_read(layer, vis, vis, (vis + opts_.page_size - 1) / opts_.page_size);
        }
        for (auto& lp : s.last_pages[layer]) lp.clear();
      }
      if (batch.batch_size() == 1) return o;
      if (!out.defined()) out = at::empty({T, Hq_, D_}, in.q->options());
      out.narrow(0, start, n).copy_(o);
      continue;
    }
    if (!out.defined()) out = at::empty({T, Hq_, D_}, in.q->options());
    if (fast_)
      attend_selected_fast(s, layer, K, V, q, start, n, in.sm_scale, out);
    else
      attend_selected_generic(s, layer, K, V, q, start, n, in.sm_scale, out);
  }
  return out;
}

void QuestKvCache::attend_selected_fast(Seq& s, int layer, const at::Tensor& Kt,
                                        const at::Tensor& Vt, const at::Tensor& q, int64_t start,
                                        int64_t n, float sm_scale, at::Tensor& out) {
  const int64_t ps = opts_.page_size, row = Hkv_ * D_;
  const float* K = Kt.data_ptr<float>();
  const float* V = Vt.data_ptr<float>();
  const float* MN = s.mn[layer].data_ptr<float>();
  const float* MX = s.mx[layer].data_ptr<float>();
  const float* Q = q.data_ptr<float>();
  float* O = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = start + i, vis = s.len + i + 1;
    const int64_t P = (vis + ps - 1) / ps;
    const int64_t kp = quest::pages_for_budget(opts_.budget.per_head(vis, Hkv_), vis, ps);
    scratch_u_.resize(static_cast<size_t>(P));
    scratch_p_.resize(static_cast<size_t>(vis));
    for (int64_t h = 0; h < Hkv_; ++h) {
      const float* qh = Q + (r * Hq_ + h * G_) * D_;  // [G, D]
      for (int64_t p = 0; p < P; ++p) {
        const float* mn = MN + p * row + h * D_;
        const float* mx = MX + p * row + h * D_;
        float agg = opts_.gqa_agg == GqaAgg::kMax ? -std::numeric_limits<float>::infinity() : 0.f;
        for (int64_t g = 0; g < G_; ++g) {
          const float u = quest::page_upper_bound(qh + g * D_, mn, mx, D_);
          agg = opts_.gqa_agg == GqaAgg::kMax ? std::max(agg, u) : agg + u;
        }
        scratch_u_[p] = opts_.gqa_agg == GqaAgg::kMax ? agg : agg / static_cast<float>(G_);
      }
      std::vector<int64_t> pages =
          quest::select_pages(scratch_u_.data(), P, kp, opts_.keep_first_page);
      // The selected pages' tokens, ascending, attended exactly by every query head of the group.
      scratch_tok_.clear();
      for (int64_t p : pages)
        for (int64_t t = p * ps; t < std::min(vis, (p + 1) * ps); ++t) scratch_tok_.push_back(t);
      const int64_t read = static_cast<int64_t>(scratch_tok_.size());
      const int64_t* tok = scratch_tok_.data();
      for (int64_t g = 0; g < G_; ++g)
        attend_entries_f32(
            qh + g * D_, D_, sm_scale, read, [&](int64_t j) { return K + tok[j] * row + h * D_; },
            [&](int64_t j) { return V + tok[j] * row + h * D_; }, nullptr, 0, scratch_p_.data(),
            O + (r * Hq_ + h * G_ + g) * D_);
      count_read(layer, read, vis, static_cast<int64_t>(pages.size()));
      if (i == n - 1) s.last_pages[layer][h] = std::move(pages);
    }
  }
}

void QuestKvCache::attend_selected_generic(Seq& s, int layer, const at::Tensor& K,
                                           const at::Tensor& V, const at::Tensor& q, int64_t start,
                                           int64_t n, float sm_scale, at::Tensor& out) {
  const int64_t ps = opts_.page_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = start + i, vis = s.len + i + 1;
    const int64_t P = (vis + ps - 1) / ps;
    const int64_t kp = quest::pages_for_budget(opts_.budget.per_head(vis, Hkv_), vis, ps);
    at::Tensor qr = q[r].to(at::kFloat).view({Hkv_, G_, 1, D_});
    at::Tensor mn = s.mn[layer].narrow(0, 0, P).to(at::kFloat).permute({1, 0, 2}).unsqueeze(1);
    at::Tensor mx = s.mx[layer].narrow(0, 0, P).to(at::kFloat).permute({1, 0, 2}).unsqueeze(1);
    at::Tensor u = at::maximum(qr * mn, qr * mx).sum(-1);  // [Hkv, G, P]
    at::Tensor agg = (opts_.gqa_agg == GqaAgg::kMax ? std::get<0>(u.max(1)) : u.mean(1))
                         .to(at::kCPU)
                         .contiguous();  // [Hkv, P]
    for (int64_t h = 0; h < Hkv_; ++h) {
      std::vector<int64_t> pages =
          quest::select_pages(agg.data_ptr<float>() + h * P, P, kp, opts_.keep_first_page);
      std::vector<int64_t> tok;
      for (int64_t p : pages)
        for (int64_t t = p * ps; t < std::min(vis, (p + 1) * ps); ++t) tok.push_back(t);
      at::Tensor idx = at::tensor(tok, at::kLong).to(ctx_.device);
      at::Tensor Kh = K.select(1, h).index_select(0, idx).to(at::kFloat);  // [m, D]
      at::Tensor Vh = V.select(1, h).index_select(0, idx).to(at::kFloat);
      at::Tensor qh = q[r].narrow(0, h * G_, G_).to(at::kFloat);  // [G, D]
      at::Tensor pr = at::softmax(qh.matmul(Kh.t()).mul_(sm_scale), -1);
      out[r].narrow(0, h * G_, G_).copy_(pr.matmul(Vh));
      count_read(layer, static_cast<int64_t>(tok.size()), vis, static_cast<int64_t>(pages.size()));
      if (i == n - 1) s.last_pages[layer][h] = std::move(pages);
    }
  }
}

void QuestKvCache::end_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    s.len += s.step_tokens;
    s.step_tokens = 0;
    if (opts_.codec && s.decoding) flush_pending(s);
  }
}

void QuestKvCache::flush_pending(Seq& s) {
  const int64_t row = Hkv_ * D_;
  for (int64_t l = 0; l < static_cast<int64_t>(s.pk.size()); ++l) {
    const int64_t pend = static_cast<int64_t>(s.pk[l].size()) / row;
    if (pend == 0) continue;
    s.ks[l]->append(s.pk[l].data(), pend);
    s.vs[l]->append(s.pv[l].data(), pend);
    s.pk[l].clear();
    s.pv[l].clear();
  }
}

void QuestKvCache::end_prefill(int64_t seq_id) {
  if (opts_.codec) flush_pending(seqs_.at(seq_id));
}

void QuestKvCache::fork(int64_t src_id, int64_t dst_id) {
  seqs_.fork(src_id, dst_id);
  Seq& copy = seqs_.at(dst_id);
  for (auto* vec : {&copy.k, &copy.v, &copy.mn, &copy.mx})
    for (auto& t : *vec)
      if (t.defined()) t = t.clone();  // dense: no sharing
  for (auto* vec : {&copy.ks, &copy.vs})
    for (auto& st : *vec) st = std::shared_ptr<CodecStream>(st->clone());
}

void QuestKvCache::truncate(int64_t seq_id, int64_t new_len) {
  Seq& s = seqs_.truncating(seq_id, new_len);
  s.len = new_len;
  const int64_t row = Hkv_ * D_;
  for (size_t l = 0; l < s.ks.size(); ++l) {
    const int64_t enc = s.ks[l]->rows();
    if (new_len >= enc) {  // the cut falls among the pending rows
      s.pk[l].resize(static_cast<size_t>((new_len - enc) * row));
      s.pv[l].resize(static_cast<size_t>((new_len - enc) * row));
    } else {
      s.ks[l]->truncate(new_len);
      s.vs[l]->truncate(new_len);
      s.pk[l].clear();
      s.pv[l].clear();
    }
  }
  // The last page lost tokens: its bounds are recomputed from the keys it still holds.
  if (new_len % opts_.page_size != 0)
    for (int l = 0; l < L_; ++l) recompute_page(s, l, new_len / opts_.page_size, new_len);
  for (auto& layer : s.last_pages)
    for (auto& lp : layer) lp.clear();
}

Footprint QuestKvCache::footprint() const {
  Footprint f;
  int64_t model_bytes = 0;
  const int64_t per_token = ctx_.config.kv_bytes_per_token(elem_);
  const int64_t per_page_meta = L_ * Hkv_ * 2 * D_ * elem_;  // min + max, every layer and head
  for (const auto& [id, s] : seqs_) {
    const int64_t pages = (s.len + opts_.page_size - 1) / opts_.page_size;
    const int64_t pcap = s.capacity / opts_.page_size;
    f.device_metadata_bytes += pages * per_page_meta;
    f.device_reserved_bytes += (pcap - pages) * per_page_meta;
    f.tokens_held += s.len;
    model_bytes += pages * per_page_meta;  // page bounds in the model dtype
    if (!opts_.codec) {
      f.device_payload_bytes += s.len * per_token;
      model_bytes += s.len * per_token;
      f.device_reserved_bytes += (s.capacity - s.len) * per_token;
      continue;
    }
    CodecBytes cb;
    for (const auto* vec : {&s.ks, &s.vs})
      for (const auto& st : *vec) cb += st->bytes();
    for (const auto* vec : {&s.pk, &s.pv})
      for (const auto& p : *vec) {
        cb.full_bytes += static_cast<int64_t>(p.size() * sizeof(float));
        model_bytes += static_cast<int64_t>(p.size() * sizeof(float));  // pending rows, fp32 path
      }
    f.device_payload_bytes += cb.payload_bytes();
    f.device_metadata_bytes += cb.metadata_bytes;
    f.device_index_bytes += cb.index_bytes;
    f.device_reserved_bytes += cb.reserved_bytes;
  }
  f.logical_bytes = f.tokens_held * per_token;
  f.model_dtype_device_bytes = model_bytes;
  return f;
}

std::map<std::string, double> QuestKvCache::counters() const {
  std::map<std::string, double> c;
  c["setting.page_size"] = static_cast<double>(opts_.page_size);
  c["setting.skip_layers"] = static_cast<double>(opts_.skip_layers);
  c["setting.keep_first_page"] = opts_.keep_first_page ? 1.0 : 0.0;
  c["setting.gqa_agg_max"] = opts_.gqa_agg == GqaAgg::kMax ? 1.0 : 0.0;
  if (opts_.codec)
    for (const auto& [k, v] : opts_.codec->describe()) c["codec." + k] = v;
  c["decode_head_reads"] = reads_;
  if (reads_ > 0) {
    c["read_tokens_per_head_step"] = read_tokens_ / reads_;
    c["read_fraction"] = read_tokens_ / visible_tokens_;
    c["read_bytes_fraction"] = bytes_read_ / bytes_dense_;
    c["decode_read_fraction"] = bytes_read_ / bytes_dense_;  // the shared name (kv_cache.h)
  }
  if (sel_reads_ > 0) {
    c["read_tokens_per_head_step.selected_layers"] = sel_read_tokens_ / sel_reads_;
    c["read_fraction.selected_layers"] = sel_read_tokens_ / sel_visible_tokens_;
    c["pages_read_per_head_step.selected_layers"] = sel_pages_ / sel_reads_;
    c["sparse_read_share.selected_layers"] = sparse_reads_ / sel_reads_;
  }
  return c;
}

std::vector<HeadSnapshot> QuestKvCache::probe_view(int layer, int64_t seq_id) const {
  return probe_seq(seq_id, layer, L_, [&](const Seq& s) -> std::vector<HeadSnapshot> {
    const int64_t n = s.len + s.step_tokens;  // the running step's tokens once attend wrote them
    if (n == 0) return {};
    const auto [kr, vr] = rows_of(s, layer, n);
    at::Tensor k = kr.to(at::kCPU).to(at::kFloat).clone();
    at::Tensor v = vr.to(at::kCPU).to(at::kFloat).clone();
    return dense_head_snapshots(k, v);
  });
}

at::Tensor QuestKvCache::page_min(int64_t seq_id, int layer, int64_t page) const {
  const Seq& s = seqs_.at(seq_id);
  KVB_CHECK(page * opts_.page_size < s.len, "quest: page ", page, " is empty");
  return s.mn.at(layer)[page].to(at::kCPU).to(at::kFloat).clone();
}

at::Tensor QuestKvCache::page_max(int64_t seq_id, int layer, int64_t page) const {
  const Seq& s = seqs_.at(seq_id);
  KVB_CHECK(page * opts_.page_size < s.len, "quest: page ", page, " is empty");
  return s.mx.at(layer)[page].to(at::kCPU).to(at::kFloat).clone();
}

std::vector<int64_t> QuestKvCache::last_pages(int64_t seq_id, int layer, int64_t head) const {
  return seqs_.at(seq_id).last_pages.at(layer).at(head);
}

namespace {

MethodInfo quest_info() {
  MethodInfo m = method_listing(
      "quest",
      "Quest: keep every token; per decode step read only the top pages by min/max key bounds",
      "Tang et al., Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference, ICML "
      "2024 "
      "(arXiv 2406.10774)",
      budget_params(
          0.25, "ratio",
          "tokens READ per decode step per KV head (nothing is evicted): a fraction of the tokens "
          "visible to the query (budget_unit=ratio, (0, 1]) or a token count (tokens_per_head = "
          "Quest's token_budget; tokens_per_layer = per layer over its KV heads); read in whole "
          "pages: max(1, budget / page_size) pages, everything when budget >= visible tokens"));
  m.params.push_back(int_param("page_size", 16, 1, 4096, "tokens per page (Quest's chunk size)"));
  m.params.push_back(int_param("skip_layers", 2, 0, 1e6,
                               "the first layers attend densely at every step (Quest skips 2)"));
  m.params.push_back(bool_param("keep_first_page", false,
                                "always read page 0 as well (attention sinks); Quest does not"));
  m.params.push_back(string_param(
      "gqa_agg", "max", {"max", "mean"},
      "GQA: one page set per KV head, from the group's query-head bounds by max (a page any head "
      "may need) or mean"));
  for (auto& c : codec_params()) m.params.push_back(c);
  m.target_check = codec_target_check;
  return m;
}

std::unique_ptr<KvCache> make_quest(const CacheContext& ctx, const nlohmann::json& p) {
  QuestKvCache::Options o;
  o.budget = parse_budget(p, "quest");
  o.page_size = p.at("page_size").get<int64_t>();
  o.skip_layers = p.at("skip_layers").get<int64_t>();
  o.keep_first_page = p.at("keep_first_page").get<bool>();
  o.gqa_agg = param_enum(p, "gqa_agg", kGqaAggs);
  o.codec = parse_codec(p, "quest", ctx.config.head_dim);
  return std::make_unique<QuestKvCache>(ctx, o);
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(quest, kvb::quest_info, kvb::make_quest);
