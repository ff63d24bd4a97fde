#include "harness/formats/sentencepiece_model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <queue>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/unicode_text.h"

namespace kvb {

namespace {

// Minimal protobuf wire-format reader: enough for sentencepiece_model.proto.
struct Wire {
  const uint8_t* p;
  const uint8_t* end;
  const std::string& src;

  bool done() const { return p >= end; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      KVB_CHECK(p < end, src, ": not a valid SentencePiece model (truncated varint)");
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) return v;
    }
    KVB_FAIL(src, ": not a valid SentencePiece model (varint too long)");
  }
  // Reads a field key; the value is then read by one of the accessors below or skipped.
  void key(uint32_t* field, uint32_t* wire) {
    const uint64_t k = varint();
    *field = static_cast<uint32_t>(k >> 3);
    *wire = static_cast<uint32_t>(k & 7);
  }
  Wire sub() {
    const uint64_t n = varint();
    KVB_CHECK(n <= static_cast<uint64_t>(end - p), src,
              ": not a valid SentencePiece model (length-delimited field runs past the end)");
    Wire w{p, p + n, src};
    p += n;
    return w;
  }
  std::string bytes() {
    Wire w = sub();
    return std::string(reinterpret_cast<const char*>(w.p), w.end - w.p);
  }
  float fixed32_float() {
    KVB_CHECK(end - p >= 4, src, ": not a valid SentencePiece model (truncated fixed32)");
    float f;
    std::memcpy(&f, p, 4);
    p += 4;
    return f;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0:
        varint();
        return;
      case 1:
        KVB_CHECK(end - p >= 8, src, ": not a valid SentencePiece model (truncated fixed64)");
        p += 8;
        return;
      case 2:
        sub();
        return;
      case 5:
        KVB_CHECK(end - p >= 4, src, ": not a valid SentencePiece model (truncated fixed32)");
        p += 4;
        return;
      default:
        KVB_FAIL(src, ": not a valid SentencePiece model (unknown wire type ", wire, ")");
    }
  }
};

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space


size_t utf8_len(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;  // a stray continuation byte stands alone (and falls back to bytes)
}

}  // namespace

SentencePieceModel::SentencePieceModel(const std::string& model_path) : path_(model_path) {
  KVB_CHECK(file_exists(model_path), model_path, ": tokenizer file not found");
  parse(read_text_file(model_path));
}

SentencePieceModel::SentencePieceModel(const std::string& bytes, const std::string& source)
    : path_(source) {
  parse(bytes);
}

void SentencePieceModel::parse(const std::string& bytes) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  Wire w{reinterpret_cast<const uint8_t*>(bytes.data()),
         reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size(), path_};
  int model_type = 1;  // proto default: UNIGRAM
  std::string normalizer = "nmt_nfkc";
  bool saw_trainer = false;
  // TrainerSpec's bos_piece/eos_piece name the control pieces that are BOS and EOS (Gemma's are
  // <bos>/<eos>); SentencePiece's defaults are <s>/</s>.
  std::string bos_piece = "<s>", eos_piece = "</s>";
  while (!w.done()) {
    uint32_t f, wt;
    w.key(&f, &wt);
    if (f == 1 && wt == 2) {  // SentencePiece
      Wire s = w.sub();
      Piece piece;
      while (!s.done()) {
        uint32_t sf, swt;
        s.key(&sf, &swt);
        if (sf == 1 && swt == 2) piece.text = s.bytes();
        else if (sf == 2 && swt == 5) piece.score = s.fixed32_float();
        else if (sf == 3 && swt == 0) {
          const uint64_t t = s.varint();
          KVB_CHECK(t >= 1 && t <= 6, path_, ": piece ", pieces_.size(), " has unknown type ", t);
          piece.type = static_cast<PieceType>(t);
        } else s.skip(swt);
      }
      pieces_.push_back(std::move(piece));
    } else if (f == 2 && wt == 2) {  // TrainerSpec
      saw_trainer = true;
      Wire s = w.sub();
      while (!s.done()) {
        uint32_t sf, swt;
        s.key(&sf, &swt);
        if (sf == 3 && swt == 0) model_type = static_cast<int>(s.varint());
        else if (sf == 35 && swt == 0) byte_fallback_ = s.varint() != 0;
        else if (sf == 44 && swt == 2) unk_surface_ = s.bytes();
        else if (sf == 46 && swt == 2) bos_piece = s.bytes();
        else if (sf == 47 && swt == 2) eos_piece = s.bytes();
        else s.skip(swt);
      }
    } else if (f == 3 && wt == 2) {  // NormalizerSpec
      Wire s = w.sub();
      while (!s.done()) {
        uint32_t sf, swt;
        s.key(&sf, &swt);
        if (sf == 1 && swt == 2) normalizer = s.bytes();
        else if (sf == 3 && swt == 0) add_dummy_prefix_ = s.varint() != 0;
        else if (sf == 4 && swt == 0) remove_extra_whitespaces_ = s.varint() != 0;
        else if (sf == 5 && swt == 0) escape_whitespaces_ = s.varint() != 0;
        else s.skip(swt);
      }
    } else {
      w.skip(wt);
    }
  }
  KVB_CHECK(!pieces_.empty() && saw_trainer, path_,
            ": not a valid SentencePiece model (no pieces or no trainer spec)");
  KVB_CHECK(model_type == 2, path_, ": SentencePiece model type ", model_type,
            " is not supported (only BPE, type 2)");
  KVB_CHECK(normalizer == "identity", path_, ": SentencePiece normalizer '", normalizer,
            "' is not supported (only 'identity')");
  bool have_unk = false;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    const int32_t id = static_cast<int32_t>(i);
    switch (p.type) {
      case PieceType::kNormal:
        mergeable_.emplace(p.text, id);
        break;
      case PieceType::kUserDefined:
        mergeable_.emplace(p.text, id);
        user_defined_.push_back(p.text);
        break;
      case PieceType::kUnknown:
        unk_id_ = id;
        have_unk = true;
        break;
      case PieceType::kControl:
        if (p.text == bos_piece) bos_id_ = id;
        if (p.text == eos_piece) eos_id_ = id;
        break;
      case PieceType::kByte: {
        // Exactly "<0xXX>" with two upper-case hex digits, as SentencePiece requires. (sscanf alone
        // accepts "<0x-1>", giving v = 0xFFFFFFFF and a write outside byte_ids_.)
        unsigned v = 0;
        char canon[8];
        const bool ok = p.text.size() == 6 && std::sscanf(p.text.c_str(), "<0x%2X>", &v) == 1 &&
                        v < 256 && std::snprintf(canon, sizeof(canon), "<0x%02X>", v) == 6 &&
                        p.text == canon;
        KVB_CHECK(ok, path_, ": byte piece '", p.text, "' is malformed");
        byte_ids_[v] = id;
        break;
      }
      case PieceType::kUnused:
        break;
    }
  }
  KVB_CHECK(have_unk, path_, ": SentencePiece model has no <unk> piece");
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b)
      KVB_CHECK(byte_ids_[b] >= 0, path_, ": byte_fallback is on but piece <0x", std::hex, b,
                "> is missing");
  }
  std::sort(user_defined_.begin(), user_defined_.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
}

std::string SentencePieceModel::normalize(const std::string& text) const {
  // Like SentencePiece's normalizer, every byte that does not start a valid UTF-8 character becomes
  // U+FFFD (checked against spm_encode in tests/base/test_tokenizer.cpp); its string_util::DecodeUTF8
  // validity rule is utf8_valid_len's.
  std::string s = utf8_sanitize(text);
  if (remove_extra_whitespaces_) {
    std::string out;
    bool prev_space = true;  // drops leading spaces
    for (char c : s) {
      if (c == ' ') {
        if (!prev_space) out += c;
        prev_space = true;
      } else {
        out += c;
        prev_space = false;
      }
    }
    s = out;
  }
  if (s.empty()) return s;
  if (add_dummy_prefix_) s = " " + s;
  std::string out;
  if (escape_whitespaces_) {
    for (char c : s) {
      if (c == ' ') out += kSpace;
      else out += c;
    }
  } else {
    out = s;
  }
  // Trailing whitespace goes after escaping, as in SentencePiece: a literal U+2581 at the end of the
  // input is removed like a space.
  if (remove_extra_whitespaces_) {
    const std::string space = escape_whitespaces_ ? kSpace : " ";
    while (out.size() >= space.size() &&
           out.compare(out.size() - space.size(), space.size(), space) == 0)
      out.resize(out.size() - space.size());
  }
  return out;
}

std::vector<int64_t> SentencePieceModel::encode(const std::string& text) const {
  const std::string norm = normalize(text);
  // Initial symbols: user-defined pieces (longest match) and single UTF-8 characters.
  struct Sym {
    size_t begin, len;
    int prev, next;
    bool frozen;  // a user-defined piece: SentencePiece never merges it with a neighbour
  };
  std::vector<Sym> syms;
  for (size_t i = 0; i < norm.size();) {
    size_t len = 0;
    bool frozen = false;
    for (const auto& u : user_defined_) {
      if (norm.compare(i, u.size(), u) == 0) {
        len = u.size();
        frozen = !u.empty();
        break;
      }
    }
    if (len == 0) len = std::min(utf8_len(static_cast<uint8_t>(norm[i])), norm.size() - i);
    const int n = static_cast<int>(syms.size());
    syms.push_back({i, len, n - 1, n + 1, frozen});
    i += len;
  }
  if (syms.empty()) return {};
  syms.back().next = -1;

  // Greedy BPE: repeatedly merge the adjacent pair whose concatenation is the highest-scoring piece
  // (leftmost on ties), as sentencepiece's bpe_model does.
  struct Cand {
    float score;
    int left, right;
    size_t size;  // merged length, to detect stale candidates
  };
  auto worse = [](const Cand& a, const Cand& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> agenda(worse);
  auto maybe_add = [&](int l, int r) {
    if (l < 0 || r < 0 || syms[l].frozen || syms[r].frozen) return;
    auto it = mergeable_.find(norm.substr(syms[l].begin, syms[l].len + syms[r].len));
    if (it == mergeable_.end()) return;
    agenda.push({pieces_[it->second].score, l, r, syms[l].len + syms[r].len});
  };
  for (size_t i = 1; i < syms.size(); ++i) maybe_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!agenda.empty()) {
    const Cand c = agenda.top();
    agenda.pop();
    Sym& l = syms[c.left];
    Sym& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.size || l.next != c.right) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    maybe_add(l.prev, c.left);
    maybe_add(c.left, l.next);
  }

  std::vector<int64_t> ids;
  bool prev_unk = false;
  for (int i = 0; i >= 0; i = syms[i].next) {
    const std::string s = norm.substr(syms[i].begin, syms[i].len);
    auto it = mergeable_.find(s);
    const bool unk = it == mergeable_.end();
    if (!unk) {
      ids.push_back(it->second);
    } else if (byte_fallback_) {
      for (unsigned char b : s) ids.push_back(byte_ids_[b]);
    } else if (!prev_unk) {  // SentencePiece merges a run of unknown symbols into one <unk>
      ids.push_back(unk_id_);
    }
    prev_unk = unk;
  }
  return ids;
}

const std::string& SentencePieceModel::piece(int64_t id) const {
  KVB_CHECK(id >= 0 && id < vocab_size(), path_, ": token id ", id, " is outside the vocabulary [0, ",
            vocab_size(), ")");
  return pieces_[id].text;
}

SentencePieceModel::PieceType SentencePieceModel::type(int64_t id) const {
  (void)piece(id);  // range check with a clear error
  return pieces_[static_cast<size_t>(id)].type;
}

float SentencePieceModel::score(int64_t id) const {
  (void)piece(id);  // range check with a clear error
  return pieces_[static_cast<size_t>(id)].score;
}

int64_t SentencePieceModel::piece_id(const std::string& p) const {
  for (size_t i = 0; i < pieces_.size(); ++i)
    if (pieces_[i].text == p) return static_cast<int64_t>(i);
  return -1;
}

std::string SentencePieceModel::decode(const std::vector<int64_t>& ids) const {
  // Follows SentencePieceProcessor::Decode (checked against spm_decode in
  // tests/base/test_tokenizer.cpp): runs of byte pieces become UTF-8 with U+FFFD for each byte that
  // starts no valid character; control pieces are invisible; while nothing has been output yet a
  // piece's leading U+2581 is the dummy prefix and is dropped (for every such piece when
  // remove_extra_whitespaces is on, else only the first); <unk> shows as the unk surface.
  std::string out;
  std::string bytes;  // pending byte pieces
  auto flush_bytes = [&] {
    out += utf8_sanitize(bytes);
    bytes.clear();
  };
  bool is_bos_ws = true;
  bool bos_ws_seen = false;
  for (int64_t id : ids) {
    (void)piece(id);  // range check with a clear error, before indexing
    const Piece& p = pieces_[static_cast<size_t>(id)];
    if (p.type == PieceType::kByte) {
      unsigned v = 0;
      std::sscanf(p.text.c_str(), "<0x%2X>", &v);
      bytes += static_cast<char>(v);
      continue;
    }
    flush_bytes();
    if (bos_ws_seen || !out.empty()) is_bos_ws = false;
    bos_ws_seen = false;
    if (p.type == PieceType::kControl) continue;
    if (p.type == PieceType::kUnknown) {
      out += unk_surface_;
      continue;
    }
    size_t i = 0;
    if (is_bos_ws && (add_dummy_prefix_ || remove_extra_whitespaces_) &&
        p.text.compare(0, 3, kSpace) == 0) {
      i = 3;
      bos_ws_seen = !remove_extra_whitespaces_;
    }
    while (i < p.text.size()) {
      if (p.text.compare(i, 3, kSpace) == 0) {
        out += ' ';
        i += 3;
      } else {
        out += p.text[i++];
      }
    }
  }
  flush_bytes();
  return out;
}

}  // namespace kvb

namespace kvb {

SentencePieceBackend::SentencePieceBackend(std::shared_ptr<const SentencePieceModel> model,
                                           std::string kind, bool add_bos,
                                           std::string chat_template,
                                           const std::vector<int64_t>& text_specials)
    : m_(std::move(model)),
      kind_(std::move(kind)),
      add_bos_(add_bos),
      chat_template_(std::move(chat_template)) {
  for (int64_t id : text_specials) {
    const std::string& t = m_->piece(id);
    if (t.empty()) continue;
    specials_by_byte_[static_cast<uint8_t>(t[0])].emplace_back(t, id);
    any_specials_ = true;
  }
  for (auto& v : specials_by_byte_)
    std::stable_sort(v.begin(), v.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::vector<int64_t> SentencePieceBackend::encode(const std::string& text) const {
  if (!any_specials_) return m_->encode(text);
  std::vector<int64_t> out;
  size_t start = 0;  // of the text stretch not yet encoded
  auto flush = [&](size_t end) {
    if (end > start) {
      const std::vector<int64_t> ids = m_->encode(text.substr(start, end - start));
      out.insert(out.end(), ids.begin(), ids.end());
    }
  };
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, int64_t>* hit = nullptr;
    for (const auto& c : specials_by_byte_[static_cast<uint8_t>(text[i])]) {
      if (text.compare(i, c.first.size(), c.first) == 0) {
        hit = &c;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    flush(i);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  flush(text.size());
  return out;
}

std::string SentencePieceBackend::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  // Control pieces are invisible in spm_decode already; skipping drops <unk> as well.
  if (!skip_special) return m_->decode(ids);
  std::vector<int64_t> kept;
  for (int64_t id : ids)
    if (!is_special(id)) kept.push_back(id);
  return m_->decode(kept);
}

bool SentencePieceBackend::is_special(int64_t id) const {
  if (id < 0 || id >= m_->vocab_size()) return false;
  const auto t = m_->type(id);
  using T = SentencePieceModel::PieceType;
  return t == T::kControl || t == T::kUnknown;
}

std::vector<int64_t> SentencePieceBackend::special_ids() const {
  std::vector<int64_t> out;
  for (int64_t id = 0; id < m_->vocab_size(); ++id)
    if (is_special(id)) out.push_back(id);
  return out;
}

}  // namespace kvb
