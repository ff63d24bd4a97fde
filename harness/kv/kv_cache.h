#pragma once
// The seam between the engine and whatever stores the KV cache. The engine never knows which store or
// method runs: for every layer it hands over the step's q, k (before and after RoPE), v, positions and
// sequence ids, and gets the attention output back. Sequences are identified by int64 ids that the
// engine allocates.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/common/error.h"

namespace kvb {

enum class Phase { kPrefill, kDecode };

// One forward step over the packed tokens of several sequences (ragged, FlashInfer's indptr form).
struct StepBatch {
  std::vector<int64_t> seq_ids;    // [batch]
  std::vector<int64_t> q_indptr;   // [batch + 1], offsets of each sequence's tokens in the packed T
  std::vector<int64_t> past_lens;  // [batch], tokens each sequence held before this step
  std::vector<int64_t> positions;  // [T], RoPE positions of the step's tokens
  Phase phase = Phase::kPrefill;
  // Empty, or [batch]: 1 where the sequence's last new row is a lookahead row (SpeCache's
  // speculative token): attended like the others, its KV not kept, so the sequence grows by one
  // row fewer. Only stores that ask for it (KvCache::wants_lookahead) get such steps.
  std::vector<uint8_t> lookahead;

  int64_t batch_size() const { return static_cast<int64_t>(seq_ids.size()); }
  int64_t num_tokens() const { return q_indptr.empty() ? 0 : q_indptr.back(); }
  int64_t new_tokens(int64_t b) const { return q_indptr[b + 1] - q_indptr[b]; }
  bool has_lookahead(int64_t b) const { return !lookahead.empty() && lookahead[b] != 0; }
  // The new rows the sequence keeps.
  int64_t kept_tokens(int64_t b) const { return new_tokens(b) - (has_lookahead(b) ? 1 : 0); }
};

struct LayerInput {
  int layer = 0;
  const at::Tensor* q = nullptr;           // [T, num_qo_heads, head_dim], post-RoPE, model dtype
  const at::Tensor* k = nullptr;           // [T, num_kv_heads, head_dim], post-RoPE
  const at::Tensor* k_pre_rope = nullptr;  // [T, num_kv_heads, head_dim]
  const at::Tensor* v = nullptr;           // [T, num_kv_heads, head_dim]
  const StepBatch* batch = nullptr;
  float sm_scale = 1.0f;
  // [T, dim], model dtype: the residual stream entering the layer (before its attention norm), for
  // methods whose decisions read the hidden state (DMS's eviction adapters). Null where not given.
  const at::Tensor* hidden = nullptr;
  // 0: a global layer. W > 0: a sliding-window layer, whose query at sequence index p sees the keys
  // at p - W + 1 .. p (Gemma 3's local layers, Mistral). A WindowedKvCache serves such layers itself
  // and hands a method's store only the global ones, so a method's store sees 0 here.
  int64_t window = 0;
};

// Bytes a cache holds, by tier and kind (the memory ledger's raw material).
struct Footprint {
  int64_t device_payload_bytes = 0;
  int64_t device_metadata_bytes = 0;  // scales, zero points, masks
  int64_t device_index_bytes = 0;     // block tables, token indices
  int64_t device_reserved_bytes = 0;  // allocated but not holding live tokens (padding, free blocks)
  int64_t host_bytes = 0;
  int64_t remote_bytes = 0;
  int64_t logical_bytes = 0;          // tokens held x uncompressed bytes per token
  int64_t tokens_held = 0;            // summed over sequences (a shared prefix counts per sequence)
  // Of the physical bytes, those held in the model's compute dtype (rows a 16-bit deployment would
  // store at 16 bits: an fp32 CPU run's dense rows), by tier; codes, fp16 rows, scales and indices
  // are fixed-width and not counted. -1: the store does not say (the serve protocol then needs a
  // 16-bit run to size it).
  int64_t model_dtype_device_bytes = -1;
  int64_t model_dtype_host_bytes = 0;
  // Bytes holding live KV state (payload incl. padding of partly filled blocks, metadata, indices).
  int64_t physical_bytes() const {
    return device_payload_bytes + device_metadata_bytes + device_index_bytes + host_bytes +
           remote_bytes;
  }
  // Everything the store has allocated, reserved-but-unused included.
  int64_t allocated_bytes() const { return physical_bytes() + device_reserved_bytes; }
};

// What a store holds for one sequence, layer and KV head, as attention reads it (reconstructed or
// dequantized keys post-RoPE, values, and which cache index each kept token came from). For the probe
// protocol; stores that do not implement probe_view are probed on their attention output only.
struct HeadSnapshot {
  at::Tensor k;      // [n_kept, head_dim], fp32
  at::Tensor v;      // [n_kept, head_dim], fp32
  at::Tensor index;  // [n_kept], int64: the token's index in the sequence (0 = first token)
};

// One part of a spliced sequence (KvCache::splice): a sequence's tokens, its keys moved `shift`
// positions on.
struct SpliceSource {
  int64_t seq_id = 0;
  int64_t shift = 0;
};

// How a document-reuse method (KV Packet) caches a context: split into documents of about
// `doc_tokens` tokens (0: the whole context is one document), each prefilled alone from position 0 as
// [header_ids, header, document, trailer] and the caches spliced (KvCache::splice) behind the BOS at
// query time. header / trailer: soft input rows [rows, dim] in the model's dtype and on its device
// (KV Packet's trained ones); undefined: none. header_ids: tokens before the header (e.g. a BOS per
// document). All empty: plain concatenation of separately prefilled documents.
struct DocumentReuse {
  int64_t doc_tokens = 0;
  std::vector<int64_t> header_ids;
  at::Tensor header;
  at::Tensor trailer;
  // Cache rows a document gets beyond its own tokens.
  int64_t extra_rows() const {
    return static_cast<int64_t>(header_ids.size()) + (header.defined() ? header.size(0) : 0) +
           (trailer.defined() ? trailer.size(0) : 0);
  }
};

class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual std::string name() const = 0;

  // Called once per step before the layers run: make room for the step's new tokens.
  virtual void begin_step(const StepBatch& batch) = 0;
  // Appends the step's k/v for layer `in.layer` and returns attention over everything the method
  // keeps: [T, num_qo_heads, head_dim], model dtype.
  virtual at::Tensor attend(const LayerInput& in) = 0;
  // Called once per step after the last layer.
  virtual void end_step(const StepBatch& batch) {}
  // Called when a sequence's prompt has been fully prefilled (SnapKV-style compression hooks here).
  virtual void end_prefill(int64_t seq_id) {}

  virtual void release(int64_t seq_id) = 0;
  // dst becomes a copy of src (sharing storage where the store can: copy-on-write).
  virtual void fork(int64_t src_id, int64_t dst_id) = 0;
  // Drops the last tokens of a sequence so it holds `new_len` (qa: truncate an answer off again).
  virtual void truncate(int64_t seq_id, int64_t new_len) = 0;
  virtual int64_t seq_len(int64_t seq_id) const = 0;
  virtual Footprint footprint() const = 0;
  // Method-specific figures for the results store (tokens evicted, hit rates, realized ratio...).
  // Two names are shared, for the serve protocol's time model, by stores whose decode steps do not
  // simply read every device byte they hold:
  //   "decode_read_fraction"        device KV bytes a decode step reads / the dense bytes of the
  //                                 tokens it could see (read-time selection: Quest);
  //   "decode_h2d_bytes_per_token"  host-to-device bytes per decoded token, all layers (tiering:
  //                                 SpeCache, TTKV, RetroInfer).
  virtual std::map<std::string, double> counters() const { return {}; }
  // Per KV head, what this store holds for `seq_id` at `layer` (see HeadSnapshot); empty: not supported.
  virtual std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const { return {}; }

  // Speculative lookahead (SpeCache): a store that answers true gets decode steps of [x_t, guess]
  // per sequence, the guess being the engine's prediction of the token after x_t, flagged in
  // StepBatch::lookahead; it attends both rows and keeps only x_t's. Its first decode step after
  // a prompt or fork is preceded by a lookahead-only step [x_t] that makes the first guess.
  virtual bool wants_lookahead() const { return false; }

  // True for a store that applies LayerInput::window (WindowedKvCache). The engine refuses to run
  // a model with window layers on any other store, which would attend to every token.
  virtual bool serves_windows() const { return false; }

  // Document reuse: dst (a new sequence) becomes the concatenation of the sources' tokens in order,
  // each source's keys re-rotated by its shift (harness/kv/rope_shift.h) -- caches prefilled
  // separately, each from position 0, placed one after another without recomputing a token. The
  // sources stay as they are.
  virtual bool supports_splice() const { return false; }
  virtual void splice(int64_t dst_id, const std::vector<SpliceSource>& sources) {
    KVB_FAIL(name(), ": this store cannot splice sequences (document reuse needs a store that can)");
  }
  // Document reuse: how this method caches documents. Null: it does not reuse documents, and the qa
  // protocol prefills the whole context as one sequence (full recomputation).
  virtual const DocumentReuse* document_reuse() const { return nullptr; }
};

}  // namespace kvb
