#include "harness/formats/bpe_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "harness/common/error.h"
#include "harness/formats/pre_tokenizer.h"
#include "harness/formats/unicode_text.h"

namespace kvb {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// `tokenizers`' \w test for single_word tokens: alphanumeric or '_'.
bool is_word_char(uint32_t c) { return c == '_' || uni_is_alnum(c); }

uint32_t last_cp(const std::string& s, size_t end) {  // the code point ending at s[end-1]
  size_t b = end - 1;
  while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  utf8_decode(s.substr(b, end - b), &cps, &off);
  return cps.empty() ? 0 : cps[0];
}
uint32_t first_cp(const std::string& s, size_t begin) {
  const size_t len = utf8_valid_len(s, begin);
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  utf8_decode(s.substr(begin, len), &cps, &off);
  return cps.empty() ? 0 : cps[0];
}

// A byte token's value: "<0xXX>" with two hex digits (either case, as tokenizers' ByteFallback
// decoder parses them); -1 otherwise.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

const char* const kMetaspace = "\xE2\x96\x81";

}  // namespace

BpeTokenizer::BpeTokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {
  const std::string& src = spec_.source;
  // Errors name the field as the source file spells it.
  const bool gguf = spec_.format == "gguf";
  const char* const vocab_key = gguf ? "tokenizer.ggml.tokens" : "model.vocab";
  const char* const merges_key = gguf ? "tokenizer.ggml.merges" : "model.merges";
  const char* const added_key = gguf ? "tokenizer.ggml.token_type" : "added_tokens";
  const int64_t n_model = static_cast<int64_t>(spec_.tokens.size());
  KVB_CHECK(n_model > 0, src, ": ", vocab_key, " is empty");
  KVB_CHECK(n_model <= kMaxTokenizerVocab, src, ": ", vocab_key, " has ", n_model,
            " tokens, more than the ", kMaxTokenizerVocab, " any real tokenizer has");
  int64_t n = n_model;
  for (const AddedToken& a : spec_.added) {
    KVB_CHECK(a.id >= 0 && a.id < kMaxTokenizerVocab, src, ": ", added_key, ": id ", a.id, " of '",
              a.content, "' is outside [0, ", kMaxTokenizerVocab, ")");
    KVB_CHECK(!a.content.empty(), src, ": ", added_key, ": token ", a.id, " has empty content");
    KVB_CHECK(static_cast<int64_t>(a.content.size()) <= kMaxTokenBytes, src, ": ", added_key,
              ": token ", a.id, " is longer than ", kMaxTokenBytes, " bytes");
    n = std::max(n, a.id + 1);
  }
  tokens_.assign(static_cast<size_t>(n), std::string());
  std::vector<uint8_t> filled(static_cast<size_t>(n), 0);
  vocab_.reserve(static_cast<size_t>(n_model));
  for (int64_t id = 0; id < n_model; ++id) {
    const std::string& t = spec_.tokens[static_cast<size_t>(id)];
    KVB_CHECK(static_cast<int64_t>(t.size()) <= kMaxTokenBytes, src, ": ", vocab_key, ": token ",
              id, " is longer than ", kMaxTokenBytes, " bytes");
    KVB_CHECK(vocab_.emplace(t, static_cast<int32_t>(id)).second, src, ": ", vocab_key,
              ": duplicate token '", t, "' (ids ", vocab_[t], " and ", id, ")");
    tokens_[static_cast<size_t>(id)] = t;
    filled[static_cast<size_t>(id)] = 1;
  }
  special_.assign(static_cast<size_t>(n), 0);
  for (const AddedToken& a : spec_.added) {
    const size_t id = static_cast<size_t>(a.id);
    if (filled[id]) {
      KVB_CHECK(tokens_[id] == a.content, src, ": ", added_key, ": id ", a.id, " is '", a.content,
                "' but ", vocab_key, " has '", tokens_[id], "' there");
    }
    tokens_[id] = a.content;
    filled[id] = 1;
    special_[id] = a.special ? 1 : 0;
  }
  for (size_t id = 0; id < filled.size(); ++id)
    KVB_CHECK(filled[id], src, ": token id ", id,
              " has no token (neither model.vocab nor added_tokens)");
  for (size_t id = 0; id < tokens_.size(); ++id) {
    auto ins = piece_ids_.emplace(tokens_[id], static_cast<int32_t>(id));
    KVB_CHECK(ins.second || static_cast<int64_t>(id) < n_model, src, ": ", added_key, ": '",
              tokens_[id], "' (id ", id, ") duplicates token ", ins.first->second);
  }

  merges_.reserve(spec_.merges.size());
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const auto& m = spec_.merges[r];
    auto a = vocab_.find(m.first), b = vocab_.find(m.second), ab = vocab_.find(m.first + m.second);
    KVB_CHECK(a != vocab_.end() && b != vocab_.end(), src, ": ", merges_key, "[", r, "] ('",
              m.first, "' '", m.second, "') names a token not in ", vocab_key);
    KVB_CHECK(ab != vocab_.end(), src, ": ", merges_key, "[", r, "] ('", m.first, "' '", m.second,
              "') makes '", m.first + m.second, "', which is not in ", vocab_key);
    // Later duplicates win, as in tokenizers' merge map.
    merges_[pair_key(a->second, b->second)] = {static_cast<int32_t>(r), ab->second};
  }

  for (int& b : byte_ids_) b = -1;
  for (int64_t id = 0; id < n_model; ++id) {
    const int v = byte_token_value(tokens_[static_cast<size_t>(id)]);
    if (v >= 0 && byte_ids_[v] < 0) byte_ids_[v] = static_cast<int32_t>(id);
  }
  for (int64_t x : {spec_.unk_id, spec_.bos_id, spec_.eos_id})
    KVB_CHECK(x >= -1 && x < n, src, ": special token id ", x, " is outside the vocabulary [0, ", n,
              ")");
  KVB_CHECK(!spec_.add_bos || spec_.bos_id >= 0, src,
            ": post_processor adds a BOS but none is known");
  KVB_CHECK(!spec_.add_eos || spec_.eos_id >= 0, src,
            ": post_processor adds an EOS but none is known");

  for (const AddedToken& a : spec_.added) {
    const std::string text = a.normalized ? normalize(a.content) : a.content;
    if (text.empty()) continue;
    if (text != a.content) decode_as_[static_cast<int32_t>(a.id)] = text;
    added_by_byte_[a.normalized ? 1 : 0][static_cast<uint8_t>(text[0])].push_back({text, &a});
  }
  for (auto& pass : added_by_byte_)
    for (auto& v : pass)
      std::stable_sort(v.begin(), v.end(), [](const AddedMatch& x, const AddedMatch& y) {
        return x.text.size() > y.text.size();
      });
}

std::string BpeTokenizer::kind() const {
  return spec_.format + (spec_.byte_level ? ":bpe-byte-level" : ":bpe-sentencepiece");
}

const std::string& BpeTokenizer::piece(int64_t id) const {
  KVB_CHECK(id >= 0 && id < vocab_size(), spec_.source, ": token id ", id,
            " is outside the vocabulary [0, ", vocab_size(), ")");
  return tokens_[static_cast<size_t>(id)];
}

int64_t BpeTokenizer::piece_id(const std::string& p) const {
  auto it = piece_ids_.find(p);
  return it == piece_ids_.end() ? -1 : it->second;
}

bool BpeTokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)] != 0;
}

std::vector<int64_t> BpeTokenizer::special_ids() const {
  std::vector<int64_t> out;
  for (size_t id = 0; id < special_.size(); ++id)
    if (special_[id]) out.push_back(static_cast<int64_t>(id));
  return out;
}

void BpeTokenizer::find_added(const std::string& s, bool normalized,
                              std::vector<Match>* out) const {
  const auto& by_byte = added_by_byte_[normalized ? 1 : 0];
  size_t last_end = 0;
  for (size_t i = 0; i < s.size();) {
    const auto& cands = by_byte[static_cast<uint8_t>(s[i])];
    const AddedMatch* hit = nullptr;
    for (const AddedMatch& c :
         cands) {  // longest first: leftmost-longest as tokenizers' Aho-Corasick
      if (s.compare(i, c.text.size(), c.text) == 0) {
        hit = &c;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    const AddedToken* tok = hit->token;
    size_t begin = i, end = i + hit->text.size();
    if (tok->single_word) {
      const bool left_ok = begin == 0 || !is_word_char(last_cp(s, begin));
      const bool right_ok = end == s.size() || !is_word_char(first_cp(s, end));
      if (!left_ok || !right_ok) {  // skipped; the scan resumes after it, as find_iter does
        i = end;
        continue;
      }
    }
    if (tok->lstrip) {
      while (begin > last_end && uni_is_whitespace(last_cp(s, begin))) {
        size_t b = begin - 1;
        while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
        begin = b;
      }
    }
    if (tok->rstrip) {
      while (end < s.size() && uni_is_whitespace(first_cp(s, end))) end += utf8_valid_len(s, end);
    }
    out->push_back({begin, end, static_cast<int32_t>(tok->id)});
    last_end = end;
    i = end;
  }
}

std::string BpeTokenizer::normalize(const std::string& s) const {
  std::string cur = s;
  for (const NormalizerStep& st : spec_.normalizers) {
    switch (st.type) {
      case NormalizerStep::Type::kNfc:
        cur = uni_nfc(cur);
        break;
      case NormalizerStep::Type::kPrepend:
        if (!cur.empty()) cur = st.a + cur;
        break;
      case NormalizerStep::Type::kReplace: {
        if (st.a.empty()) break;
        std::string out;
        for (size_t i = 0; i < cur.size();) {
          if (cur.compare(i, st.a.size(), st.a) == 0) {
            out += st.b;
            i += st.a.size();
          } else {
            out += cur[i++];
          }
        }
        cur = std::move(out);
        break;
      }
    }
  }
  return cur;
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
  // Invalid UTF-8 (which no Python or Rust string can hold) is defined as one U+FFFD per byte that
  // starts no valid character, as the SentencePiece backend and spm_encode do.
  const std::string s = utf8_sanitize(text);
  std::vector<int64_t> ids;
  std::vector<Match> raw;
  find_added(s, false, &raw);
  bool have_normalized_added = false;
  for (const auto& v : added_by_byte_[1])
    have_normalized_added = have_normalized_added || !v.empty();
  size_t pos = 0;
  auto text_segment = [&](size_t b, size_t e) {
    if (e <= b) return;
    const std::string norm = normalize(s.substr(b, e - b));
    const bool first = b == 0;
    if (!have_normalized_added) {
      encode_segment(norm, first, &ids);
      return;
    }
    std::vector<Match> m;
    find_added(norm, true, &m);
    size_t p = 0;
    for (const Match& x : m) {
      if (x.begin > p) encode_segment(norm.substr(p, x.begin - p), first && p == 0, &ids);
      ids.push_back(x.id);
      p = x.end;
    }
    if (p < norm.size()) encode_segment(norm.substr(p), first && p == 0, &ids);
  };
  for (const Match& m : raw) {
    text_segment(pos, m.begin);
    ids.push_back(m.id);
    pos = m.end;
  }
  text_segment(pos, s.size());
  return ids;
}

void BpeTokenizer::encode_segment(const std::string& s, bool first_segment,
                                  std::vector<int64_t>* ids) const {
  if (s.empty()) return;
  std::vector<std::string> pieces{s};
  pre_tokenize(spec_.pre_tokenizers, first_segment, &pieces);
  for (const std::string& w : pieces) encode_word(w, ids);
}

void BpeTokenizer::encode_word(const std::string& w, std::vector<int64_t>* ids) const {
  if (spec_.ignore_merges) {
    auto it = vocab_.find(w);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = w.size() <= 256;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(w);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  struct Sym {
    int32_t id;
    int prev, next;
    size_t len;  // bytes of the word it covers; 0 once merged into its left neighbour
  };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  bool prev_unk = false;
  for (size_t i = 0; i < w.size();) {
    const size_t len = std::max<size_t>(1, std::min(utf8_valid_len(w, i), w.size() - i));
    const std::string ch = w.substr(i, len);
    i += len;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      syms.push_back({it->second, 0, 0, len});
      prev_unk = false;
      continue;
    }
    if (spec_.byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) syms.push_back({byte_ids_[b], 0, 0, 1});
        prev_unk = false;
        continue;
      }
    }
    if (spec_.unk_id >= 0) {
      if (spec_.fuse_unk && prev_unk) {
        syms.back().len += len;
      } else {
        syms.push_back({static_cast<int32_t>(spec_.unk_id), 0, 0, len});
      }
      prev_unk = true;
    }
    // With no unk token a character outside the vocabulary is dropped, as tokenizers does.
  }
  const int n = static_cast<int>(syms.size());
  for (int k = 0; k < n; ++k) {
    syms[k].prev = k - 1;
    syms[k].next = k + 1 < n ? k + 1 : -1;
  }
  struct Merge {
    int32_t rank;
    int pos;
    int32_t new_id;
  };
  auto later = [](const Merge& a, const Merge& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
  auto lookup = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (int k = 0; k + 1 < n; ++k)
    if (const auto* m = lookup(syms[k].id, syms[k + 1].id)) queue.push({m->first, k, m->second});
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Sym& cur = syms[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const int next_pos = cur.next;
    const Sym right = syms[next_pos];
    const auto* m = lookup(cur.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;  // stale: a neighbour changed
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    syms[next_pos].len = 0;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* p = lookup(syms[cur.prev].id, cur.id))
        queue.push({p->first, cur.prev, p->second});
    if (cur.next >= 0)
      if (const auto* q = lookup(cur.id, syms[cur.next].id))
        queue.push({q->first, top.pos, q->second});
  }
  std::vector<int32_t> out;
  for (const Sym& s : syms)
    if (s.len != 0) out.push_back(s.id);
  ids->insert(ids->end(), out.begin(), out.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= (1u << 16)) cache_.clear();  // bounded: a long run of distinct words
    cache_.emplace(w, std::move(out));
  }
}

const std::string& BpeTokenizer::decode_text(int64_t id) const {
  const std::string& t = piece(id);  // range check with a clear error
  if (decode_as_.empty()) return t;
  auto it = decode_as_.find(static_cast<int32_t>(id));
  return it == decode_as_.end() ? t : it->second;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  std::string out;
  if (spec_.byte_level) {
    // tokenizers' ByteLevel decoder: each token's characters back to bytes (a token with a
    // character outside the byte alphabet, e.g. an added token with a space, contributes its UTF-8
    // as is), then lossy UTF-8 over the whole.
    std::string bytes;
    std::vector<uint32_t> cps;
    std::vector<size_t> off;
    for (int64_t id : ids) {
      const std::string& t = decode_text(id);
      if (skip_special && is_special(id)) continue;
      utf8_decode(t, &cps, &off);
      std::string mapped;
      bool all = true;
      for (uint32_t c : cps) {
        const int b = byte_level_byte(c);
        if (b < 0) {
          all = false;
          break;
        }
        mapped += static_cast<char>(b);
      }
      bytes += all ? mapped : t;
    }
    return utf8_lossy(bytes);
  }
  // The SentencePiece-style decoder chain: Replace(U+2581 -> ' '), ByteFallback (a run of <0xXX>
  // tokens becomes its UTF-8 when valid, else one U+FFFD per byte), Fuse, Strip(' ', 1, 0).
  std::string pending;
  size_t n_pending = 0;
  auto flush = [&] {
    if (n_pending == 0) return;
    bool valid = true;
    for (size_t i = 0; i < pending.size() && valid;) {
      const size_t len = utf8_valid_len(pending, i);
      valid = len != 0;
      i += len;
    }
    if (valid) {
      out += pending;
    } else {
      for (size_t k = 0; k < n_pending; ++k) out += "\xEF\xBF\xBD";
    }
    pending.clear();
    n_pending = 0;
  };
  for (int64_t id : ids) {
    const std::string& t = decode_text(id);
    if (skip_special && is_special(id)) continue;
    const int v = byte_token_value(t);
    if (v >= 0) {
      pending += static_cast<char>(v);
      ++n_pending;
      continue;
    }
    flush();
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, kMetaspace) == 0) {
        out += ' ';
        i += 3;
      } else {
        out += t[i++];
      }
    }
  }
  flush();
  if (spec_.decode_strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace kvb
