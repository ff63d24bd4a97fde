#include "harness/engine/prefill_replay.h"

#include <ATen/ATen.h>

#include <chrono>

#include "harness/common/fast_hash.h"
#include "harness/common/internal_error.h"
#include "harness/engine/engine.h"
#include "harness/kv/lookahead.h"

namespace kvb {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

uint64_t tensor_hash(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  FastHash h;
  h.update_field(c10::toString(c.scalar_type()));
  for (int64_t d : c.sizes()) h.update(&d, sizeof d);
  h.update(c.data_ptr(), c.numel() * c.element_size());
  return h.digest();
}

int64_t tensor_bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// The recorded step as sequence `seq` of a store that holds `past` tokens.
StepBatch renumbered(const StepBatch& recorded, int64_t seq, int64_t past) {
  StepBatch b = recorded;
  b.seq_ids = {seq};
  b.past_lens = {past};
  return b;
}

}  // namespace

int64_t PrefillRecording::bytes() const {
  int64_t n = tensor_bytes(last_logits);
  for (const RecordedStep& s : steps)
    for (const RecordedAttend& a : s.layers)
      n += tensor_bytes(a.q) + tensor_bytes(a.k) + tensor_bytes(a.k_pre_rope) + tensor_bytes(a.v) +
           tensor_bytes(a.hidden);
  return n;
}

void RecordingKvCache::start() { rec_ = std::make_shared<PrefillRecording>(); }

std::shared_ptr<PrefillRecording> RecordingKvCache::finish(at::Tensor last_logits, double total_s) {
  KVB_ASSERT(rec_, "prefill recording", "finish() without start()");
  std::shared_ptr<PrefillRecording> r = std::move(rec_);
  r->last_logits = last_logits.to(at::kCPU).clone();
  r->model_s = std::max(0.0, total_s - r->attend_s - r->record_s);
  return r;
}

void RecordingKvCache::begin_step(const StepBatch& batch) {
  if (rec_) {
    KVB_ASSERT(batch.batch_size() == 1, "prefill recording", "records one sequence at a time");
    rec_->steps.push_back({batch, {}});
    rec_->tokens += batch.num_tokens();
  }
  wrapped().begin_step(batch);
}

void RecordingKvCache::layer_hidden(int, const at::Tensor& hidden) {
  if (!rec_) return;
  const auto t0 = Clock::now();
  hidden_ = hidden.clone();
  rec_->record_s += seconds(t0, Clock::now());
}

at::Tensor RecordingKvCache::attend(const LayerInput& in) {
  if (!rec_) return wrapped().attend(in);
  const auto t0 = Clock::now();
  at::Tensor out = wrapped().attend(in);
  const auto t1 = Clock::now();
  rec_->attend_s += seconds(t0, t1);
  RecordedAttend a;
  a.q = in.q->clone();
  a.k = in.k->clone();
  a.k_pre_rope = in.k_pre_rope->clone();
  a.v = in.v->clone();
  a.hidden = std::move(hidden_);
  a.sm_scale = in.sm_scale;
  a.window = in.window;
  a.out_hash = tensor_hash(out);
  KVB_ASSERT(static_cast<size_t>(in.layer) == rec_->steps.back().layers.size(),
             "prefill recording", "layers out of order");
  rec_->steps.back().layers.push_back(std::move(a));
  rec_->record_s += seconds(t1, Clock::now());
  return out;
}

ReplayResult replay_prefill(Engine& e, const PrefillRecording& rec) {
  ReplayResult r;
  KvCache& kv = e.kv();
  auto* hidden = dynamic_cast<HiddenStateCache*>(&kv);
  const int64_t seq = e.new_sequence();
  for (size_t s = 0; s < rec.steps.size() && r.mismatch.empty(); ++s) {
    const RecordedStep& step = rec.steps[s];
    const int64_t past = kv.seq_len(seq);
    if (past != step.batch.past_lens[0]) {
      r.mismatch = "before chunk " + std::to_string(s) + " the store holds " + std::to_string(past) +
                   " tokens, the full cache " + std::to_string(step.batch.past_lens[0]);
      break;
    }
    const StepBatch batch = renumbered(step.batch, seq, past);
    if (LookaheadCache* la = wanting_lookahead(kv)) la->set_lookahead_rows({});
    kv.begin_step(batch);
    for (size_t l = 0; l < step.layers.size(); ++l) {
      const RecordedAttend& a = step.layers[l];
      LayerInput in;
      in.layer = static_cast<int>(l);
      in.q = &a.q;
      in.k = &a.k;
      in.k_pre_rope = &a.k_pre_rope;
      in.v = &a.v;
      in.batch = &batch;
      in.sm_scale = a.sm_scale;
      in.window = a.window;
      const auto t0 = Clock::now();
      if (hidden) {
        KVB_ASSERT(a.hidden.defined(), "prefill replay", "the recording holds no hidden states");
        hidden->layer_hidden(static_cast<int>(l), a.hidden);
      }
      const at::Tensor out = kv.attend(in);
      r.attend_s += seconds(t0, Clock::now());
      // After a mismatch the step's remaining layers still run, so the store ends the step whole.
      if (r.mismatch.empty() && tensor_hash(out) != a.out_hash)
        r.mismatch = "layer " + std::to_string(l) + " of chunk " + std::to_string(s) +
                     " attends differently from the full cache";
    }
    kv.end_step(batch);
    e.advance_position(seq, batch.num_tokens());
  }
  if (!r.mismatch.empty()) {
    e.release(seq);
    return r;
  }
  r.seq = seq;
  r.logits = rec.last_logits.to(e.model().device);
  return r;
}

}  // namespace kvb
