#include "harness/engine/engine.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/progress_eta.h"
#include "harness/engine/transformer.h"
#include "harness/kv/lookahead.h"
#include "harness/kv/paged_kv_cache.h"
#include "harness/kv/splice.h"
#include "harness/kv/windowed_kv_cache.h"

namespace kvb {

double ScoreResult::ppl() const { return token_nll.empty() ? 0.0 : std::exp(nll_sum / n()); }

std::unique_ptr<KvCache> make_default_kv(const Model& model, int64_t block_size) {
  PagedKvCache::Options o;
  o.block_size = block_size;
  CacheContext ctx;
  ctx.config = model.config;
  ctx.device = model.device;
  ctx.dtype = model.dtype;
  return make_window_aware(
      ctx,
      [&](const CacheContext& c) {
        return std::make_unique<PagedKvCache>(c.config, c.device, c.dtype, o);
      },
      /*needs_global=*/false, "the paged store");
}

Engine::Engine(std::shared_ptr<Model> model, std::unique_ptr<KvCache> kv, EngineOptions opts)
    : model_(std::move(model)), kv_(std::move(kv)), opts_(opts) {
  KVB_CHECK(opts_.prefill_chunk >= 1, "prefill_chunk must be >= 1 (got ", opts_.prefill_chunk, ")");
}

int64_t Engine::new_sequence() {
  const int64_t id = next_id_++;
  pos_[id] = 0;
  return id;
}

void Engine::release(int64_t seq) {
  kv_->release(seq);
  pos_.erase(seq);
  guess_.erase(seq);
}

int64_t Engine::fork(int64_t src) {
  const int64_t id = next_id_++;
  kv_->fork(src, id);
  pos_[id] = position(src);
  auto g = guess_.find(src);
  if (g != guess_.end()) guess_[id] = g->second;
  return id;
}

int64_t Engine::position(int64_t seq) const {
  auto it = pos_.find(seq);
  KVB_ASSERT(it != pos_.end(), "engine", "unknown sequence ", seq);
  return it->second;
}

at::Tensor Engine::step(const std::vector<int64_t>& seqs,
                        const std::vector<std::vector<int64_t>>& chunks, Phase phase,
                        bool all_logits, const at::Tensor* embeds,
                        const std::vector<uint8_t>* lookahead,
                        const std::vector<int64_t>* call_lengths) {
  StepBatch batch;
  batch.phase = phase;
  if (LookaheadCache* la = wanting_lookahead(*kv_))
    la->set_lookahead_rows(lookahead ? *lookahead : std::vector<uint8_t>{});
  batch.q_indptr.push_back(0);
  std::vector<int64_t> tokens, rows;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const auto& c = chunks[b];
    KVB_CHECK(!c.empty(), "engine: empty chunk for sequence ", seqs[b]);
    int64_t& p = pos_.at(seqs[b]);
    batch.seq_ids.push_back(seqs[b]);
    batch.past_lens.push_back(kv_->seq_len(seqs[b]));
    for (int64_t t : c) {
      KVB_CHECK(t >= 0 && t < model_->config.vocab_size, "token id ", t,
                " is outside the vocabulary [0, ", model_->config.vocab_size, ")");
      tokens.push_back(t);
      batch.positions.push_back(p++);
    }
    if (lookahead && (*lookahead)[b]) --p;  // the lookahead row is not kept
    batch.q_indptr.push_back(static_cast<int64_t>(tokens.size()));
    if (!all_logits) rows.push_back(batch.q_indptr.back() - 1);
  }
  return transformer_forward(*model_, *kv_, tokens, batch, rows, embeds, call_lengths);
}

at::Tensor Engine::prefill_embeds(int64_t seq, const at::Tensor& embeds, bool call_end_prefill) {
  KVB_ASSERT(embeds.dim() == 2 && embeds.size(1) == model_->config.dim && embeds.size(0) > 0,
             "engine", "prefill_embeds needs [n > 0, ", model_->config.dim, "] rows");
  const int64_t n = embeds.size(0);
  guess_.erase(seq);
  const std::vector<int64_t> call_length = {position(seq) + n};
  at::Tensor last;
  if (opts_.prefill_progress) opts_.prefill_progress(0, n);
  for (int64_t done = 0; done < n;) {
    const int64_t c = std::min<int64_t>(opts_.prefill_chunk, n - done);
    // Placeholder ids: only their count matters when embeddings are given.
    std::vector<std::vector<int64_t>> chunk = {std::vector<int64_t>(c, 0)};
    at::Tensor rows = embeds.narrow(0, done, c);
    last = step({seq}, chunk, Phase::kPrefill, false, &rows, nullptr, &call_length);
    done += c;
    if (opts_.prefill_progress) opts_.prefill_progress(done, n);
  }
  if (call_end_prefill) kv_->end_prefill(seq);
  return last;
}

at::Tensor Engine::embed(const std::vector<int64_t>& tokens) const {
  for (int64_t t : tokens)
    KVB_CHECK(t >= 0 && t < model_->config.vocab_size, "token id ", t,
              " is outside the vocabulary [0, ", model_->config.vocab_size, ")");
  at::Tensor ids = at::tensor(tokens, at::kLong).to(model_->device);
  return model_->weights.embedding.index_select(0, ids);
}

int64_t Engine::compose(const std::vector<int64_t>& parts) {
  KVB_CHECK(!parts.empty(), "engine: compose needs at least one part");
  SplicingCache* splicer = splicing(*kv_);
  KVB_CHECK(splicer != nullptr, "engine: store ", kv_->name(),
            " cannot splice sequences (document reuse)");
  std::vector<SpliceSource> src;
  int64_t at = 0;
  for (int64_t p : parts) {
    const int64_t len = position(p);
    KVB_CHECK(kv_->seq_len(p) == len, "engine: compose part ", p, " holds ", kv_->seq_len(p),
              " tokens of ", len, " positions (an evicting store cannot be composed)");
    src.push_back({p, at});
    at += len;
  }
  const int64_t id = next_id_++;
  splicer->splice(id, src);
  pos_[id] = at;
  return id;
}

void Engine::advance_position(int64_t seq, int64_t n) {
  KVB_ASSERT(n >= 0 && pos_.count(seq) == 1, "engine", "advance_position(", seq, ", ", n, ")");
  pos_[seq] += n;
  guess_.erase(seq);
}

at::Tensor Engine::prefill(const std::vector<int64_t>& seqs,
                           const std::vector<std::vector<int64_t>>& tokens,
                           const LogitsCallback& cb, bool call_end_prefill) {
  KVB_ASSERT(seqs.size() == tokens.size() && !seqs.empty(), "engine",
             "prefill needs one token list per sequence");
  const int64_t B = static_cast<int64_t>(seqs.size());
  for (int64_t s : seqs) guess_.erase(s);  // a guess is for the token after the last one
  std::vector<size_t> done(B, 0);
  std::vector<at::Tensor> last(B);
  // The length each sequence reaches in this call: its chunks rotate as one forward over the whole
  // prompt would (LongRoPE's frequency set is chosen per call, not per chunk).
  std::vector<int64_t> end_len(B);
  for (int64_t b = 0; b < B; ++b)
    end_len[b] = position(seqs[b]) + static_cast<int64_t>(tokens[b].size());
  const bool all = static_cast<bool>(cb);
  int64_t fed = 0, total = 0;
  for (const auto& t : tokens) total += static_cast<int64_t>(t.size());
  if (opts_.prefill_progress) opts_.prefill_progress(0, total);
  KVB_ASSERT(!all || B == 1, "engine",
             "per-position logits are supported for one sequence at a time");
  for (;;) {
    std::vector<int64_t> step_seqs, idx, step_len;
    std::vector<std::vector<int64_t>> chunks;
    for (int64_t b = 0; b < B; ++b) {
      if (done[b] >= tokens[b].size()) continue;
      const size_t n = std::min<size_t>(opts_.prefill_chunk, tokens[b].size() - done[b]);
      step_seqs.push_back(seqs[b]);
      idx.push_back(b);
      step_len.push_back(end_len[b]);
      chunks.emplace_back(tokens[b].begin() + done[b], tokens[b].begin() + done[b] + n);
    }
    if (step_seqs.empty()) break;
    at::Tensor logits = step(step_seqs, chunks, Phase::kPrefill, all, nullptr, nullptr, &step_len);
    if (all) {
      cb(logits, static_cast<int64_t>(done[0]));
      last[0] = logits[logits.size(0) - 1];
    }
    for (size_t i = 0; i < idx.size(); ++i) {
      const int64_t b = idx[i];
      done[b] += chunks[i].size();
      if (!all) last[b] = logits[static_cast<int64_t>(i)];
      if (done[b] == tokens[b].size() && call_end_prefill) kv_->end_prefill(seqs[b]);
      fed += static_cast<int64_t>(chunks[i].size());
    }
    if (opts_.prefill_progress) opts_.prefill_progress(fed, total);
  }
  for (int64_t b = 0; b < B; ++b)
    KVB_CHECK(last[b].defined(), "engine: prefill of sequence ", seqs[b], " got no tokens");
  return at::stack(last);
}

at::Tensor Engine::decode(const std::vector<int64_t>& seqs, const std::vector<int64_t>& tokens) {
  if (wanting_lookahead(*kv_)) return decode_with_lookahead(seqs, tokens);
  std::vector<std::vector<int64_t>> chunks;
  for (int64_t t : tokens) chunks.push_back({t});
  return step(seqs, chunks, Phase::kDecode, false);
}

at::Tensor Engine::decode_with_lookahead(const std::vector<int64_t>& seqs,
                                         const std::vector<int64_t>& tokens) {
  KVB_ASSERT(seqs.size() == tokens.size(), "engine", "decode needs one token per sequence");
  // Pre-decoding: a sequence without a guess runs its token alone as a lookahead row (nothing
  // kept); the argmax of its logits is the first guess.
  std::vector<int64_t> fresh, fresh_tokens;
  for (size_t b = 0; b < seqs.size(); ++b)
    if (!guess_.count(seqs[b])) {
      fresh.push_back(seqs[b]);
      fresh_tokens.push_back(tokens[b]);
    }
  if (!fresh.empty()) {
    std::vector<std::vector<int64_t>> chunks;
    for (int64_t t : fresh_tokens) chunks.push_back({t});
    const std::vector<uint8_t> all(fresh.size(), 1);
    at::Tensor first =
        step(fresh, chunks, Phase::kDecode, false, nullptr, &all).argmax(-1).to(at::kCPU);
    for (size_t i = 0; i < fresh.size(); ++i)
      guess_[fresh[i]] = first[static_cast<int64_t>(i)].item<int64_t>();
  }
  std::vector<std::vector<int64_t>> chunks;
  // The length each sequence reaches is its real token's: the guess row is not kept, so on a
  // LongRoPE model the factor set switches at the same step as without a lookahead (the guess row
  // rotates with its sequence's set).
  std::vector<int64_t> lengths;
  for (size_t b = 0; b < seqs.size(); ++b) {
    chunks.push_back({tokens[b], guess_.at(seqs[b])});
    lengths.push_back(position(seqs[b]) + 1);
  }
  const std::vector<uint8_t> all(seqs.size(), 1);
  at::Tensor logits =
      step(seqs, chunks, Phase::kDecode, true, nullptr, &all, &lengths);  // [2B, vocab]
  const int64_t B = static_cast<int64_t>(seqs.size());
  at::Tensor rows = logits.view({B, 2, -1});
  at::Tensor next = rows.select(1, 1).argmax(-1).to(at::kCPU);
  for (int64_t b = 0; b < B; ++b) guess_[seqs[b]] = next[b].item<int64_t>();
  return rows.select(1, 0).contiguous();
}

GenerateResult Engine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                const GenerateOptions& opts) {
  using clock = std::chrono::steady_clock;
  const int64_t B = static_cast<int64_t>(prompts.size());
  GenerateResult r;
  r.tokens.resize(B);
  r.stopped.assign(B, false);
  if (B == 0) return r;
  const std::vector<int64_t> stop = opts.stop_ids.empty() ? model_->config.eos_ids : opts.stop_ids;
  std::vector<int64_t> seqs;
  std::vector<Sampler> samplers;
  for (int64_t b = 0; b < B; ++b) {
    seqs.push_back(new_sequence());
    samplers.emplace_back(opts.sampling, b);
    r.prefill_tokens += static_cast<int64_t>(prompts[b].size());
  }
  const int64_t V = model_->config.vocab_size;
  auto t0 = clock::now();
  at::Tensor logits = prefill(seqs, prompts).contiguous().to(at::kCPU);
  auto t1 = clock::now();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();

  std::vector<int64_t> active(B), next(B);
  for (int64_t b = 0; b < B; ++b) active[b] = b;
  while (!active.empty()) {
    std::vector<int64_t> still, step_seqs, step_tokens;
    const float* lp = logits.data_ptr<float>();
    for (size_t i = 0; i < active.size(); ++i) {
      const int64_t b = active[i];
      const int64_t tok = samplers[b].next(lp + static_cast<int64_t>(i) * V, V);
      if (std::find(stop.begin(), stop.end(), tok) != stop.end()) {
        r.stopped[b] = true;
        continue;
      }
      r.tokens[b].push_back(tok);
      if (static_cast<int64_t>(r.tokens[b].size()) >= opts.max_new_tokens) continue;
      still.push_back(b);
      step_seqs.push_back(seqs[b]);
      step_tokens.push_back(tok);
    }
    active = still;
    if (active.empty()) break;
    logits = decode(step_seqs, step_tokens).contiguous().to(at::kCPU);
    r.decode_steps++;
    r.decode_tokens += static_cast<int64_t>(step_seqs.size());
  }
  r.decode_s = std::chrono::duration<double>(clock::now() - t1).count();
  for (int64_t s : seqs) release(s);
  return r;
}

ScoreResult Engine::score(const std::vector<int64_t>& tokens, int64_t top_k) {
  ScoreResult r;
  r.tokens = tokens;
  KVB_CHECK(tokens.size() >= 2, "score: need at least two tokens (got ", tokens.size(), ")");
  KVB_CHECK(top_k >= 0 && top_k <= model_->config.vocab_size, "score: top-k ", top_k,
            " is outside [0, ", model_->config.vocab_size, "] (the vocabulary)");
  const int64_t seq = new_sequence();
  // Rows 0..n-2 predict tokens 1..n-1; the last row predicts nothing.
  std::vector<int64_t> input(tokens.begin(), tokens.end() - 1);
  prefill({seq}, {input}, [&](const at::Tensor& logits, int64_t first) {
    const int64_t n = logits.size(0);
    at::Tensor lp = at::log_softmax(logits.to(at::kDouble), -1);
    at::Tensor target =
        at::tensor(std::vector<int64_t>(tokens.begin() + first + 1, tokens.begin() + first + 1 + n),
                   at::kLong)
            .to(lp.device());
    at::Tensor nll = -lp.gather(1, target.unsqueeze(1)).squeeze(1).to(at::kCPU);
    for (int64_t i = 0; i < n; ++i) {
      r.token_nll.push_back(nll[i].item<double>());
      r.nll_sum += r.token_nll.back();
    }
    if (top_k > 0) {
      // A stable descending sort, so equal logits come lowest id first on every implementation.
      at::Tensor rows = logits.to(at::kCPU, at::kFloat).contiguous();
      for (int64_t i = 0; i < n; ++i) {
        const float* row = rows.data_ptr<float>() + i * rows.size(1);
        std::vector<int64_t> order(static_cast<size_t>(rows.size(1)));
        std::iota(order.begin(), order.end(), int64_t{0});
        std::partial_sort(
            order.begin(), order.begin() + top_k, order.end(),
            [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        auto& top = r.top_logits.emplace_back();
        for (int64_t k = 0; k < top_k; ++k) top.emplace_back(order[k], row[order[k]]);
      }
    }
  });
  release(seq);
  return r;
}

PrefillProgress prefill_progress_lines(std::function<void(const std::string&)> sink,
                                       double first_after_s, double every_s) {
  if (!sink) return {};
  // One meter per prefill, made when the engine announces it (done = 0).
  auto meter = std::make_shared<std::unique_ptr<ProgressMeter>>();
  return [sink = std::move(sink), meter, first_after_s, every_s](int64_t done, int64_t total) {
    if (done == 0) {
      *meter =
          std::make_unique<ProgressMeter>("prefill", total, "tokens", sink, first_after_s, every_s);
      return;
    }
    if (!*meter) return;
    if (done < total) {
      (*meter)->update(done);
    } else {
      (*meter)->finish(done);
      meter->reset();
    }
  };
}

}  // namespace kvb
