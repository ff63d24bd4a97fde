#pragma once
// An optional capability of a KvCache (found with dynamic_cast): splicing sequences for document
// reuse. dst (a new sequence) becomes the concatenation of the sources' tokens in order, each
// source's keys re-rotated by its shift (harness/kv/rope_shift.h) -- caches prefilled separately,
// each from position 0, placed one after another without recomputing a token. The sources stay as
// they are.

#include <cstdint>
#include <vector>

#include "harness/kv/kv_cache.h"

namespace kvb {

// One part of a spliced sequence: a sequence's tokens, its keys moved `shift` positions on.
struct SpliceSource {
  int64_t seq_id = 0;
  int64_t shift = 0;
};

class SplicingCache {
 public:
  virtual ~SplicingCache() = default;
  virtual void splice(int64_t dst_id, const std::vector<SpliceSource>& sources) = 0;
  // A store that inherits the capability may decline it (state of its own that could not follow
  // the sources' tokens).
  virtual bool can_splice() const { return true; }
};

// The store's splicing capability, or null when it has none or declines it.
inline SplicingCache* splicing(KvCache& kv) {
  auto* s = dynamic_cast<SplicingCache*>(&kv);
  return s && s->can_splice() ? s : nullptr;
}
inline const SplicingCache* splicing(const KvCache& kv) {
  const auto* s = dynamic_cast<const SplicingCache*>(&kv);
  return s && s->can_splice() ? s : nullptr;
}

}  // namespace kvb
