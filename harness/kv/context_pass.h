#pragma once
// An optional capability of a KvCache (found with dynamic_cast; a store that lacks it is never
// asked): a method that scores a context by running the model once more over it before any
// question is known (KVzip: the model is asked to repeat the context, and each cached entry is
// scored by the attention it receives while the context is reconstructed). The protocol prefills
// the context without its end-of-prefill compression, hands the store the pass below, then calls
// KvCache::end_prefill. The pass runs on forks of the sequence and releases them, so it leaves no
// KV behind; its tokens are prefill work the run pays for, and the protocol counts and times them
// with the context's prefill. Torch-free.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvb {

class Engine;

struct ContextPass {
  Engine* engine = nullptr;
  int64_t seq = 0;                 // the sequence holding the whole context, not yet compressed
  std::vector<int64_t> context;    // every token of it: [prefix] text
  int64_t prefix_tokens = 0;       // tokens before the text (BOS, the chat template's opener)
  std::vector<int64_t> turn_close; // what ends a user turn before the model answers (chat closer
                                   // and assistant opener; "\n" encoded without a chat template)
  std::function<std::vector<int64_t>(const std::string&)> encode;  // text -> ids, no specials
};

class ContextPassCache {
 public:
  virtual ~ContextPassCache() = default;
  // Runs the method's pass over the context of `pass.seq`; returns the tokens it prefilled.
  virtual int64_t run_context_pass(const ContextPass& pass) = 0;
};

}  // namespace kvb
