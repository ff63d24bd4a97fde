#pragma once
// An optional capability of a KvCache (found with dynamic_cast; a store that lacks it is never
// asked): an oracle that compresses the prompt with hindsight of what the run feeds after it
// (oracle_evict: the attention the true continuation pays to each prompt row under the full cache).
// The protocol prefills the prompt without its end-of-prefill compression, hands the store the
// pass below, then calls KvCache::end_prefill. The store runs each continuation on a fork of the
// sequence (an exact copy of its uncompressed cache) and releases the forks, so the pass leaves no
// KV behind. What a protocol hands is fixed by its resolved config (stream: the window;
// qa: the questions and the full cache's answers to them, themselves a function of the config), so
// the run's config hash names the hindsight. No deployable method may use this. Torch-free.

#include <cstdint>
#include <vector>

namespace kvb {

class Engine;

struct HindsightPass {
  Engine* engine = nullptr;
  int64_t seq = 0;  // the sequence holding the whole prompt, not yet compressed
  // What follows the prompt, one entry per continuation the run scores from this prompt, each
  // teacher-forced on its own fork: stream, the window's tokens fed after the prompt; qa
  // (query-agnostic), per question its tokens then the full cache's answer tokens.
  std::vector<std::vector<int64_t>> continuations;
  // Per continuation: how many of its first tokens are the question (stream: 0).
  std::vector<int64_t> question_tokens;
};

class HindsightCache {
 public:
  virtual ~HindsightCache() = default;
  // Runs the store's pass over the continuations of `pass.seq`; returns the tokens it fed.
  virtual int64_t run_hindsight_pass(const HindsightPass& pass) = 0;
};

}  // namespace kvb
