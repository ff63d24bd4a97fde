// kvtc: KV Cache Transform Coding (arXiv 2511.01815, ICLR 2026). The first `sinks` tokens and the
// most recent `window` tokens stay exact; older tokens leave the window in blocks of `block_tokens`
// and are stored transform-coded: keys un-rotated (the engine's pre-RoPE keys), values as they are,
// each projected onto a PCA basis calibrated once per model (all layers x heads concatenated, or
// per layer / head), quantized with the bits a DP allocated per component under a bit budget (0
// bits: dropped), bit-packed and entropy-coded (DEFLATE or zstd). A block is encoded once and never
// again. Attention reads the reconstructed cache: blocks are inflated and unpacked into
// coefficients once per step (transient scratch), each layer reconstructs its slice, keys are
// re-rotated at their positions, then exact attention. CPU only. See README.md.

#include "methods/kvtc/kvtc.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "harness/common/error.h"
#include "harness/kv/attention.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "kvb/kernels/cpu_ops.h"
#include "methods/common/kv_codec.h"
#include "methods/common/method_listing.h"

namespace kvb {
namespace {

using kvtc::Entropy;

MethodInfo kvtc_info() {
  MethodInfo m = method_listing(
      "kvtc",
      "KVTC: sinks + recent window exact; older tokens PCA-projected (pre-RoPE keys), DP bit "
      "allocation, bit-packed and entropy-coded (DEFLATE/zstd)",
      "Staniszewski et al. (NVIDIA), KV Cache Transform Coding for Compact Storage in LLM "
      "Inference, ICLR 2026 (arXiv 2511.01815)",
      {float_param("ratio", 16.0, 1.0, 1024.0,
                   "target compression of the coded tokens vs 16-bit: code bits per element = "
                   "16 / ratio (before entropy coding; the measured ratio is a counter)"),
       float_param("bits", 0.0, 0.0, 16.0,
                   "code bits per element of a coded token; > 0 overrides `ratio`"),
       int_param("rank", -1, -1, 1 << 20,
                 "PCA components considered per basis (-1: all); the DP drops more"),
       string_param("pca_scope", "model", {"model", "layer", "head"},
                    "model: one basis over all layers x KV heads (the paper); layer / head: one "
                    "basis per layer / per (layer, head)"),
       string_param("allocation", "dp", {"dp", "uniform"},
                    "unset or dp: the DP spreads the bit budget over the PCA components (the "
                    "paper); uniform: one width for every coded component, the leading ones "
                    "while the same budget lasts (the baseline the DP is claimed to beat)")
           .unset_by_default(),
       int_param("band", 1, 1, 4096, "consecutive components tied to one bit width in the DP"),
       int_param("sinks", 4, 0, 1 << 20, "first tokens kept exact (attention sinks)"),
       int_param("window", 128, 0, 1 << 20, "most recent tokens kept exact"),
       int_param("block_tokens", 32, 1, 1 << 16,
                 "tokens coded together once they leave the window (the exact tail holds "
                 "window .. window + block_tokens - 1 tokens)"),
       string_param("entropy", "deflate", {"deflate", "zstd", "none"},
                    "entropy coder of each packed block (the paper: DEFLATE via nvCOMP)"),
       int_param("entropy_level", -1, -1, 22, "-1: deflate 9, zstd 19"),
       string_param("exact_dtype", "fp16", {"fp16", "bf16", "fp32"},
                    "storage of the exact sinks and window"),
       string_param("calib_corpus", "tinystories-valid-sample", {},
                    "calibration text: a built-in corpus name or a .txt path"),
       int_param("calib_tokens", 16384, 2, 1 << 24, "token positions collected for calibration"),
       int_param("calib_skip_tokens", 32768, 0, 1 << 30,
                 "corpus tokens skipped before calibration (keeps the evaluation text out)"),
       int_param("calib_window", -1, -1, 1 << 20,
                 "tokens per calibration sequence (-1: min(512, the model's max_seq_len))"),
       string_param("calib_model", "", {},
                    "model spec to calibrate with (\"\": the run's model itself, or by name where "
                    "the cache was built without it); must match the run's config"),
       string_param("data_dir", "", {},
                    "where calib_corpus lives (\"\": $KVBENCH_DATA, ./data, "
                    "../shared/data)"),
       string_param("cache_dir", "results/cache/kvtc", {},
                    "calibration artifacts, by content hash (\"\": not saved)")});
  m.caps.quantizes = true;
  m.caps.needs_calibration = true;
  m.caps.cpu_only = true;  // the PCA transform coder is host code
  return m;
}

constexpr int64_t kHeaderBytes = 16;  // start pos i32, n u16, k coder u8, v coder u8, k/v len u32

struct Block {
  std::vector<uint8_t> bytes;  // header | [n x i32 positions when not consecutive] | k | v
  int64_t n = 0;
  int64_t k_len = 0, v_len = 0;  // stored payload bytes
  int64_t k_raw = 0, v_raw = 0;  // packed bytes before entropy coding
  int64_t pos_bytes = 0;         // explicit positions (0 when consecutive)
};

template <typename T>
void put_le(std::vector<uint8_t>& o, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    o.push_back(static_cast<uint8_t>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
}
template <typename T>
T get_le(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

class KvtcCache : public KvCache {
 public:
  KvtcCache(const CacheContext& ctx, const nlohmann::json& p) : ctx_(ctx) {
    const auto& c = ctx_.config;
    KVB_CHECK(c.head_dim % 2 == 0, "kvtc: head_dim ", c.head_dim, " must be even (RoPE pairs)");
    sinks_ = p["sinks"].get<int64_t>();
    window_ = p["window"].get<int64_t>();
    block_ = p["block_tokens"].get<int64_t>();
    entropy_ = kvtc::parse_entropy(p["entropy"].get<std::string>());
    level_ = p["entropy_level"].get<int>();
    if (level_ < 0) level_ = entropy_ == Entropy::kZstd ? 19 : 9;
    KVB_CHECK(entropy_ != Entropy::kDeflate || level_ <= 9, "method kvtc.entropy_level: ", level_,
              " is above DEFLATE's 9");
    exact_dtype_ = parse_row_dtype(p["exact_dtype"].get<std::string>());
    const double bits =
        p["bits"].get<double>() > 0 ? p["bits"].get<double>() : 16.0 / p["ratio"].get<double>();
    topt_.scope = kvtc::parse_scope(p["pca_scope"].get<std::string>());
    topt_.rank = p["rank"].get<int64_t>();
    topt_.bits_per_element = bits;
    topt_.band = p["band"].get<int64_t>();
    // Unset means the DP; it stays out of resolved configs, so DP configs keep their hashes.
    if (p.contains("allocation") && !p["allocation"].is_null())
      topt_.allocation = kvtc::parse_bit_allocation(p["allocation"].get<std::string>());
    copt_.corpus = p["calib_corpus"].get<std::string>();
    copt_.data_dir = p["data_dir"].get<std::string>();
    copt_.tokens = p["calib_tokens"].get<int64_t>();
    copt_.skip_tokens = p["calib_skip_tokens"].get<int64_t>();
    const int64_t cw = p["calib_window"].get<int64_t>();
    copt_.window = cw > 0 ? cw : std::min<int64_t>(512, c.max_seq_len > 0 ? c.max_seq_len : 512);
    copt_.exclude_sinks = sinks_;
    copt_.exclude_recent =
        std::min<int64_t>(window_, std::max<int64_t>(0, copt_.window - sinks_ - 32));
    calib_model_ = p["calib_model"].get<std::string>();
    cache_dir_ = p["cache_dir"].get<std::string>();
    width_ = c.kv_dim();
    plain_ = make_plain_codec(exact_dtype_);
  }

  std::string name() const override { return "kvtc"; }

  void begin_step(const StepBatch& batch) override {
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      const int64_t id = batch.seq_ids[b];
      auto it = seqs_.find(id);
      if (it == seqs_.end()) it = seqs_.emplace(id, new_seq()).first;
      KVB_CHECK(it->second.len == batch.past_lens[b], "kvtc: sequence ", id, " holds ",
                it->second.len, " tokens but the step says ", batch.past_lens[b]);
      it->second.decoded = false;
    }
  }

  at::Tensor attend(const LayerInput& in) override {
    const StepBatch& batch = *in.batch;
    const auto& c = ctx_.config;
    const int64_t W = width_, l = in.layer;
    std::vector<at::Tensor> outs;
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      const int64_t n = batch.new_tokens(b), start = batch.q_indptr[b];
      const int64_t S = static_cast<int64_t>(s.sink_pos.size()),
                    T = static_cast<int64_t>(s.tail_pos.size());
      if (!s.decoded) decode_middle(s);
      const int64_t M = static_cast<int64_t>(s.mid_pos.size());
      const int64_t stored = S + M + T, L = stored + n;
      k_scratch_.resize(static_cast<size_t>(L * W));
      v_scratch_.resize(static_cast<size_t>(L * W));
      float* K = k_scratch_.data();
      float* V = v_scratch_.data();
      s.sk[l]->decode(K);
      s.sv[l]->decode(V);
      if (M > 0) {
        kvtc::reconstruct(art_->k, s.coef_k.data(), M, l * W, (l + 1) * W, K + S * W);
        kvtc::reconstruct(art_->v, s.coef_v.data(), M, l * W, (l + 1) * W, V + S * W);
      }
      s.tk[l]->decode(K + (S + M) * W);
      s.tv[l]->decode(V + (S + M) * W);
      // Re-rotate every stored key at its position (the engine's own RoPE kernel and tables).
      pos_scratch_.resize(static_cast<size_t>(stored));
      int64_t* P = pos_scratch_.data();
      for (int64_t i = 0; i < S; ++i) P[i] = s.sink_pos[i];
      for (int64_t i = 0; i < M; ++i) P[S + i] = s.mid_pos[i];
      for (int64_t i = 0; i < T; ++i) P[S + M + i] = s.tail_pos[i];
      int64_t max_pos = 0;
      for (int64_t i = 0; i < stored; ++i) max_pos = std::max(max_pos, P[i]);
      ensure_rope(max_pos + 1);
      kernels::rope_f32(K, stored, c.n_kv_heads, c.head_dim, W, rope_cos_.data_ptr<float>(),
                        rope_sin_.data_ptr<float>(), P, c.rope_style == RopeStyle::kInterleaved);
      at::Tensor kn = in.k->narrow(0, start, n).to(at::kFloat).contiguous();  // post-RoPE
      at::Tensor kpre = in.k_pre_rope->narrow(0, start, n).to(at::kFloat).contiguous();
      at::Tensor vn = in.v->narrow(0, start, n).to(at::kFloat).contiguous();
      std::memcpy(K + stored * W, kn.data_ptr<float>(), static_cast<size_t>(n * W * 4));
      std::memcpy(V + stored * W, vn.data_ptr<float>(), static_cast<size_t>(n * W * 4));
      scratch_peak_bytes_ = std::max<int64_t>(scratch_peak_bytes_, 2 * L * W * 4 + s.coef_bytes());
      auto opts = at::TensorOptions().dtype(at::kFloat);
      at::Tensor Kt = at::from_blob(K, {L, c.n_kv_heads, c.head_dim}, opts);
      at::Tensor Vt = at::from_blob(V, {L, c.n_kv_heads, c.head_dim}, opts);
      const at::Tensor q = in.q->narrow(0, start, n);
      if (q.scalar_type() != at::kFloat) {
        Kt = Kt.to(q.scalar_type());
        Vt = Vt.to(q.scalar_type());
      }
      outs.push_back(attend_dense(q, Kt, Vt, in.sm_scale));
      // The new rows enter the exact store (pre-RoPE keys): sinks first, then the tail.
      const int64_t ns = sink_share(s, n);
      const float* kp = kpre.data_ptr<float>();
      const float* vp = vn.data_ptr<float>();
      if (ns > 0) {
        s.sk[l]->append(kp, ns);
        s.sv[l]->append(vp, ns);
      }
      if (n > ns) {
        s.tk[l]->append(kp + ns * W, n - ns);
        s.tv[l]->append(vp + ns * W, n - ns);
      }
    }
    return outs.size() == 1 ? outs[0] : at::cat(outs, 0);
  }

  void end_step(const StepBatch& batch) override {
    for (int64_t b = 0; b < batch.batch_size(); ++b) {
      Seq& s = seqs_.at(batch.seq_ids[b]);
      const int64_t n = batch.new_tokens(b), ns = sink_share(s, n);
      const int64_t* pos = batch.positions.data() + batch.q_indptr[b];
      for (int64_t i = 0; i < n; ++i)
        (i < ns ? s.sink_pos : s.tail_pos).push_back(static_cast<int32_t>(pos[i]));
      s.len += n;
      s.free_decoded();
      while (static_cast<int64_t>(s.tail_pos.size()) >= window_ + block_) compress_block(s);
    }
  }

  void release(int64_t seq_id) override { seqs_.erase(seq_id); }

  void fork(int64_t src_id, int64_t dst_id) override {
    KVB_CHECK(seqs_.count(dst_id) == 0, "kvtc: fork target ", dst_id, " already exists");
    auto it = seqs_.find(src_id);
    KVB_CHECK(it != seqs_.end(), "kvtc: unknown sequence ", src_id);
    const Seq& a = it->second;
    Seq d;
    d.len = a.len;
    d.sink_pos = a.sink_pos;
    d.tail_pos = a.tail_pos;
    d.blocks = a.blocks;  // immutable, shared
    for (int64_t l = 0; l < ctx_.config.n_layers; ++l) {
      d.sk.push_back(a.sk[l]->clone());
      d.sv.push_back(a.sv[l]->clone());
      d.tk.push_back(a.tk[l]->clone());
      d.tv.push_back(a.tv[l]->clone());
    }
    seqs_.emplace(dst_id, std::move(d));
  }

  void truncate(int64_t seq_id, int64_t new_len) override {
    auto it = seqs_.find(seq_id);
    KVB_CHECK(it != seqs_.end(), "kvtc: unknown sequence ", seq_id);
    Seq& s = it->second;
    KVB_CHECK(new_len >= 0 && new_len <= s.len, "kvtc: cannot truncate sequence ", seq_id, " of ",
              s.len, " tokens to ", new_len);
    const int64_t S = static_cast<int64_t>(s.sink_pos.size());
    int64_t M = 0;
    for (const auto& bl : s.blocks) M += bl.live;
    const int64_t L = ctx_.config.n_layers;
    if (new_len >= S + M) {
      const int64_t t = new_len - S - M;
      for (int64_t l = 0; l < L; ++l) {
        s.tk[l]->truncate(t);
        s.tv[l]->truncate(t);
      }
      s.tail_pos.resize(static_cast<size_t>(t));
    } else {
      for (int64_t l = 0; l < L; ++l) {
        s.tk[l]->truncate(0);
        s.tv[l]->truncate(0);
      }
      s.tail_pos.clear();
      if (new_len >= S) {
        // Whole blocks past new_len go; a block cut inside keeps its bytes with fewer live tokens.
        int64_t keep = new_len - S;
        std::vector<LiveBlock> kept;
        for (auto& bl : s.blocks) {
          if (keep == 0) break;
          bl.live = std::min(bl.live, keep);
          keep -= bl.live;
          kept.push_back(bl);
        }
        s.blocks = std::move(kept);
      } else {
        s.blocks.clear();
        for (int64_t l = 0; l < L; ++l) {
          s.sk[l]->truncate(new_len);
          s.sv[l]->truncate(new_len);
        }
        s.sink_pos.resize(static_cast<size_t>(new_len));
      }
    }
    s.len = new_len;
    s.free_decoded();
  }

  int64_t seq_len(int64_t seq_id) const override {
    auto it = seqs_.find(seq_id);
    return it == seqs_.end() ? 0 : it->second.len;
  }

  Footprint footprint() const override {
    Footprint f;
    std::unordered_set<const Block*> seen;
    for (const auto& [id, s] : seqs_) {
      for (const auto* v : {&s.sk, &s.sv, &s.tk, &s.tv})
        for (const auto& st : *v) {
          const CodecBytes b = st->bytes();
          f.device_payload_bytes += b.full_bytes;
          f.device_reserved_bytes += b.reserved_bytes;
        }
      f.device_index_bytes += 4 * static_cast<int64_t>(s.sink_pos.size() + s.tail_pos.size());
      for (const auto& bl : s.blocks) {
        if (!seen.insert(bl.block.get()).second) continue;
        f.device_payload_bytes += bl.block->k_len + bl.block->v_len;
        f.device_metadata_bytes += kHeaderBytes;
        f.device_index_bytes += bl.block->pos_bytes;
      }
      f.tokens_held += s.len;
    }
    f.logical_bytes = f.tokens_held * ctx_.config.kv_bytes_per_token(
                                          static_cast<int64_t>(c10::elementSize(ctx_.dtype)));
    f.model_dtype_device_bytes = 0;  // exact sinks and tail are codec rows, the rest coded blocks
    return f;
  }

  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m;
    m["target_bits_per_element"] = topt_.bits_per_element;
    m["uniform_allocation"] = topt_.allocation == kvtc::BitAllocation::kUniform ? 1.0 : 0.0;
    m["sinks"] = static_cast<double>(sinks_);
    m["window"] = static_cast<double>(window_);
    m["block_tokens"] = static_cast<double>(block_);
    m["calibrated"] = art_ ? 1.0 : 0.0;
    if (art_) {
      m["calib_artifact_bytes"] = static_cast<double>(art_->file_bytes);
      m["calib_transform_bytes"] = static_cast<double>(art_->transform_bytes);
      m["calib_seconds"] = art_->seconds;
      m["calib_from_cache"] = art_->from_cache ? 1.0 : 0.0;
      for (const auto& [k, t] :
           {std::pair<const char*, const kvtc::KindTransform*>{"k", &art_->k}, {"v", &art_->v}}) {
        const std::string p = k;
        m[p + "_code_bits_per_token"] = static_cast<double>(t->code_bits_per_token);
        m[p + "_components_used"] = static_cast<double>(t->components_used);
        m[p + "_calib_rel_mse"] = t->total_variance > 0 ? t->expected_mse / t->total_variance : 0;
        m[p + "_energy_kept"] = t->energy_top_used;
      }
      // The paper codes keys before RoPE because they compact better: the same transform fitted
      // on post-RoPE keys, at the same budget, for comparison (calibration data, not coded).
      m["k_post_rope_calib_rel_mse"] = art_->k_post_rope_rel_mse;
      m["k_post_rope_energy_kept"] = art_->k_post_rope_energy_top_used;
      if (art_->k_post_rope_rel_mse > 0)
        m["k_calib_rel_mse_pre_over_post_rope"] =
            (art_->k.total_variance > 0 ? art_->k.expected_mse / art_->k.total_variance : 0) /
            art_->k_post_rope_rel_mse;
    }
    // Coded tokens: real stored sizes.
    std::unordered_set<const Block*> seen;
    int64_t coded_tokens = 0, k_pay = 0, v_pay = 0, k_raw = 0, v_raw = 0, hdr = 0, nblocks = 0,
            exact_tokens = 0;
    for (const auto& [id, s] : seqs_) {
      exact_tokens += static_cast<int64_t>(s.sink_pos.size() + s.tail_pos.size());
      for (const auto& bl : s.blocks) {
        coded_tokens += bl.live;
        if (!seen.insert(bl.block.get()).second) continue;
        ++nblocks;
        k_pay += bl.block->k_len;
        v_pay += bl.block->v_len;
        k_raw += bl.block->k_raw;
        v_raw += bl.block->v_raw;
        hdr += kHeaderBytes + bl.block->pos_bytes;
      }
    }
    const double elems =
        static_cast<double>(coded_tokens) * ctx_.config.n_layers * width_;  // per K or V
    m["blocks"] = static_cast<double>(nblocks);
    m["coded_tokens"] = static_cast<double>(coded_tokens);
    m["exact_tokens"] = static_cast<double>(exact_tokens);
    m["coded_k_payload_bytes"] = static_cast<double>(k_pay);
    m["coded_v_payload_bytes"] = static_cast<double>(v_pay);
    m["coded_packed_bytes"] = static_cast<double>(k_raw + v_raw);
    m["coded_header_bytes"] = static_cast<double>(hdr);
    if (coded_tokens > 0) {
      const double stored = static_cast<double>(k_pay + v_pay + hdr);
      m["entropy_gain"] = static_cast<double>(k_raw + v_raw) / static_cast<double>(k_pay + v_pay);
      m["k_coded_bits_per_element"] = 8.0 * static_cast<double>(k_pay) / elems;
      m["v_coded_bits_per_element"] = 8.0 * static_cast<double>(v_pay) / elems;
      m["coded_bits_per_element"] = 8.0 * stored / (2 * elems);
      m["coded_ratio_vs_16bit"] = 2 * elems * 2.0 / stored;
    }
    const Footprint f = footprint();
    if (f.tokens_held > 0) {
      const double all_elems =
          static_cast<double>(f.tokens_held) * 2.0 * ctx_.config.n_layers * width_;
      m["effective_bits_per_element"] = 8.0 * static_cast<double>(f.physical_bytes()) / all_elems;
      m["ratio_vs_16bit"] = all_elems * 2.0 / static_cast<double>(f.physical_bytes());
    }
    m["scratch_bytes_peak"] = static_cast<double>(scratch_peak_bytes_);
    return m;
  }

  std::shared_ptr<const kvtc::Artifact> artifact() const { return art_; }
  // For tests: the stored bytes of every coded block of a sequence, oldest first.
  std::vector<std::vector<uint8_t>> block_bytes(int64_t seq_id) const {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& bl : seqs_.at(seq_id).blocks) out.push_back(bl.block->bytes);
    return out;
  }

 private:
  struct LiveBlock {
    std::shared_ptr<const Block> block;
    int64_t live = 0;  // tokens of the block still in the sequence (truncate may cut a block)
  };
  struct Seq {
    int64_t len = 0;
    std::vector<std::unique_ptr<CodecStream>> sk, sv, tk, tv;  // per layer, [rows, kv_dim]
    std::vector<int32_t> sink_pos, tail_pos;
    std::vector<LiveBlock> blocks;
    // Transient, one step: the blocks' dequantized coefficients and positions.
    bool decoded = false;
    std::vector<float> coef_k, coef_v;  // [coded tokens, components_used]
    std::vector<int64_t> mid_pos;
    int64_t coef_bytes() const {
      return static_cast<int64_t>(4 * (coef_k.size() + coef_v.size()) + 8 * mid_pos.size());
    }
    void free_decoded() {
      decoded = false;
      std::vector<float>().swap(coef_k);
      std::vector<float>().swap(coef_v);
      std::vector<int64_t>().swap(mid_pos);
    }
  };

  Seq new_seq() const {
    Seq s;
    const auto& c = ctx_.config;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      s.sk.push_back(plain_->make_stream(KvKind::kKey, static_cast<int>(l), width_, c.head_dim));
      s.sv.push_back(plain_->make_stream(KvKind::kValue, static_cast<int>(l), width_, c.head_dim));
      s.tk.push_back(plain_->make_stream(KvKind::kKey, static_cast<int>(l), width_, c.head_dim));
      s.tv.push_back(plain_->make_stream(KvKind::kValue, static_cast<int>(l), width_, c.head_dim));
    }
    return s;
  }

  // How many of n new tokens go to the sinks (only while nothing follows them).
  int64_t sink_share(const Seq& s, int64_t n) const {
    if (!s.blocks.empty() || !s.tail_pos.empty()) return 0;
    return std::min<int64_t>(
        n, std::max<int64_t>(0, sinks_ - static_cast<int64_t>(s.sink_pos.size())));
  }

  void ensure_rope(int64_t n) {
    if (rope_cos_.defined() && rope_cos_.size(0) >= n) return;
    const int64_t len =
        std::max<int64_t>(n, std::max<int64_t>(rope_cos_.defined() ? 2 * rope_cos_.size(0) : 0,
                                               std::max<int64_t>(ctx_.config.max_seq_len, 1024)));
    compute_rope_tables(ctx_.config, len, &rope_cos_, &rope_sin_);
  }

  void ensure_artifact() {
    if (art_) return;
    // The run's model when the cache was built with it (CacheContext::model); a second copy is
    // loaded only for calib_model, or where no model came with the context.
    const bool own = calib_model_.empty() && ctx_.model;
    const std::string spec = own                    ? ctx_.model->source
                             : calib_model_.empty() ? ctx_.config.name
                                                    : calib_model_;
    std::shared_ptr<Model> model = own ? ctx_.model : nullptr;
    if (!model) {
      try {
        model = load_model(spec);
      } catch (const Error& e) {
        KVB_FAIL("method kvtc: cannot load calibration model '", spec,
                 "' (set calib_model to its path): ", e.what());
      }
    }
    KVB_CHECK(model->config.to_json().dump() == ctx_.config.to_json().dump(),
              "method kvtc: calibration model '", spec, "' does not match the run's model config");
    art_ = kvtc::calibrate(model, copt_, topt_, cache_dir_);
  }

  void compress_block(Seq& s) {
    ensure_artifact();
    const auto& c = ctx_.config;
    const int64_t B = block_, W = width_, L = c.n_layers, P = L * W;
    const int64_t T = static_cast<int64_t>(s.tail_pos.size());
    std::vector<float> kx(static_cast<size_t>(B * P)), vx(static_cast<size_t>(B * P));
    std::vector<float> tmp(static_cast<size_t>(T * W));
    for (int64_t l = 0; l < L; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        (kv == 0 ? s.tk : s.tv)[l]->decode(tmp.data());
        float* dst = (kv == 0 ? kx : vx).data();
        for (int64_t t = 0; t < B; ++t)
          std::memcpy(dst + t * P + l * W, tmp.data() + t * W, static_cast<size_t>(W * 4));
      }
    }
    auto blk = std::make_shared<Block>();
    blk->n = B;
    bool consecutive = true;
    for (int64_t t = 1; t < B; ++t) consecutive &= s.tail_pos[t] == s.tail_pos[0] + t;
    const std::vector<uint8_t> kp = kvtc::pack_block(art_->k, kx.data(), B);
    const std::vector<uint8_t> vp = kvtc::pack_block(art_->v, vx.data(), B);
    auto code = [&](const std::vector<uint8_t>& raw, uint8_t* coder) {
      std::vector<uint8_t> e = kvtc::entropy_encode(entropy_, raw.data(), raw.size(), level_);
      if (entropy_ == Entropy::kNone || e.size() >= raw.size()) {
        *coder = 0;  // stored: the coder would not shrink it
        return raw;
      }
      *coder = static_cast<uint8_t>(entropy_);
      return e;
    };
    uint8_t kc = 0, vc = 0;
    const std::vector<uint8_t> ke = code(kp, &kc), ve = code(vp, &vc);
    std::vector<uint8_t>& o = blk->bytes;
    put_le<int32_t>(o, s.tail_pos[0]);
    put_le<uint16_t>(o, static_cast<uint16_t>(B));
    o.push_back(static_cast<uint8_t>(kc | (consecutive ? 0 : 0x80)));
    o.push_back(vc);
    put_le<uint32_t>(o, static_cast<uint32_t>(ke.size()));
    put_le<uint32_t>(o, static_cast<uint32_t>(ve.size()));
    if (!consecutive)
      for (int64_t t = 0; t < B; ++t) put_le<int32_t>(o, s.tail_pos[t]);
    o.insert(o.end(), ke.begin(), ke.end());
    o.insert(o.end(), ve.begin(), ve.end());
    blk->k_len = static_cast<int64_t>(ke.size());
    blk->v_len = static_cast<int64_t>(ve.size());
    blk->k_raw = static_cast<int64_t>(kp.size());
    blk->v_raw = static_cast<int64_t>(vp.size());
    blk->pos_bytes = consecutive ? 0 : 4 * B;
    KVB_CHECK(
        static_cast<int64_t>(o.size()) == kHeaderBytes + blk->pos_bytes + blk->k_len + blk->v_len,
        "kvtc: block layout");
    s.blocks.push_back({blk, B});
    std::vector<int64_t> keep;
    for (int64_t t = B; t < T; ++t) keep.push_back(t);
    for (int64_t l = 0; l < L; ++l) {
      s.tk[l]->keep_rows(keep);
      s.tv[l]->keep_rows(keep);
    }
    s.tail_pos.erase(s.tail_pos.begin(), s.tail_pos.begin() + B);
  }

  // Inflates and unpacks every block of s into coefficients (once per step).
  void decode_middle(Seq& s) {
    s.decoded = true;
    if (s.blocks.empty()) return;
    const int64_t Ck = art_->k.components_used, Cv = art_->v.components_used;
    int64_t M = 0;
    for (const auto& bl : s.blocks) M += bl.live;
    s.coef_k.assign(static_cast<size_t>(M * Ck), 0.f);
    s.coef_v.assign(static_cast<size_t>(M * Cv), 0.f);
    s.mid_pos.clear();
    int64_t row = 0;
    std::vector<uint8_t> raw;
    std::vector<float> coef;
    for (const auto& bl : s.blocks) {
      const uint8_t* p = bl.block->bytes.data();
      const int64_t start = get_le<int32_t>(p), n = get_le<uint16_t>(p + 4);
      const uint8_t kc = p[6] & 0x7f, vc = p[7];
      const bool explicit_pos = (p[6] & 0x80) != 0;
      const int64_t kl = get_le<uint32_t>(p + 8), vl = get_le<uint32_t>(p + 12);
      const uint8_t* q = p + kHeaderBytes;
      for (int64_t t = 0; t < bl.live; ++t)
        s.mid_pos.push_back(explicit_pos ? get_le<int32_t>(q + 4 * t) : start + t);
      if (explicit_pos) q += 4 * n;
      for (int kv = 0; kv < 2; ++kv) {
        const kvtc::KindTransform& tr = kv == 0 ? art_->k : art_->v;
        const int64_t len = kv == 0 ? kl : vl;
        const uint8_t coder = kv == 0 ? kc : vc;
        raw.resize(static_cast<size_t>(kvtc::packed_block_bytes(tr, n)));
        kvtc::entropy_decode(static_cast<Entropy>(coder), q, static_cast<size_t>(len), raw.data(),
                             raw.size());
        const int64_t C = tr.components_used;
        coef.resize(static_cast<size_t>(n * C));
        kvtc::unpack_block(tr, raw.data(), raw.size(), n, coef.data());
        float* dst = (kv == 0 ? s.coef_k : s.coef_v).data() + row * C;
        std::memcpy(dst, coef.data(), static_cast<size_t>(bl.live * C * 4));
        q += len;
      }
      row += bl.live;
    }
  }

  CacheContext ctx_;
  int64_t sinks_ = 4, window_ = 128, block_ = 32, width_ = 0;
  Entropy entropy_ = Entropy::kDeflate;
  int level_ = 9;
  RowDtype exact_dtype_ = RowDtype::kF16;
  kvtc::TransformOptions topt_;
  kvtc::CalibOptions copt_;
  std::string calib_model_, cache_dir_;
  std::unique_ptr<KvCodec> plain_;
  std::shared_ptr<const kvtc::Artifact> art_;
  std::unordered_map<int64_t, Seq> seqs_;
  std::vector<float> k_scratch_, v_scratch_;
  std::vector<int64_t> pos_scratch_;
  int64_t scratch_peak_bytes_ = 0;
  at::Tensor rope_cos_, rope_sin_;  // [n_pos, head_dim / 2] fp32
};

std::unique_ptr<KvCache> make_kvtc(const CacheContext& ctx, const nlohmann::json& p) {
  return std::make_unique<KvtcCache>(ctx, p);
}

}  // namespace

namespace kvtc {
std::vector<std::vector<uint8_t>> coded_blocks(const KvCache& kv, int64_t seq_id) {
  const auto* c = dynamic_cast<const KvtcCache*>(&kv);
  KVB_CHECK(c != nullptr, "kvtc::coded_blocks: '", kv.name(), "' is not a kvtc cache");
  return c->block_bytes(seq_id);
}
std::shared_ptr<const Artifact> cache_artifact(const KvCache& kv) {
  const auto* c = dynamic_cast<const KvtcCache*>(&kv);
  KVB_CHECK(c != nullptr, "kvtc::cache_artifact: '", kv.name(), "' is not a kvtc cache");
  return c->artifact();
}
}  // namespace kvtc
}  // namespace kvb

KVB_REGISTER_METHOD(kvtc, kvb::kvtc_info, kvb::make_kvtc);
