// RULER-style synthetic tasks and passkey (datasets/synthetic_tasks.h) on the real tokenizers and
// corpora: every task hits its target length within 1% (measured by a whole-prompt encoding, not
// by the generator's own counter), needles sit at the requested depth and occur once, answers are
// in the context, generation is byte-for-byte deterministic with golden hashes checked in, the
// cache round-trips, and every user error names its input.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "datasets/synthetic_tasks.h"
#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/tokenizer.h"
#include "harness/metrics/text_metrics.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using nlohmann::json;
using ptest::expect_kvb_error;

const Tokenizer& tok512() {
  static const Tokenizer t(ptest::models_dir() + "/stories260K/tok512.model");
  return t;
}
const Tokenizer& llama2() {
  static const Tokenizer t(ptest::models_dir() + "/llama2-tokenizer/tokenizer.model");
  return t;
}

// TinyStories as the haystack keeps the tests quick; the default corpus is tested once.
TaskSpec make_spec(const std::string& task, int64_t target, int64_t samples = 1,
                   std::vector<double> depths = {}) {
  TaskSpec s;
  s.task = task;
  s.target_tokens = target;
  s.num_samples = samples;
  s.depths = std::move(depths);
  s.corpus = "tinystories-valid-sample";
  s.data_dir = ptest::data_dir();
  return s;
}

int64_t exact_tokens(const Tokenizer& tok, const std::string& text) {
  return static_cast<int64_t>(tok.encode(text).size());
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

const std::vector<std::string> kNeedleTasks = {
    "niah_single_1",   "niah_single_2",   "niah_single_3",   "niah_multikey_1", "niah_multikey_2",
    "niah_multikey_3", "niah_multivalue", "niah_multiquery", "passkey"};

// The length contract, measured independently: BOS + encode(prompt) within 1% of the target.
void check_sample(const Tokenizer& tok, const TaskSample& s, int64_t target,
                  const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(s.prompt(), s.preamble + s.context + s.postamble + s.question + s.answer_prefix);
  EXPECT_EQ(s.context_prompt() + s.query_prompt(), s.prompt());
  const int64_t actual = 1 + exact_tokens(tok, s.prompt());
  EXPECT_EQ(s.actual_tokens, actual);
  EXPECT_EQ(s.target_tokens, target);
  EXPECT_LE(std::llabs(actual - target), target / 100) << "actual " << actual;
  EXPECT_EQ(s.context_tokens, exact_tokens(tok, s.context));
  EXPECT_EQ(s.metric, s.task == "copy" ? "ordered_word_recall" : "string_match_all");
  EXPECT_EQ(s.multiline_answer, s.task == "copy");
  EXPECT_GT(s.max_new_tokens, 0);
  ASSERT_FALSE(s.answers.empty());
  for (const auto& a : s.answers) {
    EXPECT_FALSE(a.empty());
    EXPECT_NE(s.context.find(a), std::string::npos) << "answer '" << a << "' not in the context";
  }
  EXPECT_EQ(s.hash.size(), 64u);
}

TEST(RulerTasks, NamesAndParameters) {
  const auto& names = synthetic_task_names();
  EXPECT_EQ(names.size(), 13u);
  for (const char* t :
       {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
        "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "passkey",
        "copy"})
    EXPECT_NE(std::find(names.begin(), names.end(), t), names.end()) << t;
  EXPECT_EQ(task_param_names("vt"),
            (std::vector<std::string>{"num_chains", "num_hops", "few_shot"}));
  EXPECT_EQ(task_param_names("passkey"), std::vector<std::string>{"digits"});
  EXPECT_TRUE(task_param_names("copy").empty());
}

// The resolved parameters are what a set hash covers: RULER's preset for each task, aliases
// resolved to their choice, "auto" kept for the generator, cwe's unset settings left out, and
// num_keys raised to num_queries (RULER's rule).
TEST(RulerTasks, ResolvedParametersArePinned) {
  const auto resolved = [](const std::string& task, const json& params) {
    TaskSpec s = make_spec(task, 1024);
    s.params = params;
    return resolve_task_spec(s).params.dump();
  };
  EXPECT_EQ(resolved("niah_single_1", json::object()),
            R"({"haystack":"noise","key_type":"words","num_keys":1,"num_queries":1,)"
            R"("num_values":1,"value_type":"numbers"})");
  EXPECT_EQ(resolved("niah_multikey_3", json::object()),
            R"({"haystack":"needles","key_type":"uuids","num_keys":1,"num_queries":1,)"
            R"("num_values":1,"value_type":"uuids"})");
  EXPECT_EQ(resolved("niah_multiquery", json::object()),
            R"({"haystack":"corpus","key_type":"words","num_keys":4,"num_queries":4,)"
            R"("num_values":1,"value_type":"numbers"})");
  EXPECT_EQ(
      resolved("niah_single_2", {{"haystack", "essay"}, {"num_queries", 3}, {"num_keys", 2.0}}),
      R"({"haystack":"corpus","key_type":"words","num_keys":3,"num_queries":3,)"
      R"("num_values":1,"value_type":"numbers"})");
  EXPECT_EQ(resolved("niah_single_2", {{"haystack", "repeat"}}),
            R"({"haystack":"noise","key_type":"words","num_keys":1,"num_queries":1,)"
            R"("num_values":1,"value_type":"numbers"})");
  EXPECT_EQ(resolved("vt", json::object()), R"({"few_shot":"auto","num_chains":1,"num_hops":4})");
  EXPECT_EQ(resolved("vt", {{"few_shot", false}}),
            R"({"few_shot":false,"num_chains":1,"num_hops":4})");
  EXPECT_EQ(resolved("cwe", json::object()), "{}");
  EXPECT_EQ(resolved("cwe", {{"freq_cw", 5}, {"few_shot", "auto"}}),
            R"({"few_shot":"auto","freq_cw":5})");
  EXPECT_EQ(resolved("fwe", json::object()), R"({"alpha":2.0,"coded_wordlen":6,"vocab_size":0})");
  EXPECT_EQ(resolved("fwe", {{"alpha", 3}}), R"({"alpha":3.0,"coded_wordlen":6,"vocab_size":0})");
  EXPECT_EQ(resolved("passkey", json::object()), R"({"digits":5})");
  EXPECT_EQ(resolved("copy", json::object()), "{}");
  // The schema behind them: the preset is the default, the aliases and "auto" are declared.
  const std::vector<ParamSpec> niah = task_param_specs("niah_multikey_2");
  ASSERT_EQ(niah.size(), 6u);
  EXPECT_EQ(niah[0].name, "haystack");
  EXPECT_EQ(niah[0].default_value, "needles");
  EXPECT_EQ(niah[0].choices, (std::vector<std::string>{"noise", "corpus", "needles"}));
  EXPECT_EQ(param_spec_json(niah[0])["aliases"]["essay"], "corpus");
  EXPECT_TRUE(task_param_specs("vt")[2].accepts_auto);
  EXPECT_TRUE(task_param_specs("fwe")[0].min_open);
}

// ---- length, answers, determinism: every task, both tokenizers, 512 / 1024 / 2048 ----

class TaskLength : public ::testing::TestWithParam<std::string> {};

TEST_P(TaskLength, WithinOnePercentAnswersInContextDeterministic) {
  const std::string task = GetParam();
  for (const Tokenizer* tok : {&tok512(), &llama2()}) {
    for (int64_t target : {512, 1024, 2048}) {
      const SampleSet set = generate_task(*tok, make_spec(task, target));
      ASSERT_EQ(set.samples.size(), 1u);
      check_sample(*tok, set.samples[0], target,
                   task + " " + tok->path() + " " + std::to_string(target));
      if (target == 512) {
        // Same tokenizer, length and seed: byte-identical samples and hashes.
        const SampleSet again = generate_task(*tok, make_spec(task, target));
        EXPECT_EQ(sample_set_to_json(again).dump(), sample_set_to_json(set).dump());
        EXPECT_EQ(again.hash, set.hash);
        EXPECT_EQ(again.content_hash, set.content_hash);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RulerAllTasks, TaskLength, ::testing::ValuesIn(synthetic_task_names()),
                         [](const auto& info) { return info.param; });

TEST(RulerTasks, LongTargetWithTheDefaultCorpus) {
  TaskSpec spec = make_spec("niah_single_2", 4096, 1, {0.4});
  spec.corpus = "";  // the default: gutenberg-long
  const SampleSet set = generate_task(llama2(), spec);
  EXPECT_EQ(set.spec.corpus, "gutenberg-long");
  EXPECT_EQ(set.corpus_sha256.size(), 64u);
  check_sample(llama2(), set.samples[0], 4096, "niah_single_2 4096");
}

// ---- depth ----

class TaskDepth : public ::testing::TestWithParam<std::string> {};

TEST_P(TaskDepth, NeedleAtTheRequestedDepthExactlyOnce) {
  const std::string task = GetParam();
  const std::vector<double> depths = {0, 0.25, 0.5, 0.75, 1.0};
  for (const auto& [tok, target] :
       std::vector<std::pair<const Tokenizer*, int64_t>>{{&tok512(), 1024}, {&llama2(), 2048}}) {
    const SampleSet set = generate_task(*tok, make_spec(task, target, 1, depths));
    ASSERT_EQ(set.samples.size(), depths.size());
    for (size_t i = 0; i < depths.size(); ++i) {
      const TaskSample& s = set.samples[i];
      SCOPED_TRACE(task + " " + tok->path() + " depth " + std::to_string(depths[i]));
      ASSERT_TRUE(s.depth.has_value());
      EXPECT_EQ(*s.depth, depths[i]);
      ASSERT_FALSE(s.needle.empty());
      ASSERT_EQ(occurrences(s.context, s.needle), 1u);
      // The needle's position, measured by encoding the context before it (the space before the
      // needle belongs to the needle's first token).
      std::string before = s.context.substr(0, s.context.find(s.needle));
      while (!before.empty() && before.back() == ' ') before.pop_back();
      const int64_t offset = exact_tokens(*tok, before);
      const int64_t context = exact_tokens(*tok, s.context);
      const int64_t needle = exact_tokens(*tok, s.needle);
      EXPECT_EQ(s.needle_token_offset, offset);
      EXPECT_EQ(s.needle_tokens, needle);
      const double want = depths[i] * static_cast<double>(context - needle);
      EXPECT_LE(std::fabs(static_cast<double>(offset) - want), 0.01 * static_cast<double>(context))
          << "offset " << offset << " want " << want << " of " << context;
      if (depths[i] == 0.0) {
        EXPECT_EQ(offset, 0);
      }
      // Each answer once (passkey: its key is written twice, both inside the needle).
      for (const auto& a : s.answers)
        EXPECT_EQ(occurrences(s.context, a), task == "passkey" ? 2u : 1u) << a;
      check_sample(*tok, s, target, "depth sample");
    }
    // A depth sweep moves one needle through one haystack: sample s has the same answers (and
    // the same needles) at every depth.
    for (const auto& s : set.samples) EXPECT_EQ(s.answers, set.samples[0].answers);
  }
}

INSTANTIATE_TEST_SUITE_P(RulerNeedleTasks, TaskDepth, ::testing::ValuesIn(kNeedleTasks),
                         [](const auto& info) { return info.param; });

TEST(RulerTasks, RandomDepthsComeFromRulersGrid) {
  const SampleSet set = generate_task(tok512(), make_spec("niah_single_1", 512, 6));
  std::set<double> seen;
  for (const auto& s : set.samples) {
    ASSERT_TRUE(s.depth.has_value());
    const double pct = *s.depth * 100;
    EXPECT_EQ(pct, std::round(pct));
    bool on_grid = false;
    for (int i = 0; i < 40; ++i) on_grid = on_grid || std::round(100.0 * i / 39) == std::round(pct);
    EXPECT_TRUE(on_grid) << *s.depth;
    seen.insert(*s.depth);
  }
  EXPECT_GT(seen.size(), 1u);
  // Samples differ from each other (their own seeds).
  EXPECT_NE(set.samples[0].answers, set.samples[1].answers);
  EXPECT_NE(set.samples[0].seed, set.samples[1].seed);
}

// ---- task specifics ----

TEST(RulerTasks, PromptsFollowRulersTemplates) {
  const TaskSample s1 = generate_task(llama2(), make_spec("niah_single_1", 1024)).samples[0];
  EXPECT_EQ(s1.preamble.rfind("A special magic number is hidden within the following text.", 0),
            0u);
  EXPECT_EQ(s1.question.rfind("What is the special magic number for ", 0), 0u);
  EXPECT_NE(s1.answer_prefix.find("mentioned in the provided text is"), std::string::npos);
  EXPECT_EQ(s1.needle, "One of the special magic numbers for " +
                           s1.question.substr(37, s1.question.find(" mentioned") - 37) +
                           " is: " + s1.answers[0] + ".");
  EXPECT_EQ(s1.context.rfind("The grass is green.", 0) == 0 || s1.context.rfind("One of", 0) == 0,
            true);
  EXPECT_EQ(s1.answers[0].size(), 7u);

  const TaskSample s3 = generate_task(llama2(), make_spec("niah_single_3", 1024)).samples[0];
  EXPECT_EQ(s3.answers[0].size(), 36u);  // a UUID
  EXPECT_EQ(s3.answers[0][14], '4');     // version 4
  EXPECT_NE(std::string("89ab").find(s3.answers[0][19]), std::string::npos);

  const TaskSample mv = generate_task(llama2(), make_spec("niah_multivalue", 1024)).samples[0];
  EXPECT_EQ(mv.answers.size(), 4u);
  EXPECT_EQ(mv.preamble.rfind("Some special magic numbers are hidden", 0), 0u);
  EXPECT_EQ(mv.question.rfind("What are all the special magic numbers for ", 0), 0u);

  const TaskSample mq = generate_task(llama2(), make_spec("niah_multiquery", 1024)).samples[0];
  EXPECT_EQ(mq.answers.size(), 4u);
  EXPECT_EQ(std::count(mq.question.begin(), mq.question.end(), ','), 3);
  EXPECT_NE(mq.question.find(", and "), std::string::npos);

  // multikey_3: UUID keys and values; the haystack is needles with other UUID keys.
  const TaskSample mk3 = generate_task(llama2(), make_spec("niah_multikey_3", 2048)).samples[0];
  EXPECT_GT(occurrences(mk3.context, "One of the special magic uuids for "), 5u);
  EXPECT_EQ(occurrences(mk3.context, mk3.needle), 1u);

  const TaskSample pk = generate_task(llama2(), make_spec("passkey", 1024)).samples[0];
  EXPECT_EQ(pk.needle, "The pass key is " + pk.answers[0] + ". Remember it. " + pk.answers[0] +
                           " is the pass key.");
  EXPECT_EQ(pk.answers[0].size(), 5u);
  EXPECT_EQ(pk.question + pk.answer_prefix, "What is the pass key? The pass key is");
  EXPECT_EQ(
      pk.preamble.rfind("There is an important info hidden inside a lot of irrelevant text.", 0),
      0u);
}

TEST(RulerTasks, VariableTrackingChains) {
  const TaskSample s = generate_task(llama2(), make_spec("vt", 2048)).samples[0];
  ASSERT_EQ(s.answers.size(), 5u);  // 4 hops: 5 variables
  const std::string value = s.question.substr(s.question.find("the value ") + 10, 5);
  EXPECT_NE(s.context.find("VAR " + s.answers[0] + " = " + value + "\n"), std::string::npos);
  for (size_t h = 1; h < s.answers.size(); ++h)
    EXPECT_NE(s.context.find("VAR " + s.answers[h] + " = VAR " + s.answers[h - 1]),
              std::string::npos);
  // The chain is in order: each assignment after the one it copies.
  for (size_t h = 1; h < s.answers.size(); ++h)
    EXPECT_LT(s.context.find("VAR " + s.answers[h - 1] + " ="),
              s.context.find("VAR " + s.answers[h] + " ="));
  EXPECT_NE(s.answer_prefix.find("5 variables are assgined the value " + value), std::string::npos);
  // The few-shot example sits before the instructions (2048 / 8 = 256 tokens affords one).
  EXPECT_EQ(occurrences(s.preamble, "Memorize and track the chain(s)"), 2u);
}

TEST(RulerTasks, CommonWordsFrequencies) {
  const SampleSet set = generate_task(llama2(), make_spec("cwe", 4096));
  const TaskSample& s = set.samples[0];
  check_sample(llama2(), s, 4096, "cwe 4096");
  // RULER's settings from 4096 tokens on: 10 words x 30, the others x 3, with a one-shot example.
  EXPECT_EQ(set.effective_params.at("freq_cw"), 30);
  EXPECT_EQ(set.effective_params.at("freq_ucw"), 3);
  EXPECT_EQ(set.effective_params.at("few_shot"), true);
  std::map<std::string, int> counts;
  std::istringstream in(s.context);
  std::string tok;
  while (in >> tok)
    if (tok.back() != '.') ++counts[tok];
  ASSERT_EQ(s.answers.size(), 10u);
  for (const auto& a : s.answers) EXPECT_EQ(counts[a], 30) << a;
  int others = 0;
  for (const auto& [w, c] : counts)
    if (std::find(s.answers.begin(), s.answers.end(), w) == s.answers.end()) {
      EXPECT_EQ(c, 3) << w;
      ++others;
    }
  EXPECT_GT(others, 10);
  // A short target with a small vocabulary tokenizer scales the settings down to fit.
  const SampleSet small = generate_task(tok512(), make_spec("cwe", 512));
  EXPECT_EQ(small.effective_params.at("few_shot"), false);
  EXPECT_LT(small.effective_params.at("freq_cw").get<int>(), 6);
}

TEST(RulerTasks, FrequentWordsZipf) {
  const TaskSample s = generate_task(tok512(), make_spec("fwe", 2048)).samples[0];
  std::map<std::string, int> counts;
  std::istringstream in(s.context);
  std::string w;
  while (in >> w) ++counts[w];
  ASSERT_EQ(s.answers.size(), 3u);
  // "..." is the most frequent (noise, to be ignored), then the three answers in order, then the
  // rest.
  int rest_max = 0;
  for (const auto& [word, c] : counts)
    if (word != "..." && std::find(s.answers.begin(), s.answers.end(), word) == s.answers.end())
      rest_max = std::max(rest_max, c);
  EXPECT_GT(counts["..."], counts[s.answers[0]]);
  EXPECT_GT(counts[s.answers[0]], counts[s.answers[1]]);
  EXPECT_GT(counts[s.answers[1]], counts[s.answers[2]]);
  EXPECT_GT(counts[s.answers[2]], rest_max);
  for (const auto& a : s.answers) EXPECT_EQ(a.size(), 6u);
}

TEST(RulerTasks, CopyAsksForTheWholeListInOrder) {
  const TaskSample s = generate_task(llama2(), make_spec("copy", 512)).samples[0];
  ASSERT_EQ(s.answers.size(), 1u);
  std::istringstream in(s.answers[0]);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  // The list fills the context (less the instruction), no word twice in a row, and ends with a
  // full stop (then dots that pad the length).
  EXPECT_GT(words.size(), 100u);
  for (size_t i = 1; i < words.size(); ++i) EXPECT_NE(words[i], words[i - 1]) << i;
  EXPECT_EQ(s.context.rfind(s.answers[0] + ".", 0), 0u);
  // Room for the whole answer.
  EXPECT_GE(s.max_new_tokens, exact_tokens(llama2(), " " + s.answers[0]));
  EXPECT_DOUBLE_EQ(ordered_word_recall(s.answers[0] + ".", s.answers[0]), 1.0);
  // The flag round-trips; other tasks' samples do not carry it (their hashes stay as they were).
  EXPECT_TRUE(sample_from_json(sample_to_json(s), "copy").multiline_answer);
  const TaskSample pk = generate_task(llama2(), make_spec("passkey", 512)).samples[0];
  EXPECT_FALSE(sample_to_json(pk).contains("multiline_answer"));
}

// ---- hashes, golden values, cache ----

TEST(RulerTasks, GoldenHashes) {
  // Catches any change of generated text across commits and machines (random draws go through
  // portable_random only). Regenerate only for an intended change, with kSyntheticGeneratorVersion
  // bumped.
  TaskSpec spec = make_spec("niah_single_1", 512, 2);
  const SampleSet a = generate_task(tok512(), spec);
  EXPECT_EQ(a.content_hash, "74f5b6d4d0e1ed0d5023320dc81b0274c2ebcf014fbebefb2e2f7f006473c24a");
  EXPECT_EQ(a.hash, "bca7e2640b4a5a7655aa168fc453a8878bb67b82b5d47523d6e97115fce8aa18");
  const SampleSet b = generate_task(llama2(), make_spec("niah_single_2", 1024, 1, {0.5}));
  EXPECT_EQ(b.content_hash, "51cb60112f2475c9b5846b1d85ed5435062581d017e0ea3b8c4061bee2570d21");
}

TEST(RulerTasks, HashCoversSpecTokenizerAndCorpus) {
  const TaskSpec base = make_spec("niah_single_2", 512);
  const std::string h = task_set_hash(tok512(), base);
  EXPECT_EQ(h, generate_task(tok512(), base).hash);
  EXPECT_NE(h, task_set_hash(llama2(), base));
  TaskSpec other = base;
  other.seed = 7;
  EXPECT_NE(h, task_set_hash(tok512(), other));
  other = base;
  other.target_tokens = 513;
  EXPECT_NE(h, task_set_hash(tok512(), other));
  other = base;
  other.corpus = "tinyshakespeare";
  EXPECT_NE(h, task_set_hash(tok512(), other));
  other = base;
  other.params = {{"num_keys", 2}};
  EXPECT_NE(h, task_set_hash(tok512(), other));
  // Defaults spelled out, an alias, and the data directory do not change it.
  other = base;
  other.params = {{"haystack", "essay"}, {"num_keys", 1}, {"value_type", "numbers"}};
  other.data_dir = ptest::data_dir() + "/";
  EXPECT_EQ(h, task_set_hash(tok512(), other));
  // A corpus is irrelevant to a task without one, and is dropped.
  TaskSpec noise = make_spec("niah_single_1", 512);
  TaskSpec noise2 = noise;
  noise2.corpus = "tinyshakespeare";
  EXPECT_EQ(task_set_hash(tok512(), noise), task_set_hash(tok512(), noise2));
  EXPECT_EQ(resolve_task_spec(noise2).corpus, "");
}

TEST(RulerTasks, CacheStoresAndLoads) {
  const std::string dir = ptest::scratch_dir("taskcache") + "/nested/cache";
  const TaskSpec spec = make_spec("passkey", 512, 2, {0.3});
  const SampleSet first = generate_task_cached(tok512(), spec, dir);
  const std::string path = dir + "/" + first.hash + ".json";
  ASSERT_TRUE(file_exists(path));
  EXPECT_EQ(sample_set_to_json(first).dump(),
            sample_set_to_json(generate_task(tok512(), spec)).dump());

  // The second call loads the file: an edit that the hashes do not cover shows through.
  json j = json::parse(read_text_file(path));
  j["effective_params"]["marker"] = "from cache";
  ptest::write_bytes(dir, first.hash + ".json", j.dump());
  const SampleSet second = generate_task_cached(tok512(), spec, dir);
  EXPECT_EQ(second.effective_params.value("marker", ""), "from cache");
  EXPECT_EQ(second.content_hash, first.content_hash);
  ASSERT_EQ(second.samples.size(), 2u);
  EXPECT_EQ(second.samples[1].prompt(), first.samples[1].prompt());

  // A tampered sample (its hash no longer matches) or a truncated file is regenerated.
  j["samples"][0]["context"] = "tampered";
  ptest::write_bytes(dir, first.hash + ".json", j.dump());
  EXPECT_EQ(generate_task_cached(tok512(), spec, dir).samples[0].context, first.samples[0].context);
  ptest::write_bytes(dir, first.hash + ".json", "{\"format\": \"kvbench-synth");
  EXPECT_EQ(generate_task_cached(tok512(), spec, dir).content_hash, first.content_hash);
  EXPECT_EQ(json::parse(read_text_file(path)).at("content_hash"), first.content_hash);
}

TEST(RulerTasks, JsonRoundTrip) {
  const SampleSet set = generate_task(tok512(), make_spec("vt", 1024, 2));
  const json j = sample_set_to_json(set);
  const SampleSet back = sample_set_from_json(j, "test");
  EXPECT_EQ(sample_set_to_json(back).dump(), j.dump());
  EXPECT_EQ(back.samples[1].prompt(), set.samples[1].prompt());
  EXPECT_FALSE(back.samples[0].depth.has_value());
  json bad = j;
  bad["samples"][0].erase("answers");
  expect_kvb_error([&] { sample_set_from_json(bad, "cache.json"); },
                   {"cache.json sample 0", "missing field 'answers'"});
}

// ---- spec parsing and errors ----

TEST(RulerTasks, SpecFromJson) {
  TaskSpec s = task_spec_from_json(json::parse(
      R"({"task": "niah_single_2", "target_tokens": 2048, "num_samples": 3, "seed": 7,
          "depth": "sweep", "corpus": "wikitext-2", "params": {"num_keys": 2}})"));
  EXPECT_EQ(s.task, "niah_single_2");
  EXPECT_EQ(s.target_tokens, 2048);
  EXPECT_EQ(s.num_samples, 3);
  EXPECT_EQ(s.seed, 7u);
  ASSERT_EQ(s.depths.size(), 11u);
  EXPECT_EQ(s.depths.front(), 0.0);
  EXPECT_EQ(s.depths[5], 0.5);
  EXPECT_EQ(s.depths.back(), 1.0);
  EXPECT_EQ(s.corpus, "wikitext-2");
  EXPECT_EQ(s.params.at("num_keys"), 2);
  EXPECT_EQ(task_spec_from_json(json::parse(R"({"task": "passkey", "target_tokens": 512,
                                                "depth": 0.25})"))
                .depths,
            std::vector<double>{0.25});
  EXPECT_EQ(task_spec_from_json(json::parse(R"({"task": "passkey", "target_tokens": 512,
                                                "depth": [0, 1]})"))
                .depths,
            (std::vector<double>{0, 1}));
  expect_kvb_error(
      [] { task_spec_from_json(json::parse(R"({"task": "vt", "target_token": 512})")); },
      {"unknown key 'target_token'", "did you mean 'target_tokens'"});
  expect_kvb_error(
      [] {
        task_spec_from_json(json::parse(R"({"task": "vt", "target_tokens": 512, "depth": "all"})"));
      },
      {"'depth'", "\"sweep\"", "\"all\""});
  expect_kvb_error([] { task_spec_from_json(json::parse(R"({"task": "vt"})")); },
                   {"missing field 'target_tokens'"});
  expect_kvb_error(
      [] {
        task_spec_from_json(json::parse(R"({"task": "vt", "target_tokens": 512, "seed": -1})"));
      },
      {"'seed'", "non-negative"});
}

TEST(RulerTasks, ErrorsNameTheInput) {
  expect_kvb_error(
      [] { generate_task(tok512(), make_spec("niah_single", 512)); },
      {"unknown synthetic task 'niah_single'", "did you mean 'niah_single_1'", "passkey"});
  TaskSpec s = make_spec("niah_multikey_1", 512);
  s.params = {{"num_key", 3}};
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"task niah_multikey_1: unknown parameter 'num_key'", "did you mean 'num_keys'",
                    "known: haystack, key_type"});
  s.params = {{"haystack", "noize"}};
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"task niah_multikey_1.haystack: 'noize' is not one of noise, corpus, needles",
                    "did you mean 'noise'"});
  s.params = {{"num_keys", 0}};
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"task niah_multikey_1.num_keys: 0 is outside the allowed range [1, 100]"});
  s.params = {{"num_keys", "four"}};
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"task niah_multikey_1.num_keys: expected an integer, got \"four\""});
  s = make_spec("vt", 512);
  s.params = {{"few_shot", "sometimes"}};
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"task vt.few_shot: expected true or false or \"auto\", got \"sometimes\""});
  s = make_spec("passkey", 512);
  s.params = {{"digits", 5}, {"digitz", 3}};
  expect_kvb_error([&] { generate_task(tok512(), s); }, {"'digitz'", "did you mean 'digits'"});
  s = make_spec("cwe", 1024, 1, {0.5});
  expect_kvb_error([&] { generate_task(tok512(), s); }, {"task 'cwe'", "takes no depth"});
  s = make_spec("passkey", 1024, 1, {1.5});
  expect_kvb_error([&] { generate_task(tok512(), s); }, {"depth 1.5", "[0, 1]"});
  s = make_spec("niah_single_2", 1024);
  s.corpus = "tinyshakespear";
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"unknown corpus 'tinyshakespear'", "did you mean 'tinyshakespeare'"});
  s = make_spec("passkey", 10);
  expect_kvb_error([&] { generate_task(tok512(), s); }, {"target_tokens 10", "[64, 16777216]"});
  s = make_spec("fwe", 1024);
  s.params = {{"alpha", 1.0}};
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"task fwe.alpha: 1 is outside the allowed range (1, 10]"});
  // Too short for the task with this tokenizer: says so, with the target.
  s = make_spec("niah_multikey_3", 120);
  expect_kvb_error([&] { generate_task(tok512(), s); },
                   {"task 'niah_multikey_3'", "target_tokens 120", "minimum length"});
  s = make_spec("cwe", 128);
  expect_kvb_error([&] { generate_task(tok512(), s); }, {"task 'cwe'", "target_tokens 128"});
}

}  // namespace
}  // namespace kvb
