// The full-cache baseline caches (stream logits, qa answers) on disk: keyed by the model's content,
// so a checkpoint replaced in place with other weights of the same size misses the old entries;
// checksummed, so a zeroed, cut or changed entry is recomputed; and checked by the `full` run
// itself, which replaces (and names) an entry that differs from its own outputs.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/eval/qa.h"
#include "harness/eval/stream.h"
#include "harness/formats/llama2c_format.h"
#include "harness/formats/tokenizer.h"
#include "harness/model/model.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The one file in `dir` (a cache holding one entry).
std::string only_file(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u) << dir;
  return files.empty() ? "" : files[0];
}

// stories260K copied into a directory of its own, so its weights can be replaced in place.
std::string copy_stories260k(const std::string& tag) {
  const std::string dir = test::make_temp_dir(tag);
  const std::string src = test::models_dir() + "/stories260K";
  fs::copy_file(src + "/stories260K.bin", dir + "/stories260K.bin");
  fs::copy_file(src + "/tok512.model", dir + "/tok512.model");
  return dir;
}

// Rewrites the checkpoint in `dir` in place: every weight scaled by its own factor in [0.5, 1.5],
// so the file keeps its size (and the model its shapes) and computes something else.
void replace_weights_in_place(const std::string& dir) {
  const std::string path = dir + "/stories260K.bin";
  std::string bytes = read_bytes(path);
  const Llama2cLayout layout =
      parse_llama2c_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
  ASSERT_EQ(layout.expected_bytes, bytes.size());
  constexpr size_t kHeader = 28;
  for (size_t at = kHeader, i = 0; at + 4 <= bytes.size(); at += 4, ++i) {
    float x;
    std::memcpy(&x, bytes.data() + at, 4);
    x *= static_cast<float>(1.0 + 0.5 * std::sin(0.37 * static_cast<double>(i)));
    std::memcpy(bytes.data() + at, &x, 4);
  }
  write_bytes(path, bytes);
}

StreamOptions cached(const std::string& dir) {
  StreamOptions o;
  o.cache_dir = dir;
  return o;
}

std::vector<float> fresh_baseline(const std::shared_ptr<Model>& m,
                                  const std::vector<int64_t>& tokens) {
  bool from_cache = true;
  std::vector<float> lp = stream_baseline_logprobs(m, tokens, StreamOptions{}, &from_cache);
  EXPECT_FALSE(from_cache);
  return lp;
}

double kl_sum(const StreamSampleResult& r) {
  double s = 0;
  for (float k : r.kl) s += k;
  return s;
}

TEST(BaselineCache, ModelContentHashFollowsTheWeightsNotThePath) {
  const std::string dir = copy_stories260k("bc_hash");
  const auto a = load_model(dir);
  const auto again = load_model(test::models_dir() + "/stories260K");  // another path
  EXPECT_EQ(a->content_hash(), again->content_hash());
  EXPECT_EQ(a->content_hash().size(), 16u);
  EXPECT_EQ(a->tokenizer_hash(), again->tokenizer_hash());
  replace_weights_in_place(dir);
  const auto b = load_model(dir);
  EXPECT_EQ(b->source, a->source);
  EXPECT_EQ(b->weight_bytes(), a->weight_bytes());
  EXPECT_NE(b->content_hash(), a->content_hash());
  // A copy starts without the remembered hash: it is made to be changed.
  Model copy = *a;
  copy.config.norm_eps *= 2;
  EXPECT_NE(copy.content_hash(), a->content_hash());
}

// The finding this guards against: the old model's logits served to the new one.
TEST(BaselineCache, StreamEntriesOfAReplacedCheckpointAreNotServed) {
  const std::string dir = copy_stories260k("bc_stream_model");
  const std::string cache = test::make_temp_dir("bc_stream_cache");
  const std::vector<int64_t> w = test::story_windows(64, 1)[0];
  const auto old_model = load_model(dir);
  run_stream_sample(old_model, "paged", nlohmann::json::object(), w, cached(cache));
  replace_weights_in_place(dir);
  const auto m = load_model(dir);
  const std::vector<float> want = fresh_baseline(m, w);
  ASSERT_NE(want, fresh_baseline(old_model, w)) << "the replaced weights compute the same logits";

  // A method's baseline is the new model's, computed: the old entry is not its.
  const StreamSampleResult paged =
      run_stream_sample(m, "paged", nlohmann::json::object(), w, cached(cache));
  EXPECT_FALSE(paged.baseline_from_cache);
  EXPECT_LT(kl_sum(paged) / static_cast<double>(paged.tokens), 1e-6);
  bool from_cache = false;
  EXPECT_EQ(stream_baseline_logprobs(m, w, cached(cache), &from_cache), want);
  EXPECT_TRUE(from_cache);
  // The full run agrees with that entry: nothing to replace.
  testing::internal::CaptureStderr();
  const StreamSampleResult full =
      run_stream_sample(m, "full", nlohmann::json::object(), w, cached(cache));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(kl_sum(full), 0.0);
  EXPECT_TRUE(full.baseline_from_cache);
}

// The baseline computed on its own (for a method) and the `full` run's own logits are the same
// bits on the CPU: the self-check below relies on it.
TEST(BaselineCache, FullRunMatchesTheBaselineAnotherMethodCached) {
  const std::string cache = test::make_temp_dir("bc_same");
  const std::vector<int64_t> w = test::story_windows(64, 1)[0];
  run_stream_sample(test::stories260k(), "paged", nlohmann::json::object(), w, cached(cache));
  testing::internal::CaptureStderr();
  const StreamSampleResult full =
      run_stream_sample(test::stories260k(), "full", nlohmann::json::object(), w, cached(cache));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_TRUE(full.baseline_from_cache);
  EXPECT_EQ(kl_sum(full), 0.0);
  EXPECT_EQ(full.top1_agree, full.tokens);
}

TEST(BaselineCache, DamagedStreamEntryIsRecomputedNotUsed) {
  const std::string cache = test::make_temp_dir("bc_damaged");
  const auto m = test::stories260k();
  const std::vector<int64_t> w = test::story_windows(48, 1)[0];
  const std::vector<float> want = fresh_baseline(m, w);
  bool from_cache = true;
  stream_baseline_logprobs(m, w, cached(cache), &from_cache);
  ASSERT_FALSE(from_cache);
  const std::string path = only_file(cache);
  const std::string good = read_bytes(path);
  const size_t payload = want.size() * sizeof(float);
  ASSERT_GT(good.size(), payload);

  std::string flipped = good;
  flipped[payload / 2] ^= 0x10;
  std::string flipped_trailer = good;
  flipped_trailer.back() ^= 0x01;
  const std::vector<std::pair<std::string, std::string>> damage = {
      {"zero-filled", std::string(good.size(), '\0')},
      {"zero-filled, payload size", std::string(payload, '\0')},
      {"payload without its trailer", good.substr(0, payload)},
      {"truncated", good.substr(0, good.size() - 7)},
      {"one payload bit flipped", flipped},
      {"one trailer bit flipped", flipped_trailer},
      {"empty", ""}};
  for (const auto& [what, bytes] : damage) {
    write_bytes(path, bytes);
    from_cache = true;
    EXPECT_EQ(stream_baseline_logprobs(m, w, cached(cache), &from_cache), want) << what;
    EXPECT_FALSE(from_cache) << what;
    EXPECT_EQ(read_bytes(path), good) << what << ": the entry is rewritten";
  }
  EXPECT_EQ(stream_baseline_logprobs(m, w, cached(cache), &from_cache), want);
  EXPECT_TRUE(from_cache);
}

// An entry that passes its checksum but holds other logits (here: another model's, written by the
// cache itself) is caught by the `full` run, named, replaced, and the run scored against its own.
TEST(BaselineCache, FullRunReplacesAWrongEntryAndWarns) {
  const std::string dir = copy_stories260k("bc_wrong_model");
  const std::string cache = test::make_temp_dir("bc_wrong_cache");
  const std::string other = test::make_temp_dir("bc_wrong_other");
  const std::vector<int64_t> w = test::story_windows(64, 1)[0];
  const auto m = test::stories260k();
  bool from_cache = false;
  stream_baseline_logprobs(m, w, cached(cache), &from_cache);
  replace_weights_in_place(dir);
  stream_baseline_logprobs(load_model(dir), w, cached(other), &from_cache);
  const std::string path = only_file(cache);
  fs::copy_file(only_file(other), path, fs::copy_options::overwrite_existing);
  std::vector<float> wrong = stream_baseline_logprobs(m, w, cached(cache), &from_cache);
  ASSERT_TRUE(from_cache);
  ASSERT_NE(wrong, fresh_baseline(m, w));

  testing::internal::CaptureStderr();
  const StreamSampleResult full =
      run_stream_sample(m, "full", nlohmann::json::object(), w, cached(cache));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning"), std::string::npos) << err;
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(kl_sum(full), 0.0);
  EXPECT_FALSE(full.baseline_from_cache);
  EXPECT_EQ(stream_baseline_logprobs(m, w, cached(cache), &from_cache), fresh_baseline(m, w));
  EXPECT_TRUE(from_cache);
  testing::internal::CaptureStderr();
  EXPECT_TRUE(
      run_stream_sample(m, "full", nlohmann::json::object(), w, cached(cache)).baseline_from_cache);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

QaSample story_sample() {
  QaSample s;
  s.context = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  QaItem item;
  item.question = " One day, Lily";
  item.answers = {"went"};
  item.metric = "string_match_part";
  s.items.push_back(item);
  s.max_new_tokens = 8;
  s.key = sha256_hex(s.context + "\x1f" + item.question);
  return s;
}

QaOptions qa_cached(const std::string& dir) {
  QaOptions o;
  o.cache_dir = dir;
  return o;
}

TEST(BaselineCache, QaEntriesFollowTheModelsContentAndAreChecked) {
  const std::string dir = copy_stories260k("bc_qa_model");
  const std::string cache = test::make_temp_dir("bc_qa_cache");
  const Tokenizer tok(dir + "/tok512.model");
  const QaSample s = story_sample();
  auto paired = [&](const std::shared_ptr<Model>& model) {
    return run_qa_sample(model, tok, "paged", nlohmann::json::object(), s, qa_cached(cache))
        .items[0]
        .full_prediction;
  };
  const auto old_model = load_model(dir);
  const std::string old_answer = paired(old_model);
  const std::string old_path = only_file(cache);
  const std::string old_entry = read_bytes(old_path);
  replace_weights_in_place(dir);
  const auto m = load_model(dir);
  const std::string want =
      run_qa_sample(m, tok, "full", nlohmann::json::object(), s, QaOptions{}).items[0].prediction;
  ASSERT_NE(want, old_answer) << "the replaced weights answer the same";

  // The new model's answers are computed, not read from the old model's entry.
  EXPECT_EQ(paired(m), want);
  std::string path;
  for (const auto& e : fs::directory_iterator(cache))
    if (e.path().string() != old_path) path = e.path().string();
  ASSERT_FALSE(path.empty()) << "the new model's answers have an entry of their own";

  // A wrong entry that passes its check (the old model's, under the new one's name) is caught by
  // the full run, named and replaced.
  write_bytes(path, old_entry);
  testing::internal::CaptureStderr();
  const QaSampleResult full =
      run_qa_sample(m, tok, "full", nlohmann::json::object(), s, qa_cached(cache));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_EQ(full.items[0].prediction, want);
  EXPECT_EQ(full.items[0].full_prediction, want);
  EXPECT_EQ(paired(m), want);

  // A changed entry fails its check: recomputed and rewritten, not used.
  std::string text = read_bytes(path);
  const size_t at = text.find(want);
  ASSERT_NE(at, std::string::npos) << text;
  text[at] = text[at] == 'x' ? 'y' : 'x';
  write_bytes(path, text);
  EXPECT_EQ(paired(m), want);
  EXPECT_NE(read_bytes(path), text);
}

}  // namespace
}  // namespace kvb
