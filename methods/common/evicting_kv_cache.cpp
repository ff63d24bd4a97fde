#include "methods/common/evicting_kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "harness/common/enum_names.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/kv/attention.h"
#include "harness/kv/rope_shift.h"
#include "harness/model/model.h"
#include "kvb/kernels/attention_scores.h"
#include "kvb/kernels/cpu_ops.h"
#include "kvb/kernels/paged_attention.h"
#include "methods/common/row_attention.h"

namespace kvb {

namespace {
const EnumName<BudgetUnit> kBudgetUnits[] = {{BudgetUnit::kRatio, "ratio"},
                                             {BudgetUnit::kTokensPerLayer, "tokens_per_layer"},
                                             {BudgetUnit::kTokensPerHead, "tokens_per_head"}};
const EnumName<PositionMode> kPositionModes[] = {{PositionMode::kAbsolute, "absolute"},
                                                 {PositionMode::kRerotated, "rerotated"}};
}  // namespace

const char* budget_unit_name(BudgetUnit u) { return enum_name(kBudgetUnits, u); }

BudgetUnit parse_budget_unit(const std::string& s) {
  return parse_enum(kBudgetUnits, s, "budget_unit");
}

PositionMode parse_position_mode(const std::string& s) {
  return parse_enum(kPositionModes, s, "position_mode");
}

namespace {

// floor(r * n) without 0.29 * 100 = 28.999... surprises.
int64_t floor_ratio(double r, int64_t n) {
  return static_cast<int64_t>(std::floor(r * static_cast<double>(n) + 1e-9));
}

// Rotates rows [rows, D] (fp32, any device) by the per-row tables cos/sin [rows, D / 2].
at::Tensor rotate_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       bool interleaved) {
  const int64_t rows = x.size(0), D = x.size(1), half = D / 2;
  at::Tensor xf = x.to(at::kFloat).contiguous();
  if (interleaved) {
    at::Tensor pairs = xf.view({rows, half, 2});
    at::Tensor a = pairs.select(2, 0), b = pairs.select(2, 1);
    return at::stack({a * cos - b * sin, a * sin + b * cos}, 2).view({rows, D});
  }
  at::Tensor a = xf.narrow(1, 0, half), b = xf.narrow(1, half, half);
  return at::cat({a * cos - b * sin, b * cos + a * sin}, 1);
}

}  // namespace

int64_t Budget::per_head(int64_t seen, int64_t n_kv_heads) const {
  if (seen <= 0) return 0;
  int64_t b = 0;
  switch (unit) {
    case BudgetUnit::kRatio:
      b = floor_ratio(value, seen);
      break;
    case BudgetUnit::kTokensPerHead:
      b = static_cast<int64_t>(value);
      break;
    case BudgetUnit::kTokensPerLayer:
      b = static_cast<int64_t>(value) / n_kv_heads;
      break;
  }
  return std::max<int64_t>(1, b);
}

int64_t Budget::per_layer(int64_t seen, int64_t n_kv_heads) const {
  if (seen <= 0) return 0;
  int64_t b = 0;
  switch (unit) {
    case BudgetUnit::kRatio:
      b = n_kv_heads * floor_ratio(value, seen);
      break;
    case BudgetUnit::kTokensPerHead:
      b = n_kv_heads * static_cast<int64_t>(value);
      break;
    case BudgetUnit::kTokensPerLayer:
      b = static_cast<int64_t>(value);
      break;
  }
  return std::max<int64_t>(1, b);
}

EvictingKvCache::EvictingKvCache(const CacheContext& ctx, Options opts,
                                 std::unique_ptr<EvictionPolicy> policy)
    : SeqStore(opts.name),
      HeadGeometry(ctx, opts.force_generic),
      ctx_(ctx),
      opts_(std::move(opts)),
      policy_(std::move(policy)),
      heads_({opts_.name, D_, ctx.dtype, ctx.device, fast_, opts_.granule,
              policy_ && policy_->needs().accumulate, opts_.codec}) {
  KVB_ASSERT(policy_ != nullptr, opts_.name, "no eviction policy");
  KVB_CHECK(opts_.granule >= 1, opts_.name, ": granule must be >= 1");
  needs_ = policy_->needs();
  // A query-aware codec (SparK, ThinK) needs the prompt's observation-window queries too.
  if (opts_.codec) needs_.window = std::max(needs_.window, opts_.codec->query_window());
  sched_ = policy_->schedule();
  host_is_device_ = ctx_.device.is_cpu();
  sm_scale_ = 1.0f / std::sqrt(static_cast<float>(D_));
  // Re-rotated keys and the RoPE angles ahead are this store's own rotations: refused at once on
  // a RoPE whose frequencies switch with the length (LongRoPE), not at the first compression.
  if (opts_.position_mode == PositionMode::kRerotated || needs_.query_stats_from >= 0)
    (void)rope_inv_freq(ctx_.config);
  KVB_CHECK(!opts_.codec || fast_, opts_.name, ": the codec '",
            opts_.codec ? opts_.codec->name() : "",
            "' stores kept entries on the host and runs on the CPU fp32 path only (device cpu, ",
            "dtype fp32)");
}

EvictingKvCache::~EvictingKvCache() = default;

EvictingKvCache::Seq EvictingKvCache::new_seq(int64_t seq_id) {
  Seq s;
  s.heads.assign(static_cast<size_t>(L_), std::vector<Head>(static_cast<size_t>(Hkv_)));
  s.window_q.resize(static_cast<size_t>(L_));
  s.window_len.assign(static_cast<size_t>(L_), 0);
  s.q_sum.resize(static_cast<size_t>(L_));
  s.q_outer.resize(static_cast<size_t>(L_));
  s.q_count.assign(static_cast<size_t>(L_), 0);
  auto q = question_for_.find(seq_id);  // told before the sequence's first step
  if (q != question_for_.end()) {
    s.question = q->second;
    question_for_.erase(q);
  }
  return s;
}

bool EvictingKvCache::collecting_window(const Seq& s) const {
  return needs_.window > 0 && (!s.decoding || sched_.every_decode_steps > 0);
}

void EvictingKvCache::ensure_rope(int64_t n_pos) {
  if (n_pos <= rope_len_) return;
  const int64_t len = std::max<int64_t>({n_pos, 2 * rope_len_, 1024});
  compute_rope_tables(ctx_.config, len, &rope_cos_, &rope_sin_);
  if (!ctx_.device.is_cpu()) {
    rope_cos_dev_ = rope_cos_.to(ctx_.device);
    rope_sin_dev_ = rope_sin_.to(ctx_.device);
  } else {
    rope_cos_dev_ = rope_cos_;
    rope_sin_dev_ = rope_sin_;
  }
  rope_len_ = len;
}

void EvictingKvCache::flush_pending(Seq& s, int layer, int64_t head) {
  Head& h = s.heads[layer][head];
  if (h.pend == 0) return;
  const int64_t wl = s.window_len.empty() ? 0 : s.window_len[layer];
  if (opts_.codec->query_window() > 0 && wl > 0 && s.window_q[layer].defined()) {
    // kGroupMean: n_c = || mean over the group's query heads of the window queries [:, c] ||_2;
    // kMeanSquare: n_c^2 = sum over the window of the mean over the group's heads of q_c^2.
    const bool mean_square = opts_.codec->query_energy() == QueryEnergy::kMeanSquare;
    const float* Q = s.window_q[layer].data_ptr<float>();
    std::vector<double> sq(static_cast<size_t>(D_), 0.0);
    for (int64_t t = 0; t < wl; ++t) {
      for (int64_t c = 0; c < D_; ++c) {
        double m = 0;
        for (int64_t g = 0; g < G_; ++g) {
          const double q = Q[(t * Hq_ + head * G_ + g) * D_ + c];
          m += mean_square ? q * q : q;
        }
        m /= static_cast<double>(G_);
        sq[c] += mean_square ? m : m * m;
      }
    }
    std::vector<float> energy(static_cast<size_t>(D_));
    for (int64_t c = 0; c < D_; ++c) energy[c] = static_cast<float>(std::sqrt(sq[c]));
    h.ks.p->set_query_energy(energy.data(), wl);
  }
  heads_.flush(h);
}

const float* EvictingKvCache::keys_f32(const float* K, int64_t rows, int64_t base,
                                       std::vector<float>* scratch) {
  if (opts_.position_mode == PositionMode::kAbsolute) return K;
  KVB_CHECK(base >= 0, opts_.name, ": re-rotation would place kept keys at negative positions");
  ensure_rope(base + rows);
  scratch->assign(K, K + rows * D_);
  scratch_pos_.resize(static_cast<size_t>(rows));
  for (int64_t j = 0; j < rows; ++j) scratch_pos_[j] = base + j;
  kernels::rope_f32(scratch->data(), rows, 1, D_, D_, rope_cos_.data_ptr<float>(),
                    rope_sin_.data_ptr<float>(), scratch_pos_.data(),
                    ctx_.config.rope_style == RopeStyle::kInterleaved);
  return scratch->data();
}

at::Tensor EvictingKvCache::keys_generic(const Head& h, int64_t rows, int64_t base) {
  at::Tensor K = h.kv.select(0, 0).narrow(0, 0, rows);
  if (opts_.position_mode == PositionMode::kAbsolute) return K;
  KVB_CHECK(base >= 0, opts_.name, ": re-rotation would place kept keys at negative positions");
  ensure_rope(base + rows);
  return rotate_rows(K, rope_cos_dev_.narrow(0, base, rows), rope_sin_dev_.narrow(0, base, rows),
                     ctx_.config.rope_style == RopeStyle::kInterleaved)
      .to(K.scalar_type());
}

void EvictingKvCache::step_begins(Seq& s, const StepBatch& batch, int64_t b) {
  s.step_tokens = batch.new_tokens(b);
  s.step_pos0 = batch.positions[batch.q_indptr[b]];
  s.decoding = batch.phase == Phase::kDecode;
  if (sched_.before_step && s.seen > 0) compress(s, Trigger::kBeforeStep, s.step_tokens);
  for (auto& layer : s.heads)
    for (auto& h : layer) heads_.reserve(h, h.len + s.step_tokens);
  if (!collecting_window(s)) free_windows(s);
}

void EvictingKvCache::push_window(Seq& s, int layer, const at::Tensor& q, int64_t start,
                                  int64_t n) {
  const int64_t w = needs_.window;
  at::Tensor& buf = s.window_q[layer];
  int64_t& wl = s.window_len[layer];
  if (!buf.defined()) {
    buf = at::empty({w, Hq_, D_}, q.options());
    wl = 0;
  }
  at::Tensor src = q.narrow(0, start, n);
  if (n >= w) {
    buf.copy_(src.narrow(0, n - w, w));
    wl = w;
    return;
  }
  const int64_t keep = std::min(wl, w - n);
  if (keep > 0 && wl > keep) {
    if (fast_) {
      float* p = buf.data_ptr<float>();
      std::memmove(p, p + (wl - keep) * Hq_ * D_, sizeof(float) * keep * Hq_ * D_);
    } else {
      buf.narrow(0, 0, keep).copy_(buf.narrow(0, wl - keep, keep).clone());
    }
  }
  buf.narrow(0, keep, n).copy_(src);
  wl = keep + n;
}

void EvictingKvCache::set_question_tokens(int64_t seq_id, int64_t question_tokens) {
  KVB_ASSERT(!seqs_.contains(seq_id), opts_.name, "told the question of sequence ", seq_id,
             " after its first step");
  question_for_[seq_id] = question_tokens;
}

void EvictingKvCache::clear_last_rows(Seq& s) {
  for (auto& layer : s.heads)
    for (auto& h : layer) std::vector<float>().swap(h.last);
}

bool EvictingKvCache::collecting_query_stats(const Seq& s) const {
  return needs_.query_stats_from >= 0 &&
         (!s.decoding || sched_.every_decode_steps > 0 || sched_.after_step);
}

void EvictingKvCache::push_query_stats(Seq& s, int layer, const at::Tensor& q,
                                       const StepBatch& batch, int64_t start, int64_t n) {
  // Rows before query_stats_from (the sinks) are left out; the rest are rotated back to pre-RoPE
  // (a rotation by minus the row's position) and summed with their outer products.
  const int64_t skip = std::min<int64_t>(n, std::max<int64_t>(0, needs_.query_stats_from - s.seen));
  const int64_t m = n - skip;
  if (m <= 0) return;
  std::vector<int64_t> pos(batch.positions.begin() + start + skip,
                           batch.positions.begin() + start + n);
  ensure_rope(*std::max_element(pos.begin(), pos.end()) + 1);
  at::Tensor p = at::tensor(pos, at::kLong);
  at::Tensor cos = rope_cos_.index_select(0, p).repeat_interleave(Hq_, 0);   // [m * Hq, D / 2]
  at::Tensor sin = -rope_sin_.index_select(0, p).repeat_interleave(Hq_, 0);  // the inverse
  at::Tensor rows = q.narrow(0, start + skip, m).to(at::kCPU, at::kFloat).reshape({m * Hq_, D_});
  at::Tensor pre = rotate_rows(rows, cos, sin, ctx_.config.rope_style == RopeStyle::kInterleaved)
                       .view({m, Hq_, D_})
                       .permute({1, 0, 2});                              // [Hq, m, D]
  at::Tensor outer = at::bmm(pre.transpose(1, 2), pre).to(at::kDouble);  // [Hq, D, D]
  at::Tensor sum = pre.sum(1).to(at::kDouble);                           // [Hq, D]
  if (!s.q_sum[layer].defined()) {
    s.q_sum[layer] = sum;
    s.q_outer[layer] = outer;
  } else {
    s.q_sum[layer].add_(sum);
    s.q_outer[layer].add_(outer);
  }
  s.q_count[layer] += m;
}

void EvictingKvCache::free_query_stats(Seq& s) {
  for (size_t l = 0; l < s.q_sum.size(); ++l) {
    s.q_sum[l] = at::Tensor();
    s.q_outer[l] = at::Tensor();
    s.q_count[l] = 0;
  }
}

void EvictingKvCache::free_windows(Seq& s) {
  for (size_t l = 0; l < s.window_q.size(); ++l) {
    s.window_q[l] = at::Tensor();
    s.window_len[l] = 0;
  }
}

at::Tensor EvictingKvCache::attend(const LayerInput& in) {
  const StepBatch& batch = *in.batch;
  const int64_t T = batch.num_tokens();
  sm_scale_ = in.sm_scale;
  KVB_CHECK(opts_.position_mode == PositionMode::kAbsolute || in.k_pre_rope != nullptr, opts_.name,
            ": position_mode=rerotated needs the engine's pre-RoPE keys");
  at::Tensor out = at::empty({T, Hq_, D_}, in.q->options());
  if (fast_) {
    const auto [q, k, v] = contiguous_rows(in, opts_.position_mode == PositionMode::kRerotated);
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      attend_seq_fast(s, in.layer, q, k, v, batch.q_indptr[b], batch.new_tokens(b), out);
      if (collecting_window(s)) push_window(s, in.layer, q, batch.q_indptr[b], batch.new_tokens(b));
      if (collecting_query_stats(s))
        push_query_stats(s, in.layer, q, batch, batch.q_indptr[b], batch.new_tokens(b));
    }
  } else {
    const at::Tensor& k = opts_.position_mode == PositionMode::kRerotated ? *in.k_pre_rope : *in.k;
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      attend_seq_generic(s, in.layer, *in.q, k, *in.v, batch.q_indptr[b], batch.new_tokens(b), out);
      if (collecting_window(s))
        push_window(s, in.layer, *in.q, batch.q_indptr[b], batch.new_tokens(b));
      if (collecting_query_stats(s))
        push_query_stats(s, in.layer, *in.q, batch, batch.q_indptr[b], batch.new_tokens(b));
    }
  }
  return out;
}

void EvictingKvCache::attend_seq_fast(Seq& s, int layer, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, int64_t start, int64_t n,
                                      at::Tensor& out) {
  const float* qp = q.data_ptr<float>() + start * Hq_ * D_;
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>() + start * Hq_ * D_;
  for (int64_t h = 0; h < Hkv_; ++h) {
    Head& hd = s.heads[layer][h];
    const int64_t past = hd.len, rows = past + n;
    KVB_ASSERT(rows <= hd.cap, opts_.name, "attend before begin_step reserved room");
    float* K = nullptr;
    float* V = nullptr;
    if (opts_.codec) {
      // Decode the kept entries, put the step's rows after them at full precision, attend, and
      // only then hand the new rows to the codec (a step attends its own tokens exactly, as the
      // codec store does).
      heads_.make_streams(hd, layer);
      const float *kept_k = nullptr, *kept_v = nullptr;
      heads_.rows_f32(hd, &kept_k, &kept_v, &dec_k_, &dec_v_);
      dec_k_.resize(static_cast<size_t>(rows * D_));
      dec_v_.resize(static_cast<size_t>(rows * D_));
      K = dec_k_.data();
      V = dec_v_.data();
    } else {
      K = hd.kv.data_ptr<float>();
      V = K + hd.cap * D_;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t src = ((start + i) * Hkv_ + h) * D_;
      std::memcpy(K + (past + i) * D_, kp + src, sizeof(float) * D_);
      std::memcpy(V + (past + i) * D_, vp + src, sizeof(float) * D_);
      hd.idx[past + i] = static_cast<int32_t>(s.seen + i);
      if (needs_.accumulate) hd.acc[past + i] = 0.f;
    }
    const float* keys = keys_f32(K, rows, s.step_pos0 - past, &scratch_k_);
    scratch_p_.resize(static_cast<size_t>(rows));
    float* last = nullptr;
    if (needs_.last_row) {
      hd.last.assign(static_cast<size_t>(rows), 0.f);
      last = hd.last.data();
    }
    // The output: the CPU kernel with its tiled prefill path, this head's rows as one page. In a
    // prefill it is bitwise what the plain paged store computes, so a recorded full-cache prefill
    // stands in for this store's own (harness/engine/prefill_replay.h) whatever scores the policy
    // keeps. A decode step of a scoring policy computes output and scores in one pass instead.
    const bool scores = needs_.accumulate || last;
    const bool fused = scores && s.decoding;
    if (!fused)
      attend_rows_f32(qp + h * G_ * D_, op + h * G_ * D_, Hq_ * D_, keys, V, past, n, G_, 1, D_,
                      sm_scale_);
    if (scores) {
      // The scores the policy keeps come from the probabilities: every query row of the group
      // adds its row into acc (H2O); the step's last row is `last` (TOVA), the only row it reads.
      // Row i sees the kept entries and the step's rows up to its own; the output these rows
      // compute again is dropped, unless the pass is the step's output (fused).
      std::vector<float> dropped(static_cast<size_t>(D_));
      const float* prob = scratch_p_.data();
      for (int64_t i = needs_.accumulate || fused ? 0 : n - 1; i < n; ++i) {
        const int64_t m = past + i + 1;
        for (int64_t g = 0; g < G_; ++g) {
          const int64_t qo = i * Hq_ * D_ + (h * G_ + g) * D_;
          const float inv = attend_entries_f32(
              qp + qo, D_, sm_scale_, m, [&](int64_t j) { return keys + j * D_; },
              [&](int64_t j) { return V + j * D_; }, nullptr, 0, scratch_p_.data(),
              fused ? op + qo : dropped.data());
          if (needs_.accumulate)
            for (int64_t j = 0; j < m; ++j) hd.acc[j] += prob[j] * inv;
          if (last && i == n - 1)
            for (int64_t j = 0; j < m; ++j) last[j] += prob[j] * inv;
        }
      }
    }
    if (opts_.codec) {
      if (s.decoding) {
        flush_pending(s, layer, h);
        hd.ks.p->append(K + past * D_, n);
        hd.vs.p->append(V + past * D_, n);
      } else {
        hd.pk.insert(hd.pk.end(), K + past * D_, K + rows * D_);
        hd.pv.insert(hd.pv.end(), V + past * D_, V + rows * D_);
        hd.pend += n;
      }
    }
    hd.len = rows;
  }
}

void EvictingKvCache::attend_seq_generic(Seq& s, int layer, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v, int64_t start,
                                         int64_t n, at::Tensor& out) {
  at::Tensor qs = q.narrow(0, start, n);
  at::Tensor ks = k.narrow(0, start, n);
  at::Tensor vs = v.narrow(0, start, n);
  at::Tensor os = out.narrow(0, start, n);
  for (int64_t h = 0; h < Hkv_; ++h) {
    Head& hd = s.heads[layer][h];
    const int64_t past = hd.len, rows = past + n;
    KVB_ASSERT(rows <= hd.cap, opts_.name, "attend before begin_step reserved room");
    hd.kv.select(0, 0).narrow(0, past, n).copy_(ks.select(1, h));
    hd.kv.select(0, 1).narrow(0, past, n).copy_(vs.select(1, h));
    for (int64_t i = 0; i < n; ++i) {
      hd.idx[past + i] = static_cast<int32_t>(s.seen + i);
      if (needs_.accumulate) hd.acc[past + i] = 0.f;
    }
    at::Tensor K = keys_generic(hd, rows, s.step_pos0 - past).to(at::kFloat);
    at::Tensor V = hd.kv.select(0, 1).narrow(0, 0, rows);
    at::Tensor qg = qs.narrow(1, h * G_, G_).transpose(0, 1).to(at::kFloat);  // [G, n, D]
    at::Tensor sc = at::matmul(qg, K.t()).mul_(sm_scale_);                    // [G, n, rows]
    if (n > 1) {
      auto lopts = at::TensorOptions().dtype(at::kLong).device(ctx_.device);
      at::Tensor j = at::arange(rows, lopts);
      at::Tensor i = at::arange(n, lopts) + past;
      sc.masked_fill_(j.unsqueeze(0) > i.unsqueeze(1), -std::numeric_limits<float>::infinity());
    }
    at::Tensor p = at::softmax(sc, -1);
    os.narrow(1, h * G_, G_).copy_(at::matmul(p.to(V.scalar_type()), V).transpose(0, 1));
    if (needs_.accumulate) {
      at::Tensor colsum = p.sum(at::IntArrayRef{0, 1}).to(at::kCPU).contiguous();
      const float* c = colsum.data_ptr<float>();
      for (int64_t j = 0; j < rows; ++j) hd.acc[j] += c[j];
    }
    if (needs_.last_row) {
      at::Tensor lr = p.select(1, n - 1).sum(0).to(at::kCPU).contiguous();
      hd.last.assign(lr.data_ptr<float>(), lr.data_ptr<float>() + rows);
    }
    hd.len = rows;
  }
}

void EvictingKvCache::end_step(const StepBatch& batch) {
  for (int64_t b = 0; b < batch.batch_size(); ++b) {
    Seq& s = seqs_.at(batch.seq_ids[b]);
    s.seen += s.step_tokens;
    s.next_pos = s.step_pos0 + s.step_tokens;
    if (s.decoding) s.since_compress++;
    if (sched_.after_step) {
      compress(s, Trigger::kAfterStep, 0);
    } else if (s.decoding && sched_.every_decode_steps > 0 &&
               s.since_compress >= sched_.every_decode_steps) {
      compress(s, Trigger::kPeriodic, 0);
      s.since_compress = 0;
    }
    // A prompt compressed at its end (schedule end_prefill) is scored by its last step's last
    // row, so that row stays until end_prefill; otherwise it is scratch of this step.
    if (needs_.last_row && (s.decoding || !sched_.end_prefill)) clear_last_rows(s);
    s.step_tokens = 0;
  }
}

void EvictingKvCache::end_prefill(int64_t seq_id) {
  Seq* found = seqs_.find(seq_id);
  if (!found) return;
  Seq& s = *found;
  if (sched_.end_prefill) compress(s, Trigger::kEndPrefill, 0);
  if (needs_.last_row) clear_last_rows(s);
  if (opts_.codec)
    for (int l = 0; l < L_; ++l)
      for (int64_t h = 0; h < Hkv_; ++h)
        if (s.heads[l][h].ks.p) flush_pending(s, l, h);
  s.since_compress = 0;
  if (sched_.every_decode_steps == 0) free_windows(s);
  if (!collecting_query_stats(s) || (sched_.every_decode_steps == 0 && !sched_.after_step))
    free_query_stats(s);
}

void EvictingKvCache::compress(Seq& s, Trigger trigger, int64_t incoming) {
  for (int l = 0; l < L_; ++l) compress_layer(s, l, trigger, incoming);
}

void EvictingKvCache::compress_layer(Seq& s, int layer, Trigger trigger, int64_t incoming) {
  LayerView v;
  v.trigger = trigger;
  v.layer = layer;
  v.n_layers = static_cast<int>(L_);
  v.n_kv_heads = Hkv_;
  v.group = G_;
  v.head_dim = D_;
  v.seen = s.seen;
  v.incoming = incoming;
  v.window = needs_.window > 0 ? s.window_len[layer] : 0;
  v.next_pos = s.next_pos;
  v.sm_scale = sm_scale_;
  v.question = s.question;
  at::Tensor wq;
  if (needs_.window_queries && v.window > 0) {
    wq = s.window_q[layer].narrow(0, 0, v.window).to(at::kCPU, at::kFloat).contiguous();
    v.window_queries = wq.data_ptr<float>();
  }
  v.heads.resize(static_cast<size_t>(Hkv_));
  std::vector<std::vector<float>> win(static_cast<size_t>(Hkv_)), norms(static_cast<size_t>(Hkv_));
  std::vector<std::vector<float>> kbuf(static_cast<size_t>(needs_.kv ? Hkv_ : 0)),
      vbuf(static_cast<size_t>(needs_.kv ? Hkv_ : 0));
  at::Tensor q_mean, q_cov;
  if (needs_.query_stats_from >= 0) {
    ensure_rope(s.next_pos + needs_.rope_ahead + 1);
    v.rope = {rope_len_, D_ / 2, ctx_.config.rope_style == RopeStyle::kInterleaved,
              rope_cos_.data_ptr<float>(), rope_sin_.data_ptr<float>()};
    if (s.q_count[layer] > 0) {
      const double n = static_cast<double>(s.q_count[layer]);
      at::Tensor mu = s.q_sum[layer] / n;  // [Hq, D]
      q_mean = mu.to(at::kFloat).contiguous();
      q_cov =
          (s.q_outer[layer] / n - mu.unsqueeze(2) * mu.unsqueeze(1)).to(at::kFloat).contiguous();
      v.queries = {s.q_count[layer], q_mean.data_ptr<float>(), q_cov.data_ptr<float>()};
    }
  }
  for (int64_t h = 0; h < Hkv_; ++h) {
    Head& hd = s.heads[layer][h];
    HeadView& hv = v.heads[h];
    hv.len = hd.len;
    hv.idx = hd.idx.data();
    if (needs_.accumulate) hv.acc = hd.acc.data();
    if (needs_.last_row && static_cast<int64_t>(hd.last.size()) == hd.len) hv.last = hd.last.data();
    if (needs_.window > 0 && v.window > 0) {
      win[h] = window_scores(s, layer, h);
      hv.window = win[h].data();
    }
    if (needs_.key_norm) {
      norms[h] = key_norms(hd);
      hv.key_norm = norms[h].data();
    }
    if (needs_.kv && hd.len > 0) {
      kept_rows_f32(s, hd, &kbuf[h], &vbuf[h]);
      hv.keys = kbuf[h].data();
      hv.values = vbuf[h].data();
    }
  }
  std::vector<std::vector<int64_t>> keep(static_cast<size_t>(Hkv_));
  if (!policy_->select(v, &keep)) return;
  compressions_++;
  for (int64_t h = 0; h < Hkv_; ++h) {
    Head& hd = s.heads[layer][h];
    KVB_ASSERT(static_cast<int64_t>(keep[h].size()) <= hd.len, opts_.name,
               ": the policy kept more than held");
    evicted_entries_ += hd.len - static_cast<int64_t>(keep[h].size());
    if (static_cast<int64_t>(keep[h].size()) == hd.len) continue;
    heads_.compact(hd, keep[h]);
  }
}

std::vector<float> EvictingKvCache::window_scores(Seq& s, int layer, int64_t head) {
  Head& hd = s.heads[layer][head];
  const int64_t wl = s.window_len[layer], len = hd.len;
  std::vector<float> out(static_cast<size_t>(G_ * len), 0.f);
  if (wl == 0 || len == 0) return out;
  const int64_t base = s.next_pos - len;
  if (fast_) {
    const float* keys = keys_f32(heads_.keys_f32(hd, &dec_k_), len, base, &scratch_k_);
    const float* Q = s.window_q[layer].data_ptr<float>();
    scratch_vis_.resize(static_cast<size_t>(wl));
    for (int64_t i = 0; i < wl; ++i) {
      const int32_t qidx = static_cast<int32_t>(s.seen - wl + i);
      scratch_vis_[i] =
          std::upper_bound(hd.idx.begin(), hd.idx.begin() + len, qidx) - hd.idx.begin();
    }
    scratch_p_.resize(static_cast<size_t>(len));
    kernels::attention_prob_sums_f32(Q + head * G_ * D_, Hq_ * D_, wl, G_, D_, keys, len,
                                     scratch_vis_.data(), sm_scale_, out.data(), len,
                                     scratch_p_.data());
    return out;
  }
  at::Tensor K = keys_generic(hd, len, base).to(at::kFloat);  // [len, D]
  at::Tensor Q =
      s.window_q[layer].narrow(0, 0, wl).narrow(1, head * G_, G_).transpose(0, 1).to(at::kFloat);
  at::Tensor sc = at::matmul(Q, K.t()).mul_(sm_scale_);  // [G, wl, len]
  std::vector<int64_t> kidx(hd.idx.begin(), hd.idx.begin() + len);
  auto lopts = at::TensorOptions().dtype(at::kLong).device(ctx_.device);
  at::Tensor ki = at::tensor(kidx, at::kLong).to(ctx_.device);
  at::Tensor qi = at::arange(wl, lopts) + (s.seen - wl);
  sc.masked_fill_(ki.unsqueeze(0) > qi.unsqueeze(1), -std::numeric_limits<float>::infinity());
  at::Tensor p =
      at::nan_to_num(at::softmax(sc, -1), 0.0).sum(1).to(at::kCPU).contiguous();  // [G, len]
  std::copy(p.data_ptr<float>(), p.data_ptr<float>() + G_ * len, out.begin());
  return out;
}

void EvictingKvCache::kept_rows_f32(const Seq& s, const Head& h, std::vector<float>* keys,
                                    std::vector<float>* values) {
  const int64_t len = h.len, base = s.next_pos - len;
  keys->resize(static_cast<size_t>(len * D_));
  values->resize(static_cast<size_t>(len * D_));
  if (fast_) {
    const float* K = keys_f32(heads_.keys_f32(h, &dec_k_), len, base, &scratch_k_);
    std::copy(K, K + len * D_, keys->begin());
    if (opts_.codec) {
      at::Tensor V = heads_.rows(h, 1);
      std::copy(V.data_ptr<float>(), V.data_ptr<float>() + len * D_, values->begin());
    } else {
      const float* V = h.kv.data_ptr<float>() + h.cap * D_;  // kv is [2, cap, D]
      std::copy(V, V + len * D_, values->begin());
    }
    return;
  }
  at::Tensor K = keys_generic(h, len, base).to(at::kCPU, at::kFloat).contiguous();
  at::Tensor V = h.kv.select(0, 1).narrow(0, 0, len).to(at::kCPU, at::kFloat).contiguous();
  std::copy(K.data_ptr<float>(), K.data_ptr<float>() + len * D_, keys->begin());
  std::copy(V.data_ptr<float>(), V.data_ptr<float>() + len * D_, values->begin());
}

std::vector<float> EvictingKvCache::key_norms(const Head& h) {
  std::vector<float> out(static_cast<size_t>(h.len), 0.f);
  if (h.len == 0) return out;
  if (fast_) {
    const float* K = heads_.keys_f32(h, &dec_k_);
    for (int64_t j = 0; j < h.len; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D_; ++d) s += static_cast<double>(K[j * D_ + d]) * K[j * D_ + d];
      out[j] = static_cast<float>(std::sqrt(s));
    }
    return out;
  }
  at::Tensor n = h.kv.select(0, 0)
                     .narrow(0, 0, h.len)
                     .to(at::kFloat)
                     .pow(2)
                     .sum(-1)
                     .sqrt()
                     .to(at::kCPU)
                     .contiguous();
  std::copy(n.data_ptr<float>(), n.data_ptr<float>() + h.len, out.begin());
  return out;
}

void EvictingKvCache::release(int64_t seq_id) {
  SeqStore::release(seq_id);
  question_for_.erase(seq_id);
}

void EvictingKvCache::fork(int64_t src_id, int64_t dst_id) {
  SeqStore::fork(src_id, dst_id);  // the heads deep-copy (RaggedHead); the query buffers below
  Seq& copy = seqs_.at(dst_id);
  for (auto& w : copy.window_q)
    if (w.defined()) w = w.clone();
  for (auto* stats : {&copy.q_sum, &copy.q_outer})
    for (auto& t : *stats)
      if (t.defined()) t = t.clone();
}

void EvictingKvCache::splice(int64_t dst_id, const std::vector<SpliceSource>& sources) {
  KVB_CHECK(!sources.empty(), opts_.name, ": splice needs at least one source");
  std::vector<int64_t> offset;
  int64_t total = 0;
  for (const auto& src : sources) {
    const Seq& s = seqs_.at(src.seq_id);
    KVB_ASSERT(s.step_tokens == 0, opts_.name, "splice source ", src.seq_id, " is mid-step");
    offset.push_back(total);
    total += s.seen;
  }
  Seq dst = new_seq(dst_id);
  dst.seen = total;
  dst.next_pos = total;
  for (int l = 0; l < L_; ++l) {
    for (int64_t hd = 0; hd < Hkv_; ++hd) {
      Head& h = dst.heads[l][hd];
      int64_t entries = 0;
      for (const auto& src : sources) entries += seqs_.at(src.seq_id).heads[l][hd].len;
      heads_.fit(h, entries);
      for (size_t i = 0; i < sources.size(); ++i) {
        const Head& sh = seqs_.at(sources[i].seq_id).heads[l][hd];
        if (sh.len == 0) continue;
        const bool move = opts_.position_mode == PositionMode::kAbsolute && sources[i].shift != 0;
        if (opts_.codec) {
          // Decoded (codes and pending rows), re-rotated and encoded again into fresh streams, as
          // the codec store splices: a second rounding of the keys for a quantizing codec.
          KVB_ASSERT(h.pend == 0, opts_.name, "splice into a head with pending rows");
          heads_.make_streams(h, l);
          at::Tensor k = heads_.rows(sh, 0);
          if (move) k = rope_shift(k.unsqueeze(1), ctx_.config, sources[i].shift).squeeze(1);
          k = k.contiguous();
          const at::Tensor v = heads_.rows(sh, 1).contiguous();
          h.ks.p->append(k.data_ptr<float>(), sh.len);
          h.vs.p->append(v.data_ptr<float>(), sh.len);
        } else {
          at::Tensor k = sh.kv.select(0, 0).narrow(0, 0, sh.len);
          if (move) k = rope_shift(k.unsqueeze(1), ctx_.config, sources[i].shift).squeeze(1);
          h.kv.select(0, 0).narrow(0, h.len, sh.len).copy_(k);
          h.kv.select(0, 1).narrow(0, h.len, sh.len).copy_(sh.kv.select(0, 1).narrow(0, 0, sh.len));
        }
        for (int64_t j = 0; j < sh.len; ++j) {
          h.idx[h.len + j] = static_cast<int32_t>(sh.idx[j] + offset[i]);
          if (needs_.accumulate) h.acc[h.len + j] = sh.acc[j];
        }
        h.evicted = h.evicted || sh.evicted;
        h.len += sh.len;
      }
    }
  }
  seqs_.add(dst_id, std::move(dst));
}

void EvictingKvCache::truncate(int64_t seq_id, int64_t new_len) {
  Seq& s = seqs_.truncating(seq_id, new_len);
  const int64_t drop = s.seen - new_len;
  for (auto& layer : s.heads)
    for (auto& h : layer) heads_.cut(h, new_len);
  for (auto& wl : s.window_len) wl = std::max<int64_t>(0, wl - drop);
  s.seen = new_len;
  s.next_pos -= drop;
}

Footprint EvictingKvCache::footprint() const {
  Footprint f;
  const int64_t entry_bytes = 2 * D_ * elem_;
  int64_t host_index = 0, host_meta = 0, window_bytes = 0, entries_all = 0, model_rows = 0;
  for (const auto& [id, s] : seqs_) {
    const RaggedBytes b = heads_.bytes(s.heads);
    f.device_payload_bytes += b.payload;
    f.device_reserved_bytes += b.reserved;
    model_rows += b.model_dtype;
    host_meta += b.metadata;
    host_index += b.index;
    for (const auto& w : s.window_q)
      if (w.defined()) window_bytes += w.numel() * elem_;
    for (const auto* stats : {&s.q_sum, &s.q_outer})
      for (const auto& t : *stats)
        if (t.defined()) host_meta += t.numel() * 8;
    entries_all += b.entries;
    f.tokens_held += b.entries / (L_ * Hkv_);
  }
  f.device_metadata_bytes = window_bytes;
  if (host_is_device_) {
    f.device_index_bytes = host_index;
    f.device_metadata_bytes += host_meta;
  } else {
    f.host_bytes = host_index + host_meta;
  }
  f.logical_bytes = entries_all * entry_bytes;
  // Kept rows (codec none), prompt rows pending at full precision and the observation window's
  // queries are in the model dtype.
  f.model_dtype_device_bytes = model_rows + window_bytes;
  return f;
}

std::map<std::string, double> EvictingKvCache::counters() const {
  std::map<std::string, double> c = policy_->settings();
  c["evicted_entries"] = static_cast<double>(evicted_entries_);
  c["evicted_tokens"] = static_cast<double>(evicted_entries_) / static_cast<double>(L_ * Hkv_);
  c["compressions"] = static_cast<double>(compressions_);
  c["reallocations"] = static_cast<double>(heads_.reallocations());
  double all_num = 0, all_den = 0;
  for (int64_t l = 0; l < L_; ++l) {
    std::vector<double> num(static_cast<size_t>(Hkv_), 0.0);
    double den = 0;
    for (const auto& [id, s] : seqs_) {
      den += static_cast<double>(s.seen);
      for (int64_t h = 0; h < Hkv_; ++h) num[h] += static_cast<double>(s.heads[l][h].len);
    }
    if (den <= 0) continue;
    double sum = 0, mn = 1e300, mx = 0;
    for (double x : num) {
      sum += x;
      mn = std::min(mn, x / den);
      mx = std::max(mx, x / den);
    }
    const std::string key = "kept_ratio.layer" + std::to_string(l);
    c[key] = sum / (den * static_cast<double>(Hkv_));
    c[key + ".head_min"] = mn;
    c[key + ".head_max"] = mx;
    all_num += sum;
    all_den += den * static_cast<double>(Hkv_);
  }
  if (all_den > 0) c["kept_ratio"] = all_num / all_den;
  if (opts_.codec) {
    for (const auto& [k, v] : opts_.codec->describe()) c["codec." + k] = v;
    CodecBytes kb, vb;
    for (const auto& [id, s] : seqs_)
      for (const auto& layer : s.heads)
        for (const auto& h : layer) heads_.add_codec_bytes(h, &kb, &vb);
    add_codec_bit_counters(kb, vb, &c);
  }
  return c;
}

std::vector<HeadSnapshot> EvictingKvCache::probe_view(int layer, int64_t seq_id) const {
  return probe_seq(seq_id, layer, L_, [&](const Seq& s) -> std::vector<HeadSnapshot> {
    std::vector<HeadSnapshot> out;
    for (int64_t h = 0; h < Hkv_; ++h) {
      const Head& hd = s.heads[layer][h];
      HeadSnapshot snap;
      snap.index =
          at::tensor(std::vector<int64_t>(hd.idx.begin(), hd.idx.begin() + hd.len), at::kLong);
      if (hd.len == 0) {
        snap.k = at::empty({0, D_}, at::kFloat);
        snap.v = at::empty({0, D_}, at::kFloat);
      } else {
        at::Tensor K = heads_.rows(hd, 0);
        if (opts_.position_mode == PositionMode::kRerotated) {
          const int64_t base = s.next_pos - hd.len;
          at::Tensor cos, sin;
          compute_rope_tables(ctx_.config, base + hd.len, &cos, &sin);
          K = rotate_rows(K.to(at::kCPU), cos.narrow(0, base, hd.len), sin.narrow(0, base, hd.len),
                          ctx_.config.rope_style == RopeStyle::kInterleaved);
        }
        snap.k = K.to(at::kCPU).to(at::kFloat).contiguous();
        snap.v = heads_.rows(hd, 1).to(at::kCPU).to(at::kFloat).contiguous();
      }
      out.push_back(std::move(snap));
    }
    return out;
  });
}

const RaggedHead& EvictingKvCache::head(int64_t seq_id, int layer, int64_t head) const {
  return seqs_.at(seq_id).heads.at(layer).at(head);
}

at::Tensor EvictingKvCache::kept_rows(int64_t seq_id, int layer, int64_t head, int which) const {
  const Head& h = seqs_.at(seq_id).heads.at(layer).at(head);
  if (!h.kv.defined() && !h.ks.p)
    return at::empty({0, D_}, at::TensorOptions().dtype(ctx_.dtype).device(ctx_.device));
  return heads_.rows(h, which);
}

}  // namespace kvb
