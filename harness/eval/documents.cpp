#include "harness/eval/documents.h"

#include <ATen/ATen.h>

#include <chrono>
#include <string>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/formats/tokenizer.h"

namespace kvb {

namespace {

// A piece that ends a sentence: its text ends in '.', '!' or '?' (closing quotes after it allowed),
// or it is a newline byte.
bool ends_sentence(std::string p) {
  if (p == "<0x0A>") return true;
  for (;;) {
    if (!p.empty() && (p.back() == '"' || p.back() == '\'')) {
      p.pop_back();
    } else if (p.size() >= 3 && p.compare(p.size() - 3, 3, "\xE2\x80\x9D") == 0) {  // U+201D
      p.resize(p.size() - 3);
    } else {
      break;
    }
  }
  return !p.empty() && (p.back() == '.' || p.back() == '!' || p.back() == '?');
}

}  // namespace

std::vector<std::vector<int64_t>> split_documents(const std::vector<int64_t>& ids,
                                                  int64_t doc_tokens, const Tokenizer& tok) {
  std::vector<std::vector<int64_t>> docs;
  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t start = 0;
  while (start < n) {
    int64_t end = n;
    if (doc_tokens > 0 && n - start > doc_tokens) {
      end = start + doc_tokens;
      for (int64_t i = start + doc_tokens - 1; i >= start + doc_tokens / 2; --i) {
        if (ends_sentence(tok.piece(ids[i]))) {
          end = i + 1;
          break;
        }
      }
    }
    docs.emplace_back(ids.begin() + start, ids.begin() + end);
    start = end;
  }
  return docs;
}

DocumentPrefill prefill_documents(Engine& e, const DocumentReuse& r,
                                  const std::vector<int64_t>& ctx_ids, const Tokenizer& tok) {
  using clock = std::chrono::steady_clock;
  KVB_CHECK(ctx_ids.size() >= 2, "document route: a context needs a BOS and at least one token");
  DocumentPrefill out;
  auto t0 = clock::now();
  std::vector<int64_t> parts = {e.new_sequence()};
  e.prefill({parts[0]}, {{ctx_ids[0]}});  // the BOS: the preamble cache
  const std::vector<int64_t> body(ctx_ids.begin() + 1, ctx_ids.end());
  for (const auto& doc : split_documents(body, r.doc_tokens, tok)) {
    std::vector<at::Tensor> rows;
    if (!r.header_ids.empty()) rows.push_back(e.embed(r.header_ids));
    if (r.header.defined()) rows.push_back(r.header);
    rows.push_back(e.embed(doc));
    if (r.trailer.defined()) rows.push_back(r.trailer);
    const int64_t seq = e.new_sequence();
    e.prefill_embeds(seq, at::cat(rows, 0));
    parts.push_back(seq);
  }
  out.documents = static_cast<int64_t>(parts.size()) - 1;
  auto t1 = clock::now();
  out.document_prefill_s = std::chrono::duration<double>(t1 - t0).count();
  out.seq = e.compose(parts);
  out.splice_s = std::chrono::duration<double>(clock::now() - t1).count();
  for (int64_t p : parts) e.release(p);
  return out;
}

}  // namespace kvb
