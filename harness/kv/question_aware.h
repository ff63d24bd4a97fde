#pragma once
// An optional capability of a KvCache (found with dynamic_cast; a store that lacks it is never
// told): where the question starts in a prompt that holds both a context and its question (the qa
// protocol's query_aware mode). A query-aware method that scores the context by the question's
// own queries (Finch) needs the split, which the token ids alone do not give; kvpress marks it with
// a delimiter token that the model never sees. Torch-free.

#include <cstdint>

namespace kvb {

class QuestionAwareCache {
 public:
  virtual ~QuestionAwareCache() = default;
  // The next prefill of `seq_id` (a fresh sequence) ends with a question of `question_tokens`
  // tokens after the context.
  virtual void set_question_tokens(int64_t seq_id, int64_t question_tokens) = 0;
};

}  // namespace kvb
