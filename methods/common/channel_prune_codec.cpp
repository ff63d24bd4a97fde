#include "methods/common/channel_prune_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "kvb/kernels/half.h"

namespace kvb {

namespace {

int64_t kept_count(int64_t D, double ratio) {
  return D - static_cast<int64_t>(std::floor(ratio * static_cast<double>(D) + 1e-9));
}

// Rounds x to the storage dtype (what reads back).
float round_to(float x, RowDtype d) {
  switch (d) {
    case RowDtype::kF16:
      return kernels::half_to_float(kernels::float_to_half(x));
    case RowDtype::kBF16:
      return kernels::bf16_to_float(kernels::float_to_bf16(x));
    default:
      return x;
  }
}

// One stored key row. Full rows (decode-time tokens) keep all D values; pruned rows keep their T
// values in channel order and a D-bit mask (spark) or share the stream's mask (think).
struct KeyRow {
  bool pruned = false;
  std::vector<float> vals;    // D (full) or T (pruned), rounded to the storage dtype
  std::vector<uint8_t> mask;  // spark: ceil(D / 8) bytes, bit c = channel c kept
  std::vector<uint8_t> sign;  // spark, average recovery: one bit per pruned channel (1 = negative)
  float m = 0.f;              // spark: mean pruned saliency, fp16-rounded
};

class PruneKeyStream : public CodecStream {
 public:
  PruneKeyStream(const ChannelPruneSpec& s, int layer, int64_t width, int64_t head_dim)
      : s_(s), D_(width), T_(kept_count(width, s.ratio)) {
    KVB_ASSERT(width == head_dim, "channel pruning codec", "a stream holds one head (width ", width,
              " != head_dim ", head_dim, ")");
    if (s_.inner) {
      full_.p = s_.inner->make_stream(KvKind::kKey, layer, D_, D_);
      kept_.p = s_.inner->make_stream(KvKind::kKey, layer, T_, T_);
    }
  }
  int64_t width() const override { return D_; }
  int64_t rows() const override { return static_cast<int64_t>(rows_.size()); }

  void set_query_energy(const float* energy, int64_t window) override {
    energy_.assign(energy, energy + D_);
    window_ = window;
    armed_ = true;
  }

  void append(const float* x, int64_t n) override {
    if (!armed_ || n == 0) {
      if (full_.p) {
        full_.p->append(x, n);
        rows_.resize(rows_.size() + static_cast<size_t>(n));
        return;
      }
      for (int64_t r = 0; r < n; ++r) rows_.push_back(full_row(x + r * D_));
      return;
    }
    armed_ = false;  // only the prompt's kept rows are pruned
    if (s_.mode == ChannelPruneMode::kThink) {
      // score_c = mean_window(q_c^2) * mean_tokens(k_c^2); n_c^2 / window = mean of q_c^2.
      std::vector<double> score(static_cast<size_t>(D_));
      for (int64_t c = 0; c < D_; ++c) {
        double kk = 0;
        for (int64_t r = 0; r < n; ++r) kk += static_cast<double>(x[r * D_ + c]) * x[r * D_ + c];
        const double q2 = static_cast<double>(energy_[c]) * energy_[c] / std::max<int64_t>(1, window_);
        score[c] = q2 * kk / static_cast<double>(n);
      }
      std::vector<int64_t> order(static_cast<size_t>(D_));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return score[a] > score[b]; });
      think_keep_.assign(order.begin(), order.begin() + T_);
      std::sort(think_keep_.begin(), think_keep_.end());
      std::vector<float> kept_vals;
      for (int64_t r = 0; r < n; ++r) {
        KeyRow row;
        row.pruned = true;
        for (int64_t c : think_keep_) {
          if (kept_.p)
            kept_vals.push_back(x[r * D_ + c]);
          else
            row.vals.push_back(round_to(x[r * D_ + c], s_.dtype));
        }
        rows_.push_back(std::move(row));
      }
      if (kept_.p) kept_.p->append(kept_vals.data(), n);
      return;
    }
    std::vector<float> kept_vals;
    for (int64_t r = 0; r < n; ++r) {
      const float* k = x + r * D_;
      std::vector<int64_t> keep = spark_kept_channels(k, energy_.data(), D_, s_.ratio);
      KeyRow row;
      row.pruned = true;
      row.mask.assign(static_cast<size_t>((D_ + 7) / 8), 0);
      double msum = 0;
      int64_t npruned = 0, ki = 0;
      std::vector<uint8_t> signs;
      for (int64_t c = 0; c < D_; ++c) {
        if (ki < static_cast<int64_t>(keep.size()) && keep[ki] == c) {
          row.mask[c / 8] |= static_cast<uint8_t>(1u << (c % 8));
          if (kept_.p)
            kept_vals.push_back(k[c]);
          else
            row.vals.push_back(round_to(k[c], s_.dtype));
          ++ki;
        } else {
          msum += static_cast<double>(k[c]) * k[c] * energy_[c];
          signs.push_back(k[c] < 0 ? 1 : 0);
          ++npruned;
        }
      }
      row.m = npruned ? kernels::half_to_float(kernels::float_to_half(static_cast<float>(msum / npruned))) : 0.f;
      if (s_.recovery == ChannelRecovery::kAverage) {
        row.sign.assign(static_cast<size_t>((npruned + 7) / 8), 0);
        for (int64_t i = 0; i < npruned; ++i)
          if (signs[i]) row.sign[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
      }
      rows_.push_back(std::move(row));
    }
    if (kept_.p) kept_.p->append(kept_vals.data(), n);
  }

  void decode(float* out) const override {
    // Stacked: the inner streams decode first; rows then read their values from them in order.
    std::vector<float> full_vals, kept_vals;
    if (full_.p) {
      full_vals.resize(static_cast<size_t>(full_.p->rows() * D_));
      kept_vals.resize(static_cast<size_t>(kept_.p->rows() * T_));
      full_.p->decode(full_vals.data());
      kept_.p->decode(kept_vals.data());
    }
    int64_t next_full = 0, next_kept = 0;
    for (size_t r = 0; r < rows_.size(); ++r) {
      const KeyRow& row = rows_[r];
      float* o = out + static_cast<int64_t>(r) * D_;
      const float* vals = row.vals.data();
      if (full_.p) vals = row.pruned ? kept_vals.data() + T_ * next_kept++ : full_vals.data() + D_ * next_full++;
      if (!row.pruned) {
        std::copy(vals, vals + D_, o);
        continue;
      }
      if (s_.mode == ChannelPruneMode::kThink) {
        std::fill(o, o + D_, 0.f);
        for (size_t i = 0; i < think_keep_.size(); ++i) o[think_keep_[i]] = vals[i];
        continue;
      }
      int64_t vi = 0, pi = 0;
      for (int64_t c = 0; c < D_; ++c) {
        if (row.mask[c / 8] & (1u << (c % 8))) {
          o[c] = vals[vi++];
        } else {
          float v = 0.f;
          if (s_.recovery == ChannelRecovery::kAverage && energy_[c] > 0.f) {
            v = std::sqrt(row.m / energy_[c]);
            if (row.sign[pi / 8] & (1u << (pi % 8))) v = -v;
          }
          o[c] = v;
          ++pi;
        }
      }
    }
  }

  void keep_rows(const std::vector<int64_t>& idx) override {
    std::vector<KeyRow> kept;
    kept.reserve(idx.size());
    // Stacked: each row's position within its inner stream, to keep the same rows there.
    std::vector<int64_t> pos(rows_.size()), keep_full, keep_kept;
    for (int64_t r = 0, nf = 0, nk = 0; r < rows(); ++r) pos[r] = rows_[r].pruned ? nk++ : nf++;
    for (size_t i = 0; i < idx.size(); ++i) {
      KVB_ASSERT(idx[i] >= 0 && idx[i] < rows() && (i == 0 || idx[i] > idx[i - 1]),
                 "channel pruning codec", "bad keep_rows index ", idx[i]);
      (rows_[idx[i]].pruned ? keep_kept : keep_full).push_back(pos[idx[i]]);
      kept.push_back(std::move(rows_[idx[i]]));
    }
    rows_.swap(kept);
    if (full_.p) {
      full_.p->keep_rows(keep_full);
      kept_.p->keep_rows(keep_kept);
    }
  }

  std::unique_ptr<CodecStream> clone() const override { return std::make_unique<PruneKeyStream>(*this); }

  CodecBytes bytes() const override {
    CodecBytes b;
    const int64_t eb = row_dtype_bytes(s_.dtype);
    bool any_pruned = false;
    if (full_.p) {
      b += full_.p->bytes();
      b += kept_.p->bytes();
    }
    for (const KeyRow& row : rows_) {
      if (full_.p) {
        // The inner streams count the stored values; a pruned row's D - T channels are encoded
        // (read back by recovery or as 0) without a value of their own.
        if (!row.pruned) continue;
        any_pruned = true;
        b.encoded_elems += D_ - T_;
        b.index_bytes += static_cast<int64_t>(row.mask.size());
        if (s_.mode == ChannelPruneMode::kSpark) b.metadata_bytes += 2 + static_cast<int64_t>(row.sign.size());
        continue;
      }
      if (!row.pruned) {
        b.full_bytes += D_ * eb;
        b.full_elems += D_;
        continue;
      }
      any_pruned = true;
      b.code_bytes += static_cast<int64_t>(row.vals.size()) * eb;
      b.encoded_elems += D_;
      b.index_bytes += static_cast<int64_t>(row.mask.size());
      if (s_.mode == ChannelPruneMode::kSpark) b.metadata_bytes += 2 + static_cast<int64_t>(row.sign.size());
    }
    if (any_pruned) {
      if (s_.mode == ChannelPruneMode::kThink) b.index_bytes += (D_ + 7) / 8;
      if (s_.mode == ChannelPruneMode::kSpark && s_.recovery == ChannelRecovery::kAverage)
        b.metadata_bytes += D_ * 4;  // the head's query energy, read by recovery
    }
    return b;
  }

 private:
  KeyRow full_row(const float* x) const {
    KeyRow row;
    row.vals.resize(static_cast<size_t>(D_));
    for (int64_t c = 0; c < D_; ++c) row.vals[c] = round_to(x[c], s_.dtype);
    return row;
  }

  ChannelPruneSpec s_;
  int64_t D_, T_;
  std::vector<KeyRow> rows_;
  std::vector<float> energy_;
  int64_t window_ = 0;
  bool armed_ = false;
  std::vector<int64_t> think_keep_;
  StreamBox full_, kept_;  // stacked on an inner codec: unpruned rows [., D], pruned kept values [., T]
};

class ChannelPruneCodec : public KvCodec {
 public:
  explicit ChannelPruneCodec(const ChannelPruneSpec& s) : s_(s), plain_(make_plain_codec(s.dtype)) {
    KVB_CHECK(s.ratio >= 0.0 && s.ratio < 1.0, "channel pruning: ratio ", s.ratio,
              " must be in [0, 1)");
  }
  std::string name() const override {
    return std::string(s_.mode == ChannelPruneMode::kSpark ? "spark" : "think") + "-rho" +
           std::to_string(s_.ratio) + (s_.inner ? "+" + s_.inner->name() : "");
  }
  std::unique_ptr<CodecStream> make_stream(KvKind kind, int layer, int64_t width,
                                           int64_t head_dim) const override {
    const KvCodec& values = s_.inner ? *s_.inner : *plain_;
    if (kind == KvKind::kValue) return values.make_stream(kind, layer, width, head_dim);
    return std::make_unique<PruneKeyStream>(s_, layer, width, head_dim);
  }
  double declared_bits(KvKind kind, int layer) const override {
    // Nominal, for a head of 8 x k channels: the kept fraction of the values. The measured
    // effective bits (mask, m_t, signs included) are the honest figure.
    const double full = s_.inner ? s_.inner->declared_bits(kind, layer)
                                 : 8.0 * static_cast<double>(row_dtype_bytes(s_.dtype));
    return kind == KvKind::kValue ? full : full * (1.0 - s_.ratio);
  }
  CodecBytes expected_bytes(KvKind kind, int layer, int64_t width, int64_t rows) const override {
    // Rows appended without a query energy are stored in full (or as the inner codec stores them).
    if (s_.inner) return s_.inner->expected_bytes(kind, layer, width, rows);
    (void)kind;
    (void)layer;
    CodecBytes b;
    b.full_bytes = rows * width * row_dtype_bytes(s_.dtype);
    b.full_elems = rows * width;
    return b;
  }
  std::map<std::string, double> describe() const override {
    std::map<std::string, double> d = describe_pruning();
    if (s_.inner)
      for (const auto& [k, v] : s_.inner->describe()) d["inner." + k] = v;
    return d;
  }
  int64_t query_window() const override { return s_.window; }
  QueryEnergy query_energy() const override { return s_.energy; }

 private:
  std::map<std::string, double> describe_pruning() const {
    return {{"pruning_ratio", s_.ratio},
            {"structured", s_.mode == ChannelPruneMode::kThink ? 1.0 : 0.0},
            {"average_recovery",
             s_.mode == ChannelPruneMode::kSpark && s_.recovery == ChannelRecovery::kAverage ? 1.0 : 0.0},
            {"observation_window", static_cast<double>(s_.window)},
            {"query_energy_mean_square", s_.energy == QueryEnergy::kMeanSquare ? 1.0 : 0.0}};
  }

  ChannelPruneSpec s_;
  std::unique_ptr<KvCodec> plain_;
};

}  // namespace

std::vector<int64_t> spark_kept_channels(const float* k, const float* energy, int64_t D,
                                         double ratio) {
  const int64_t T = kept_count(D, ratio);
  std::vector<int64_t> order(static_cast<size_t>(D));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return static_cast<double>(k[a]) * k[a] * energy[a] > static_cast<double>(k[b]) * k[b] * energy[b];
  });
  std::vector<int64_t> keep(order.begin(), order.begin() + T);
  std::sort(keep.begin(), keep.end());
  return keep;
}

std::shared_ptr<KvCodec> make_channel_prune_codec(const ChannelPruneSpec& spec) {
  return std::make_shared<ChannelPruneCodec>(spec);
}

}  // namespace kvb
