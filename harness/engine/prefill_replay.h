#pragma once
// One context prefill for many stores. The model runs a context once on the full cache, and a
// PrefillRecording keeps what every layer's attend was given at every chunk (q, k before and after
// RoPE, v, the step's batch) and a hash of the attention it returned. replay_prefill hands another
// store exactly those calls without running the model. When every attention output the store
// returns is bitwise the full cache's, each layer's next input in the store's own prefill would
// have been the recorded one (induction over layers and chunks), so the store ends in the state
// its own prefill would have left it in. Whether a store reproduces the prefill is therefore
// checked on every call, never declared: a store that differs anywhere (it evicts or quantizes
// during the prefill, attends differently) is reported, and the caller prefills it itself.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness/kv/forwarding_kv_cache.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/kv_cache.h"

namespace kvb {

class Engine;

// One layer's attend call of a recorded step.
struct RecordedAttend {
  at::Tensor q, k, k_pre_rope, v;  // as LayerInput's, owned copies
  at::Tensor hidden;               // [T, dim]: the residual stream entering the layer
  float sm_scale = 1.0f;
  int64_t window = 0;
  uint64_t out_hash = 0;  // FastHash of the attention output's bytes, [T, num_qo_heads, head_dim]
};

struct RecordedStep {
  StepBatch batch;  // one sequence: its id as recorded (replay substitutes its own)
  std::vector<RecordedAttend> layers;
};

struct PrefillRecording {
  std::vector<RecordedStep> steps;
  at::Tensor last_logits;  // [1, vocab] fp32: what the prefill returned
  int64_t tokens = 0;
  double model_s = 0;   // the prefill's wall time outside the store's attend calls and the recording
  double attend_s = 0;  // inside the full cache's attend calls
  double record_s = 0;  // spent recording (copies, hashes): not the prefill's own work
  int64_t bytes() const;
};

// Wraps the store of an engine that prefills one sequence: between start() and finish() it records
// every step's attend calls and the hidden states the forward hands over before them (and passes
// the calls on); otherwise it only passes the calls on. Meant for the full cache: it forwards the
// KvCache verbs and no optional capability.
class RecordingKvCache : public ForwardingKvCache, public HiddenStateCache {
 public:
  using ForwardingKvCache::ForwardingKvCache;
  void start();
  // The recording of the steps since start(); `last_logits` and `total_s` (the prefill's wall
  // time) come from the caller.
  std::shared_ptr<PrefillRecording> finish(at::Tensor last_logits, double total_s);

  void begin_step(const StepBatch& batch) override;
  at::Tensor attend(const LayerInput& in) override;
  void layer_hidden(int layer, const at::Tensor& hidden) override;

 private:
  std::shared_ptr<PrefillRecording> rec_;  // null: not recording
  at::Tensor hidden_;                      // the current layer's, until its attend
};

struct ReplayResult {
  int64_t seq = -1;        // the new sequence holding the context (-1 when it did not replay)
  at::Tensor logits;       // [1, vocab] fp32, the prefill's last row
  std::string mismatch;    // why the store's prefill is not the recorded one ("" when it is)
  double attend_s = 0;     // time in the store's attend calls
};

// Feeds `rec` to e's store as the prefill of a new sequence (without end_prefill: the caller
// compresses where its own prefill would). On a mismatch the sequence is released and `mismatch`
// names the first differing call; the store may keep traces of the attempt (counters), so a caller
// that goes on prefilling builds a fresh one. A store that reads the hidden states
// (HiddenStateCache) gets the recorded ones before each layer's attend, as from the forward.
ReplayResult replay_prefill(Engine& e, const PrefillRecording& rec);

}  // namespace kvb
