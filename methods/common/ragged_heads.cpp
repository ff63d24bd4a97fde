#include "methods/common/ragged_heads.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "harness/common/internal_error.h"

namespace kvb {

namespace {
int64_t round_up(int64_t x, int64_t g) { return (x + g - 1) / g * g; }
}  // namespace

RaggedHead::RaggedHead(const RaggedHead& o)
    : kv(o.kv.defined() ? o.kv.clone() : at::Tensor()),
      ks(o.ks),
      vs(o.vs),
      pk(o.pk),
      pv(o.pv),
      pend(o.pend),
      len(o.len),
      cap(o.cap),
      evicted(o.evicted),
      idx(o.idx),
      acc(o.acc) {}

RaggedHead& RaggedHead::operator=(const RaggedHead& o) {
  if (this != &o) *this = RaggedHead(o);
  return *this;
}

void RaggedHeads::reallocate(RaggedHead& h, int64_t cap) {
  if (!l_.codec) reallocate_kv(h, cap);
  // Fresh vectors so that the capacity really is `cap` (shrinking frees). With a codec the rows
  // live in the streams and the pending buffers: only the per-entry arrays have a capacity.
  std::vector<int32_t> idx(static_cast<size_t>(cap), 0);
  std::copy(h.idx.begin(), h.idx.begin() + h.len, idx.begin());
  h.idx.swap(idx);
  if (l_.scores) {
    std::vector<float> acc(static_cast<size_t>(cap), 0.f);
    std::copy(h.acc.begin(), h.acc.begin() + h.len, acc.begin());
    h.acc.swap(acc);
  }
  h.cap = cap;
  reallocations_++;
}

void RaggedHeads::reallocate_kv(RaggedHead& h, int64_t cap) {
  const int64_t D = l_.head_dim;
  at::Tensor fresh = at::empty({2, cap, D}, at::TensorOptions().dtype(l_.dtype).device(l_.device));
  if (h.len > 0) {
    if (l_.fast) {
      const float* src = h.kv.data_ptr<float>();
      float* dst = fresh.data_ptr<float>();
      std::memcpy(dst, src, sizeof(float) * h.len * D);
      std::memcpy(dst + cap * D, src + h.cap * D, sizeof(float) * h.len * D);
    } else {
      fresh.narrow(1, 0, h.len).copy_(h.kv.narrow(1, 0, h.len));
    }
  }
  h.kv = fresh;
}

void RaggedHeads::reserve(RaggedHead& h, int64_t need) {
  if (need <= h.cap) return;
  // A head that has evicted before stays near its budget: grow by a granule past the need. A head
  // that never evicted (a long prompt, a keep-everything budget) grows geometrically.
  reallocate(h, h.evicted ? round_up(need, l_.granule) + l_.granule
                          : round_up(std::max(need, h.cap + h.cap / 2), l_.granule));
}

void RaggedHeads::fit(RaggedHead& h, int64_t entries) {
  reallocate(h, round_up(entries + 1, l_.granule));
}

void RaggedHeads::compact(RaggedHead& h, const std::vector<int64_t>& keep) {
  const int64_t k = static_cast<int64_t>(keep.size()), D = l_.head_dim;
  int64_t prev = -1;
  for (int64_t s : keep) {
    KVB_ASSERT(s > prev && s < h.len, l_.store, "slot ", s, " kept out of order or outside 0..",
               h.len - 1);
    prev = s;
  }
  if (l_.codec) {
    keep_codec_rows(h.ks, h.vs, h.pk, h.pv, &h.pend, h.len, D, keep);
    h.pk.shrink_to_fit();
    h.pv.shrink_to_fit();
  } else if (l_.fast) {
    float* K = h.kv.data_ptr<float>();
    float* V = K + h.cap * D;
    for (int64_t r = 0; r < k; ++r) {
      const int64_t s = keep[r];
      if (s == r) continue;  // keep is ascending, so s > r: forward copies never clobber
      std::memcpy(K + r * D, K + s * D, sizeof(float) * D);
      std::memcpy(V + r * D, V + s * D, sizeof(float) * D);
    }
  } else if (k > 0) {
    at::Tensor index = at::tensor(keep, at::kLong).to(l_.device);
    at::Tensor sel = h.kv.narrow(1, 0, h.len).index_select(1, index);
    h.kv.narrow(1, 0, k).copy_(sel);
  }
  for (int64_t r = 0; r < k; ++r) {
    h.idx[r] = h.idx[keep[r]];
    if (l_.scores) h.acc[r] = h.acc[keep[r]];
  }
  if (k < h.len) h.evicted = true;
  h.len = k;
  const int64_t target = round_up(k + 1, l_.granule);
  if (h.cap > target + l_.granule) reallocate(h, target);
}

void RaggedHeads::cut(RaggedHead& h, int64_t new_len) {
  const int64_t keep =
      std::lower_bound(h.idx.begin(), h.idx.begin() + h.len, static_cast<int32_t>(new_len)) -
      h.idx.begin();
  std::vector<int64_t> slots(static_cast<size_t>(keep));
  for (int64_t j = 0; j < keep; ++j) slots[j] = j;
  compact(h, slots);
}

void RaggedHeads::make_streams(RaggedHead& h, int layer) const {
  if (h.ks.p) return;
  h.ks.p = l_.codec->make_stream(KvKind::kKey, layer, l_.head_dim, l_.head_dim);
  h.vs.p = l_.codec->make_stream(KvKind::kValue, layer, l_.head_dim, l_.head_dim);
}

void RaggedHeads::flush(RaggedHead& h) const {
  if (!l_.codec || h.pend == 0) return;
  h.ks.p->append(h.pk.data(), h.pend);
  h.vs.p->append(h.pv.data(), h.pend);
  h.pend = 0;
  std::vector<float>().swap(h.pk);
  std::vector<float>().swap(h.pv);
}

void RaggedHeads::rows_f32(const RaggedHead& h, const float** K, const float** V,
                           std::vector<float>* kbuf, std::vector<float>* vbuf) const {
  const int64_t D = l_.head_dim;
  if (!l_.codec) {
    *K = h.kv.data_ptr<float>();
    *V = *K + h.cap * D;  // kv is [2, cap, D]
    return;
  }
  *K = keys_f32(h, kbuf);
  vbuf->resize(kbuf->size());
  const int64_t S = h.len - h.pend;
  if (S > 0) h.vs.p->decode(vbuf->data());
  std::copy(h.pv.begin(), h.pv.begin() + h.pend * D, vbuf->begin() + S * D);
  *V = vbuf->data();
}

const float* RaggedHeads::keys_f32(const RaggedHead& h, std::vector<float>* buf) const {
  if (!l_.codec) return h.kv.data_ptr<float>();
  const int64_t D = l_.head_dim;
  buf->resize(static_cast<size_t>(std::max<int64_t>(1, h.len) * D));
  const int64_t S = h.len - h.pend;
  if (S > 0) h.ks.p->decode(buf->data());
  std::copy(h.pk.begin(), h.pk.begin() + h.pend * D, buf->begin() + S * D);
  return buf->data();
}

at::Tensor RaggedHeads::rows(const RaggedHead& h, int which) const {
  if (!l_.codec) return h.kv.select(0, which).narrow(0, 0, h.len).clone();
  const int64_t D = l_.head_dim;
  at::Tensor out = at::empty({h.len, D}, at::kFloat);
  const int64_t S = h.len - h.pend;
  if (S > 0) (which == 0 ? h.ks : h.vs).p->decode(out.data_ptr<float>());
  const auto& pend = which == 0 ? h.pk : h.pv;
  std::copy(pend.begin(), pend.begin() + h.pend * D, out.data_ptr<float>() + S * D);
  return out;
}

void RaggedHeads::add_bytes(const RaggedHead& h, RaggedBytes* sum) const {
  const int64_t D = l_.head_dim;
  const int64_t entry_bytes = 2 * D * static_cast<int64_t>(c10::elementSize(l_.dtype));
  const int64_t per_entry_arrays = 4 + (l_.scores ? 4 : 0);  // idx (+ acc)
  RaggedBytes& b = *sum;
  if (l_.codec) {
    // The codec's exact bytes: codes + full-precision rows are payload, scales and minimums
    // metadata, live masks index; pending rows are fp32 payload; the entry arrays' slack is
    // reserved.
    CodecBytes cb;
    if (h.ks.p) {
      cb += h.ks.p->bytes();
      cb += h.vs.p->bytes();
    }
    b.payload += cb.payload_bytes() + 2 * h.pend * D * 4;
    b.model_dtype += 2 * h.pend * D * 4;
    b.metadata += cb.metadata_bytes;
    b.index += cb.index_bytes;
    b.reserved += cb.reserved_bytes + (h.cap - h.len) * per_entry_arrays;
  } else {
    b.payload += h.len * entry_bytes;
    b.model_dtype += h.len * entry_bytes;
    b.reserved += (h.cap - h.len) * (entry_bytes + per_entry_arrays);
  }
  b.index += h.len * 4;
  if (l_.scores) b.metadata += h.len * 4;
  b.entries += h.len;
}

void RaggedHeads::add_codec_bytes(const RaggedHead& h, CodecBytes* k, CodecBytes* v) const {
  if (!h.ks.p) return;
  *k += h.ks.p->bytes();
  *v += h.vs.p->bytes();
  CodecBytes pend;  // pending rows, fp32
  pend.full_bytes = h.pend * l_.head_dim * 4;
  pend.full_elems = h.pend * l_.head_dim;
  *k += pend;
  *v += pend;
}

}  // namespace kvb
