#pragma once
// LongBench v1 data (THUDM/LongBench `data/<task>.jsonl`) and its per-task settings: prompt
// template, answer length and metric (the reference keeps them in config/dataset2prompt.json,
// dataset2maxlen.json and eval.py's dataset2metric; kvbench keeps the three in one JSON file).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/formats/jsonl.h"

namespace kvb {

struct LongBenchSample {
  std::string id;       // "_id"
  std::string dataset;  // e.g. "narrativeqa"
  std::string context;
  std::string input;  // the question or instruction
  std::vector<std::string> answers;
  int64_t length = 0;    // the reference's length (words, or characters for the Chinese sets)
  std::string language;  // "language" when present (optional: not every re-hosted copy has it)
  // null (or absent) for non-classification tasks; a list of class names for trec, lsht, ...
  std::optional<std::vector<std::string>> all_classes;
  size_t line = 0;  // 1-based line in the file, for messages
};

struct LongBenchFile {
  std::vector<LongBenchSample> samples;
  JsonlStats stats;  // lines, blank lines, and the bad lines skipped under skip_bad_lines
};

// Reads a LongBench JSONL file. Required: context, input, dataset, _id (strings), answers (array of
// strings), length (integer >= 0). Optional: all_classes (array of strings or null), language
// (string). Other fields are ignored. Errors throw kvb::Error "FILE:LINE: field 'x': ..." unless
// options.skip_bad_lines, which skips and counts them.
LongBenchFile read_longbench_jsonl(const std::string& path, const JsonlOptions& options = {});

struct LongBenchTask {
  std::string name;
  // Python str.format template: "{context}" and "{input}" are substituted, "{{" / "}}" are literal
  // braces; any other {field} is rejected when the config is loaded.
  std::string prompt;
  int64_t max_new_tokens = 0;
  std::string metric;  // a name from text_metric_names()
  // LongBench eval.py scores only the first line of the answer for trec, triviaqa, samsum and lsht.
  bool first_line_only = false;
  // Strings that end the answer (it is cut before the first one), e.g. "\n\n" or "Question:"; with
  // first_line_only, "\n" is one more.
  std::vector<std::string> stop;
};

// Loads {"task": {"prompt": str, "max_new_tokens": int > 0, "metric": str, "first_line_only": bool
// (optional, default false), "stop": [non-empty str, ...] (optional, default none)}, ...}. The prompt must contain "{context}" ("{input}" is optional:
// LongBench's lcc and passage_count prompts have none). Unknown fields and unknown metrics throw
// kvb::Error naming the file, task and field, with a nearest-name hint.
std::map<std::string, LongBenchTask> load_longbench_tasks(const std::string& path);

// The prompt for one sample: the template with {context} and {input} substituted.
std::string format_longbench_prompt(const LongBenchTask& task, const LongBenchSample& sample);
std::string format_longbench_prompt(const std::string& prompt_template, const std::string& context,
                                    const std::string& input);

// LongBench pred.py's middle truncation: a prompt longer than max_length tokens keeps its first
// half = max_length / 2 (floor) tokens and its last half tokens, dropping the middle, so the
// instructions at both ends survive. Like the reference, an odd max_length yields max_length - 1
// tokens. max_length < 2 throws kvb::Error (the reference's slice [-0:] would keep everything).
template <typename T>
std::vector<T> truncate_middle(const std::vector<T>& ids, size_t max_length);

// Defined in the .cpp; instantiated for int32_t and int64_t token ids.
extern template std::vector<int32_t> truncate_middle(const std::vector<int32_t>&, size_t);
extern template std::vector<int64_t> truncate_middle(const std::vector<int64_t>&, size_t);

}  // namespace kvb
