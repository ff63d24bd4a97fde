#pragma once
// The engine: sequences, chunked prefill, batched decode, generation and teacher-forced scoring on top
// of transformer_forward and a KvCache. It owns positions (the KV store may hold fewer tokens than a
// sequence has seen, once methods evict) and hands the store every step.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/engine/sampler.h"
#include "harness/kv/kv_cache.h"
#include "harness/model/model.h"

namespace kvb {

// Told how far a prefill has got: tokens fed so far and the prefill's total, all sequences
// together; called with done = 0 before the first chunk and after every chunk.
using PrefillProgress = std::function<void(int64_t done_tokens, int64_t total_tokens)>;

struct EngineOptions {
  int64_t prefill_chunk = 512;  // tokens per sequence per prefill step
  PrefillProgress prefill_progress;  // empty: none
};

// A PrefillProgress that gives every prefill its own ProgressMeter printing to `sink`
// ("prefill 8192/32768 tokens (25%), 31s elapsed, ETA 1m33s"): silent for prefills that end within
// `first_after_s`, then a line every `every_s`. Empty sink: an empty PrefillProgress.
PrefillProgress prefill_progress_lines(std::function<void(const std::string&)> sink,
                                       double first_after_s = 2.0, double every_s = 10.0);

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  std::vector<int64_t> stop_ids;  // empty: the model's EOS ids
};

struct GenerateResult {
  std::vector<std::vector<int64_t>> tokens;  // new tokens per prompt (stop token not included)
  std::vector<bool> stopped;                 // ended on a stop token (else on max_new_tokens)
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0, decode_steps = 0;
};

struct ScoreResult {
  std::vector<int64_t> tokens;
  std::vector<double> token_nll;  // [tokens.size() - 1]: -log p(tokens[i+1] | tokens[..i])
  double nll_sum = 0;
  // With score(tokens, top_k > 0): each scored row's top_k logits, highest first (ties: lower id
  // first), [tokens.size() - 1][top_k]; for comparing logits with another implementation.
  std::vector<std::vector<std::pair<int64_t, float>>> top_logits;
  int64_t n() const { return static_cast<int64_t>(token_nll.size()); }
  double ppl() const;
};

// Receives logits of consecutive positions: [n, vocab] fp32, rows first_index .. first_index + n - 1.
using LogitsCallback = std::function<void(const at::Tensor& logits, int64_t first_index)>;

class Engine {
 public:
  Engine(std::shared_ptr<Model> model, std::unique_ptr<KvCache> kv, EngineOptions opts = {});

  Model& model() { return *model_; }
  KvCache& kv() { return *kv_; }
  const EngineOptions& options() const { return opts_; }

  int64_t new_sequence();
  void release(int64_t seq);
  int64_t fork(int64_t src);  // returns the new sequence's id
  int64_t position(int64_t seq) const;  // next RoPE position
  // Positions a prefill fed to the store without the model took (replay_prefill, prefill_replay.h).
  void advance_position(int64_t seq, int64_t n);

  // Feeds `tokens` to each sequence (chunked, all sequences together). Returns the last token's
  // logits per sequence: [batch, vocab] fp32. With `all_logits`, every position's logits go to cb.
  at::Tensor prefill(const std::vector<int64_t>& seqs,
                     const std::vector<std::vector<int64_t>>& tokens,
                     const LogitsCallback& cb = nullptr, bool call_end_prefill = true);
  // Feeds rows of input embeddings [n, dim] to one sequence (chunked like prefill): soft tokens such
  // as KV Packet's header and trailer around a document's token embeddings. Returns the last row's
  // logits [1, vocab] fp32.
  at::Tensor prefill_embeds(int64_t seq, const at::Tensor& embeds, bool call_end_prefill = true);
  // The input embeddings of tokens: [n, dim], model dtype and device.
  at::Tensor embed(const std::vector<int64_t>& tokens) const;
  // Document reuse: a new sequence holding the parts' caches one after another (each part's keys
  // re-rotated to its place, SplicingCache::splice); its next position is the sum of the parts'.
  // The parts are left as they are. Every part must have started at position 0.
  int64_t compose(const std::vector<int64_t>& parts);

  // One token per sequence: [batch, vocab] fp32. With a store that wants lookahead rows (SpeCache's
  // speculative token) each sequence's step is [token, guess], the guess being the greedy argmax
  // of the previous step's lookahead row (the first one from a lookahead-only step over the token).
  at::Tensor decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens);

  GenerateResult generate(const std::vector<std::vector<int64_t>>& prompts,
                          const GenerateOptions& opts);
  ScoreResult score(const std::vector<int64_t>& tokens, int64_t top_k = 0);

 private:
  // call_lengths: [seqs], the length each sequence reaches in the call (prefill) this step is a
  // chunk of; null for a step that is the whole call (decode). See transformer_forward.
  at::Tensor step(const std::vector<int64_t>& seqs, const std::vector<std::vector<int64_t>>& chunks,
                  Phase phase, bool all_logits, const at::Tensor* embeds = nullptr,
                  const std::vector<uint8_t>* lookahead = nullptr,
                  const std::vector<int64_t>* call_lengths = nullptr);
  at::Tensor decode_with_lookahead(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens);

  std::shared_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
  EngineOptions opts_;
  int64_t next_id_ = 0;
  std::unordered_map<int64_t, int64_t> pos_;  // seq -> next position
  std::unordered_map<int64_t, int64_t> guess_;  // seq -> guessed next token (lookahead stores)
};

// The engine's default store: the paged cache at the model's dtype and device.
std::unique_ptr<KvCache> make_default_kv(const Model& model, int64_t block_size = 16);

}  // namespace kvb
