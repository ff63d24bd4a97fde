#pragma once
// Cutting a context into documents, for document-reuse methods (KV Packet) and their training: the
// qa protocol and `kvbench packet-train` must cut the same context the same way.

#include <cstdint>
#include <vector>

#include "harness/kv/document_reuse.h"
#include "harness/kv/kv_cache.h"

namespace kvb {

class Engine;
class Tokenizer;

// Cuts `ids` into documents of about `doc_tokens` tokens (0: one document). Each cut goes after the
// last sentence end (a piece ending in '.', '!' or '?' before any closing quotes, or a newline byte)
// in the second half of the span, else
// at doc_tokens exactly: documents end where text does, as real ones would. Concatenated, the
// documents are `ids` again.
std::vector<std::vector<int64_t>> split_documents(const std::vector<int64_t>& ids,
                                                  int64_t doc_tokens, const Tokenizer& tok);

}  // namespace kvb

namespace kvb {

struct DocumentPrefill {
  int64_t seq = 0;        // the spliced context sequence
  int64_t documents = 0;
  double document_prefill_s = 0;  // the BOS and every document prefilled alone (offline work)
  double splice_s = 0;            // placing them one after another (query-time work)
};

// The document route of KV Packet and its baselines: ctx_ids[0] (the BOS) prefilled alone, the rest
// cut by split_documents(r.doc_tokens) and each document prefilled alone from position 0 as
// [r.header_ids, r.header, document, r.trailer], then everything spliced (Engine::compose) into one
// new sequence; the parts are released. The engine's store must support splice.
DocumentPrefill prefill_documents(Engine& e, const DocumentReuse& r,
                                  const std::vector<int64_t>& ctx_ids, const Tokenizer& tok);

}  // namespace kvb
