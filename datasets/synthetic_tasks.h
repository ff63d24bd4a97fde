#pragma once
// RULER-style synthetic long-context tasks and passkey retrieval, generated deterministically for a
// given tokenizer, target length, seed and task parameters. Torch-free.
//
// Tasks (synthetic_task_names()), with RULER's presets (NVIDIA/RULER scripts/synthetic.yaml):
//   niah_single_1    noise haystack, word key, 7-digit number value
//   niah_single_2    corpus haystack, word key, number value
//   niah_single_3    corpus haystack, word key, UUID value
//   niah_multikey_1  corpus haystack, 4 keys (3 distractor needles), number values
//   niah_multikey_2  haystack made of distractor needles (word keys, number values)
//   niah_multikey_3  haystack made of distractor needles (UUID keys, UUID values)
//   niah_multivalue  corpus haystack, one key with 4 values, all asked for
//   niah_multiquery  corpus haystack, 4 keys, all asked for
//   vt               variable tracking: 1 chain of 4 hops "VAR X = VAR Y" in noise
//   cwe              common words extraction: a numbered word list, 10 frequent words
//   fwe              frequent words extraction: Zipf(alpha = 2) coded words, top 3
//   passkey          "The pass key is 71432. Remember it. 71432 is the pass key." in noise
//                    (the Landmark Attention / LongLoRA prompt)
//   copy             kvbench's own long-answer task: a list of nouns filling the context, to be
//                    repeated in order (answer ~ as long as the context; ordered_word_recall)
// The prompt texts are RULER's (scripts/data/synthetic/constants.py and niah.py), typos included
// ("assgined"), so scores can be set beside RULER's; where kvbench differs it says so in
// synthetic_tasks.cpp, next to the code.
//
// Length: target_tokens counts the prompt as the model reads it, BOS included:
// actual_tokens = 1 + tokenizer.encode(prompt()).size(), and |actual - target| <= 1% of target
// (generation fails with kvb::Error otherwise, e.g. below a task's minimum length). RULER instead
// budgets prompt + tokens_to_generate <= max_seq_length; subtract max_new_tokens from the target to
// get RULER's convention. The haystack is sized by binary search over its number of words (or
// needles) with exact token counts.
//
// Depth (needle tasks): the fraction of the context's tokens (the haystack, other needles
// included, the target needle excluded) that come before the target needle:
//   |needle_token_offset - depth * (context_tokens - needle_tokens)| <= 1% of context_tokens.
// Depth 0 puts the needle first in the context, 1 last. Needles go between words (between
// sentences where that costs at most 0.5%), so the bound needs a context of a few hundred tokens:
// below ~300 context tokens (targets under ~512 with tok512) a word or another needle can be
// wider than 1%; the measured offset is recorded either way.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/common/params.h"

namespace kvb {

class Tokenizer;

// Part of every set hash: bump it whenever a change alters generated text.
inline constexpr const char* kSyntheticGeneratorVersion = "kvb-synthetic-1";
// The haystack corpus of the corpus-based tasks when TaskSpec::corpus is empty: long-form adult
// prose like RULER's Paul Graham essays, the largest vocabulary (cwe) and room for 1M tokens.
inline constexpr const char* kDefaultTaskCorpus = "gutenberg-long";

const std::vector<std::string>& synthetic_task_names();
// The parameters a task accepts in TaskSpec::params (names; whole schemas with the task's preset
// as defaults). Unknown task: kvb::Error with a hint.
std::vector<std::string> task_param_names(const std::string& task);
std::vector<ParamSpec> task_param_specs(const std::string& task);

struct TaskSpec {
  std::string task;
  int64_t target_tokens = 0;  // prompt length in tokens, BOS included; >= 64
  int64_t num_samples = 1;    // per depth
  uint64_t seed = 42;
  // Needle depths in [0, 1] (needle tasks only). Empty: each sample draws its depth from RULER's
  // grid round(linspace(0, 100, 40)) / 100. With depths, every depth gets num_samples samples, and
  // sample s has the same needles and haystack at every depth (only the position moves).
  std::vector<double> depths;
  // Haystack corpus (name or .txt path) of the tasks that use one (haystack "corpus", and cwe's
  // word list); "" means kDefaultTaskCorpus. Ignored (cleared) for tasks that use none.
  std::string corpus;
  // Task parameters (task_param_names): niah_*: haystack ("noise" | "corpus" | "needles"),
  // key_type / value_type ("words" | "numbers" | "uuids"), num_keys, num_values, num_queries;
  // vt: num_chains, num_hops, few_shot (true | false | "auto"); cwe: freq_cw, freq_ucw, num_cw,
  // few_shot (when none is given, RULER's settings for the length, scaled down to fit short
  // targets); fwe: alpha, vocab_size (0: target / 50, RULER's default), coded_wordlen;
  // passkey: digits.
  nlohmann::json params = nlohmann::json::object();
  std::string data_dir;  // where corpora live; "" -> resolve_data_dir(""). Not part of the hash.
};

// Parses {"task", "target_tokens", "num_samples", "seed", "depth": number | [numbers] | "sweep"
// (0, 0.1, ..., 1), "corpus", "params": {...}, "data_dir"}. Unknown keys throw kvb::Error with a
// nearest-name hint.
TaskSpec task_spec_from_json(const nlohmann::json& j);

// Validates a spec and fills in the task's defaults (RULER's preset parameters, the default
// corpus). Throws kvb::Error naming the task, key and value, with nearest-name hints; parameter
// errors are resolve_params's, owned by "task <name>" ("task vt.num_hops: 0 is outside ...").
TaskSpec resolve_task_spec(const TaskSpec& spec);

// The canonical JSON of a resolved spec, without data_dir: what the set hash covers.
nlohmann::json task_spec_to_json(const TaskSpec& resolved);

struct TaskSample {
  int64_t index = 0;
  std::string task;
  uint64_t seed = 0;  // this sample's own seed (derived from the spec seed and the sample number)

  // prompt() == preamble + context + postamble + question + answer_prefix.
  std::string preamble;       // instructions (and a few-shot example) before the context
  std::string context;        // the haystack with its needles: RULER's {context}
  std::string postamble;      // text between the context and the question ("\n")
  std::string question;       // the query
  std::string answer_prefix;  // RULER's answer prefix, after the question
  std::vector<std::string> answers;
  std::string metric;          // "string_match_all" (RULER's metric for every synthetic task)
  int64_t max_new_tokens = 0;  // RULER's tokens_to_generate for the task
  // False: the answer is its first line (a protocol stops at the first newline, as RULER's
  // single-line answers are scored); true: it may span lines (the copy task), stopped by EOS or
  // max_new_tokens only.
  bool multiline_answer = false;

  std::optional<double> depth;  // needle tasks: the requested depth of the target needle
  std::string needle;           // needle tasks: the target needle's text ("" otherwise)
  // Index of the target needle's first token in encode(context) (-1 without a needle).
  int64_t needle_token_offset = -1;
  int64_t needle_tokens = 0;   // tokens of the target needle on its own
  int64_t context_tokens = 0;  // tokens of the context on its own
  int64_t target_tokens = 0;
  int64_t actual_tokens = 0;  // 1 (BOS) + tokens of prompt()
  std::string hash;           // sha256 of the sample's canonical JSON (all fields but the hash)

  // The text a query-agnostic protocol prefills (then compresses) before the question.
  std::string context_prompt() const { return preamble + context + postamble; }
  // The text after the context: question and answer prefix.
  std::string query_prompt() const { return question + answer_prefix; }
  // The whole prompt in RULER's form: context template, question, answer prefix.
  std::string prompt() const { return context_prompt() + query_prompt(); }
};

struct SampleSet {
  TaskSpec spec;                    // resolved
  std::string tokenizer_sha256;     // tokenizer_fingerprint()
  std::string corpus_sha256;        // of the corpus text used; "" when none
  nlohmann::json effective_params;  // parameters actually used (e.g. cwe's chosen settings)
  std::string hash;          // sha256 of generator version, spec JSON, tokenizer and corpus hashes
  std::string content_hash;  // sha256 of the sample hashes in order: "same data" is checkable
  std::vector<TaskSample> samples;  // depth-major: all samples of depths[0], then depths[1], ...
};

// Generates a set. Deterministic: the same tokenizer, spec and data give byte-identical samples on
// every machine (random draws come from std::mt19937_64 through portable_random.h only).
SampleSet generate_task(const Tokenizer& tokenizer, const TaskSpec& spec);

// generate_task, stored as cache_dir/<hash>.json and loaded from there on the next call (the
// directory is created when missing). A cache file that does not parse or whose hashes do not
// match is regenerated and replaced.
SampleSet generate_task_cached(const Tokenizer& tokenizer, const TaskSpec& spec,
                               const std::string& cache_dir);

// The set hash generate_task would record, without generating (reads the corpus to hash it).
std::string task_set_hash(const Tokenizer& tokenizer, const TaskSpec& spec);

// sha256 of the tokenizer's model file; for a tokenizer built from bytes (no file), a sha256 over
// its vocabulary and special ids, prefixed "vocab:".
std::string tokenizer_fingerprint(const Tokenizer& tokenizer);

nlohmann::json sample_to_json(const TaskSample& sample);
TaskSample sample_from_json(const nlohmann::json& j, const std::string& source);
nlohmann::json sample_set_to_json(const SampleSet& set);
// Throws kvb::Error naming `source` when a field is missing or of the wrong type.
SampleSet sample_set_from_json(const nlohmann::json& j, const std::string& source);

}  // namespace kvb
