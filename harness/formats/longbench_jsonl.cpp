#include "harness/formats/longbench_jsonl.h"

#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/strings.h"
#include "harness/metrics/text_metrics.h"

namespace kvb {

namespace {

// One pass over a str.format template. Calls on_field(name) for every {name} and appends the
// substituted text to *out when out is non-null. Throws kvb::Error for a lone '{' or '}' (Python's
// ValueError) and whatever on_field throws.
template <typename OnField>
void expand_template(const std::string& t, std::string* out, OnField&& on_field) {
  size_t i = 0;
  while (i < t.size()) {
    char c = t[i];
    if ((c == '{' || c == '}') && i + 1 < t.size() && t[i + 1] == c) {
      if (out) *out += c;
      i += 2;
      continue;
    }
    KVB_CHECK(c != '}', "single '}' at offset ", i, " (write '}}' for a literal brace)");
    if (c == '{') {
      size_t close = t.find_first_of("{}", i + 1);
      KVB_CHECK(close != std::string::npos && t[close] == '}', "unclosed '{' at offset ", i,
                " (write '{{' for a literal brace)");
      std::string name = t.substr(i + 1, close - i - 1);
      const std::string& value = on_field(name);
      if (out) *out += value;
      i = close + 1;
      continue;
    }
    if (out) *out += c;
    ++i;
  }
}

const std::vector<std::string>& template_fields() {
  static const std::vector<std::string> kFields = {"context", "input"};
  return kFields;
}

// Validates a task's prompt template; returns nothing, throws kvb::Error without location.
void check_template(const std::string& prompt) {
  bool has_context = false;
  static const std::string kEmpty;
  expand_template(prompt, nullptr, [&](const std::string& name) -> const std::string& {
    KVB_CHECK(name == "context" || name == "input", "placeholder '{", name, "}' is not known",
              did_you_mean(name, template_fields()), "; allowed: {context}, {input}");
    has_context = has_context || name == "context";
    return kEmpty;
  });
  KVB_CHECK(has_context, "the template has no {context} placeholder");
}

}  // namespace

LongBenchFile read_longbench_jsonl(const std::string& path, const JsonlOptions& options) {
  LongBenchFile file;
  file.stats = read_jsonl(path, options, [&](const nlohmann::json& row, size_t line) {
    LongBenchSample s;
    s.line = line;
    s.id = json_string(row, "_id");
    s.dataset = json_string(row, "dataset");
    s.context = json_string(row, "context");
    s.input = json_string(row, "input");
    s.answers = json_string_array(row, "answers");
    s.length = json_int(row, "length", 0);
    if (row.contains("language")) s.language = json_string(row, "language");
    if (row.contains("all_classes") && !row["all_classes"].is_null()) {
      s.all_classes = json_string_array(row, "all_classes");
    }
    file.samples.push_back(std::move(s));
  });
  return file;
}

std::map<std::string, LongBenchTask> load_longbench_tasks(const std::string& path) {
  std::string text = read_text_file(path);
  const nlohmann::json root = parse_json(text, path);
  KVB_CHECK(root.is_object(), path, ": expected a JSON object {task: {...}}, got ",
            root.type_name());
  static const std::vector<std::string> kKeys = {"prompt", "max_new_tokens", "metric",
                                                 "first_line_only", "stop"};
  std::map<std::string, LongBenchTask> tasks;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string where = path + ": task '" + it.key() + "'";
    try {
      const nlohmann::json& obj = it.value();
      KVB_CHECK(obj.is_object(), "expected an object, got ", obj.type_name());
      json_check_keys(obj, kKeys, "task settings");
      LongBenchTask task;
      task.name = it.key();
      task.prompt = json_string(obj, "prompt");
      try {
        check_template(task.prompt);
      } catch (const Error& e) {
        KVB_FAIL("field 'prompt': ", e.what());
      }
      task.max_new_tokens = json_int(obj, "max_new_tokens", 1);
      task.metric = json_string(obj, "metric");
      KVB_CHECK(is_text_metric(task.metric), "field 'metric': unknown metric '", task.metric, "'",
                did_you_mean(task.metric, text_metric_names()),
                "; known: ", join(text_metric_names(), ", ").c_str());
      if (obj.contains("first_line_only")) task.first_line_only = json_bool(obj, "first_line_only");
      if (obj.contains("stop")) {
        task.stop = json_string_array(obj, "stop");
        for (const auto& s : task.stop) KVB_CHECK(!s.empty(), "field 'stop': an empty stop string would end every answer at once");
      }
      tasks.emplace(task.name, std::move(task));
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
  return tasks;
}

std::string format_longbench_prompt(const std::string& prompt_template, const std::string& context,
                                    const std::string& input) {
  std::string out;
  out.reserve(prompt_template.size() + context.size() + input.size());
  expand_template(prompt_template, &out, [&](const std::string& name) -> const std::string& {
    if (name == "context") return context;
    if (name == "input") return input;
    KVB_FAIL("prompt template: placeholder '{", name, "}' is not known",
             did_you_mean(name, template_fields()));
  });
  return out;
}

std::string format_longbench_prompt(const LongBenchTask& task, const LongBenchSample& sample) {
  return format_longbench_prompt(task.prompt, sample.context, sample.input);
}

template <typename T>
std::vector<T> truncate_middle(const std::vector<T>& ids, size_t max_length) {
  KVB_CHECK(max_length >= 2, "middle truncation: max_length ", max_length, " must be at least 2");
  if (ids.size() <= max_length) return ids;
  const size_t half = max_length / 2;
  std::vector<T> out;
  out.reserve(2 * half);
  out.insert(out.end(), ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(half));
  out.insert(out.end(), ids.end() - static_cast<std::ptrdiff_t>(half), ids.end());
  return out;
}

template std::vector<int32_t> truncate_middle(const std::vector<int32_t>&, size_t);
template std::vector<int64_t> truncate_middle(const std::vector<int64_t>&, size_t);

}  // namespace kvb
