#pragma once
// An optional capability of a KvCache (found with dynamic_cast): a document-reuse method (KV
// Packet) says how it caches a context. The qa protocol then takes the document route
// (harness/eval/documents.h): documents prefilled alone, spliced (harness/kv/splice.h) behind the
// BOS, only the question prefilled at query time.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "harness/kv/kv_cache.h"

namespace kvb {

// A context split into documents of about `doc_tokens` tokens (0: the whole context is one
// document), each prefilled alone from position 0 as [header_ids, header, document, trailer] and
// the caches spliced behind the BOS at query time. header / trailer: soft input rows [rows, dim] in
// the model's dtype and on its device (KV Packet's trained ones); undefined: none. header_ids:
// tokens before the header (e.g. a BOS per document). All empty: plain concatenation of separately
// prefilled documents.
struct DocumentReuse {
  int64_t doc_tokens = 0;
  std::vector<int64_t> header_ids;
  at::Tensor header;
  at::Tensor trailer;
  // Cache rows a document gets beyond its own tokens.
  int64_t extra_rows() const {
    return static_cast<int64_t>(header_ids.size()) + (header.defined() ? header.size(0) : 0) +
           (trailer.defined() ? trailer.size(0) : 0);
  }
};

class DocumentReuseCache {
 public:
  virtual ~DocumentReuseCache() = default;
  // How the method caches documents; null: it does not (a wrapper whose store does not).
  virtual const DocumentReuse* document_reuse() const = 0;
};

// The store's document reuse, or null: the qa protocol then prefills the whole context as one
// sequence (full recomputation).
inline const DocumentReuse* document_reuse_of(const KvCache& kv) {
  const auto* d = dynamic_cast<const DocumentReuseCache*>(&kv);
  return d ? d->document_reuse() : nullptr;
}

}  // namespace kvb
