#pragma once
// A keep-everything KV store whose rows are held by a codec (kv_codec.h): one CodecStream per
// (sequence, layer, K|V), rows = tokens, width = num_kv_heads * head_dim. KIVI, per-token
// quantization and KVTuner are this store with different codecs.
//
// attend(): the stored rows are decoded into a scratch buffer (fp32), the step's new rows are put
// after them at full precision, attend_dense runs, and only then are the new rows appended to the
// streams (which encode what has become due). So a step always attends its own tokens at full
// precision, as KIVI does (prefill attends the whole prompt exactly; a decode step's key/value sit
// in the residual when they are attended). The scratch is transient (one sequence and layer at a
// time); its high-water mark is reported as the counter scratch_bytes_peak, not in the footprint.
//
// Sliding windows (LayerInput::window > 0, which it is only on a model whose every layer is a
// window: WindowedKvCache hands this store every layer there, windows included): each query attends
// only the last `window` rows, and after the step the streams keep the last window - 1 rows
// (keep_rows, which never re-encodes: a row that stays is exactly what it was; a key group that
// lost rows to the window keeps its scales until its last row goes, as under eviction). So the
// codec encodes the window, which is the model's whole cache there, at any length.
//
// CPU only for now: the streams live in host memory and the kernels are the CPU ones.

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/kv/kv_cache.h"
#include "harness/kv/method.h"
#include "harness/kv/splice.h"
#include "methods/common/kv_codec.h"
#include "methods/common/seq_store.h"

namespace kvb {

// One sequence: a stream per layer for K and for V (a copy is deep: fork).
struct CodecSeq {
  std::vector<StreamBox> k, v;
  int64_t len = 0;
};

class CodecKvCache : public SeqStore<CodecSeq>, public SplicingCache {
 public:
  // extra_counters join the codec's describe() and the measured figures in counters().
  CodecKvCache(const CacheContext& ctx, std::shared_ptr<const KvCodec> codec, std::string name,
               std::map<std::string, double> extra_counters = {});

  at::Tensor attend(const LayerInput& in) override;
  // It applies LayerInput::window itself (see above).
  bool serves_windows() const override { return true; }
  // Refused when a window layer no longer holds the rows the shorter sequence's window needs.
  void truncate(int64_t seq_id, int64_t new_len) override;
  Footprint footprint() const override;
  // The codec's figures plus measured ones: effective_bits_per_element (all physical bytes per live
  // element), encoded_bits_per_element (codes + metadata per encoded element), k_/v_ variants,
  // full_precision_fraction, scratch_bytes_peak.
  std::map<std::string, double> counters() const override;
  // Document reuse over a codec: each source's rows are decoded, its keys re-rotated, and the rows
  // appended to dst's streams, which encode them again (keys quantized per channel across tokens
  // are re-quantized in groups that now straddle the sources: a second rounding, which the
  // fidelity metrics see; per-token codecs re-encode values onto the same grid).
  void splice(int64_t dst_id, const std::vector<SpliceSource>& sources) override;

  const KvCodec& codec() const { return *codec_; }
  // For tests and tools: the stream of one sequence, layer and tensor.
  const CodecStream& stream(int64_t seq_id, int layer, KvKind kind) const;
  // Bytes summed over all sequences and layers, per tensor kind.
  CodecBytes bytes(KvKind kind) const;

 private:
  using Seq = CodecSeq;
  Seq new_seq(int64_t seq_id) override;

  CacheContext ctx_;
  std::shared_ptr<const KvCodec> codec_;
  std::map<std::string, double> extra_counters_;
  std::vector<int64_t> layer_window_;  // [n_layers]: the window a layer was attended with, 0: none
  std::vector<float> k_scratch_, v_scratch_;
  int64_t scratch_peak_bytes_ = 0;
};

}  // namespace kvb
