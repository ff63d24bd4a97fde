#pragma once
// Ragged heads: stores in which every (sequence, layer, KV head) keeps its own set of entries,
// never expanded to the query heads, and in which evicting really frees memory (the eviction store
// and KVReviver's exact region). RaggedHead is one head's kept entries; RaggedHeads is the rules
// all of a store's heads follow: how a buffer grows and shrinks, how kept rows are stored (the
// model dtype, or a codec), how an eviction compacts them, and what they cost in the ledger.
//
// Storage of one head:
//   kv:  [2, cap, head_dim] (model dtype, model device): [0] keys, [1] values; or, with a codec,
//        one CodecStream per head for K and one for V (width head_dim) followed by `pend` pending
//        fp32 rows (rows the store holds exact until it decides what to keep, so that an evicted
//        row is never encoded: evict, then quantize what is kept)
//   idx: [cap] int32, the token index (position in the sequence) of each kept entry
//   acc: [cap] fp32, accumulated attention (only for stores that keep scores)
// Entries 0..len-1 are live, in ascending token order.
//
// Growth: a head that never evicted grows by 1.5x (rounded to the granule: keep-everything
// sequences append in amortised O(1)); a head that has evicted grows to round_up(need, granule) +
// granule, so it stays near its budget between compressions (slack is reported as reserved). After
// a compaction, a capacity above round_up(len + 1, granule) + granule is reallocated to
// round_up(len + 1, granule).

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "methods/common/kv_codec.h"

namespace kvb {

struct RaggedHead {
  at::Tensor kv;  // [2, cap, head_dim]; undefined with a codec
  StreamBox ks, vs;
  std::vector<float> pk, pv;  // [pend, head_dim] each: pending fp32 rows (codec)
  int64_t pend = 0;
  int64_t len = 0, cap = 0;
  bool evicted = false;      // has lost entries: grows linearly from then on
  std::vector<int32_t> idx;  // [cap]
  std::vector<float> acc;    // [cap] or empty

  RaggedHead() = default;
  // A copy is deep (a fork): the buffer is cloned, the codec streams are (StreamBox).
  RaggedHead(const RaggedHead& o);
  RaggedHead& operator=(const RaggedHead& o);
  RaggedHead(RaggedHead&&) = default;
  RaggedHead& operator=(RaggedHead&&) = default;

  std::vector<int32_t> kept_indices() const {
    return std::vector<int32_t>(idx.begin(), idx.begin() + len);
  }
};

// What one head holds, for the ledger: payload (live K/V rows, codes and pending rows), metadata
// (accumulated scores, codec scales and minimums), index (token indices, codec live masks),
// reserved (capacity slack of the rows and the per-entry arrays, codec growth room), and of the
// physical bytes those in the model's dtype (plain rows, pending fp32 rows).
struct RaggedBytes {
  int64_t payload = 0, metadata = 0, index = 0, reserved = 0, model_dtype = 0;
  int64_t entries = 0;  // the kept entries these bytes hold
};

class RaggedHeads {
 public:
  struct Layout {
    std::string store;  // names the store in internal errors
    int64_t head_dim = 0;
    c10::ScalarType dtype = c10::kFloat;
    c10::Device device = c10::Device(c10::kCPU);
    bool fast = true;                      // CPU fp32: raw-pointer copies
    int64_t granule = 16;                  // capacity rounding, entries
    bool scores = false;                   // keep acc
    std::shared_ptr<const KvCodec> codec;  // null: rows in kv (model dtype)
  };
  explicit RaggedHeads(Layout layout) : l_(std::move(layout)) {}

  const Layout& layout() const { return l_; }
  const KvCodec* codec() const { return l_.codec.get(); }

  // Room for `need` entries.
  void reserve(RaggedHead& h, int64_t need);
  void reallocate(RaggedHead& h, int64_t cap);
  // A buffer for `entries` entries and one more, as a compaction leaves it (an empty head).
  void fit(RaggedHead& h, int64_t entries);
  // Keeps the entries at the ascending slots `keep` (checked), in order, and shrinks the buffer.
  void compact(RaggedHead& h, const std::vector<int64_t>& keep);
  // Keeps the entries whose token index is below new_len (a truncation).
  void cut(RaggedHead& h, int64_t new_len);
  // Makes the head's codec streams (for `layer`) if it has none yet.
  void make_streams(RaggedHead& h, int layer) const;
  // The pending rows go to the codec streams.
  void flush(RaggedHead& h) const;

  // The kept keys and values, [len, head_dim] fp32 each (CPU fp32 path): the buffer itself, or the
  // streams decoded into kbuf / vbuf followed by the pending rows.
  void rows_f32(const RaggedHead& h, const float** K, const float** V, std::vector<float>* kbuf,
                std::vector<float>* vbuf) const;
  // The kept keys alone, the same way.
  const float* keys_f32(const RaggedHead& h, std::vector<float>* buf) const;
  // Keys (which = 0) or values (1) as a [len, head_dim] tensor (a copy; fp32 with a codec).
  at::Tensor rows(const RaggedHead& h, int which) const;

  // Adds what head h holds to *sum.
  void add_bytes(const RaggedHead& h, RaggedBytes* sum) const;
  // Summed over a sequence's heads, [layer][KV head] (any head type derived from RaggedHead).
  template <typename Head>
  RaggedBytes bytes(const std::vector<std::vector<Head>>& heads) const {
    RaggedBytes sum;
    for (const auto& layer : heads)
      for (const auto& h : layer) add_bytes(h, &sum);
    return sum;
  }
  // Codec bytes of the head's keys and values, its pending rows counted as fp32 full-precision
  // rows.
  void add_codec_bytes(const RaggedHead& h, CodecBytes* k, CodecBytes* v) const;

  int64_t reallocations() const { return reallocations_; }

 private:
  void reallocate_kv(RaggedHead& h, int64_t cap);

  Layout l_;
  int64_t reallocations_ = 0;
};

}  // namespace kvb
