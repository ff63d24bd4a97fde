#pragma once
// The seam between the engine and whatever stores the KV cache. The engine never knows which store
// or method runs: for every layer it hands over the step's q, k (before and after RoPE), v,
// positions and sequence ids, and gets the attention output back. Sequences are identified by int64
// ids that the engine allocates.
//
// KvCache holds the verbs every store needs. What only some methods need is an optional capability
// interface a store also implements, found with dynamic_cast, so adding one never changes this
// layout (and the plugin ABI with it): QuestionAwareCache (question_aware.h), ContextPassCache
// (context_pass.h), LookaheadCache (lookahead.h), HiddenStateCache (hidden_state.h), SplicingCache
// (splice.h), DocumentReuseCache (document_reuse.h) and ProbedCache (probe_view.h). A wrapping
// store (WindowedKvCache, TwinKvCache, kv_packet's) passes on the ones its store has.

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

  int64_t batch_size() const { return static_cast<int64_t>(seq_ids.size()); }
  int64_t num_tokens() const { return q_indptr.empty() ? 0 : q_indptr.back(); }
  int64_t new_tokens(int64_t b) const { return q_indptr[b + 1] - q_indptr[b]; }
};

struct LayerInput {
  int layer = 0;
  const at::Tensor* q = nullptr;           // [T, num_qo_heads, head_dim], post-RoPE, model dtype
  const at::Tensor* k = nullptr;           // [T, num_kv_heads, head_dim], post-RoPE
  const at::Tensor* k_pre_rope = nullptr;  // [T, num_kv_heads, head_dim]
  const at::Tensor* v = nullptr;           // [T, num_kv_heads, head_dim]
  const StepBatch* batch = nullptr;
  float sm_scale = 1.0f;
  // 0: a global layer. W > 0: a sliding-window layer, whose query at sequence index p sees the keys
  // at p - W + 1 .. p (Gemma 3's local layers, Mistral). A WindowedKvCache serves such layers itself
  // and hands a method's store 0 here (all-window models: the layer's W, to a store that slides).
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

  // True for a store that applies LayerInput::window (WindowedKvCache, the codec store). The engine
  // refuses a model with window layers on any other store, which would attend to every token.
  virtual bool serves_windows() const { return false; }
};

}  // namespace kvb
