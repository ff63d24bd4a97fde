// LongBench JSONL reader, task settings and middle truncation, on small fixture files made here.

#include <gtest/gtest.h>

#include <numeric>

#include "harness/formats/longbench_jsonl.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

using test::expect_error;
using test::make_scratch_dir;
using test::write_file;

const char* kRow1 =
    R"({"input": "Who?", "context": "Alice met Bob.", "answers": ["Alice", "Bob"], "length": 3, )"
    R"("dataset": "narrativeqa", "language": "en", "all_classes": null, "_id": "id-1"})";
const char* kRow2 =
    R"({"input": "Type?", "context": "ctx", "answers": ["Human"], "length": 1, "dataset": "trec", )"
    R"("all_classes": ["Human", "Location"], "_id": "id-2", "extra": 1})";

TEST(LongBenchJsonl, ReadsRowsAndSkipsBlankLines) {
  std::string dir = make_scratch_dir("lb");
  std::string path = write_file(dir, "ok.jsonl", std::string(kRow1) + "\n\n   \n" + kRow2 + "\r\n");
  LongBenchFile f = read_longbench_jsonl(path);
  ASSERT_EQ(f.samples.size(), 2u);
  EXPECT_EQ(f.stats.lines, 4u);
  EXPECT_EQ(f.stats.blank_lines, 2u);
  EXPECT_EQ(f.stats.bad_lines, 0u);
  const LongBenchSample& a = f.samples[0];
  EXPECT_EQ(a.id, "id-1");
  EXPECT_EQ(a.dataset, "narrativeqa");
  EXPECT_EQ(a.context, "Alice met Bob.");
  EXPECT_EQ(a.input, "Who?");
  EXPECT_EQ(a.answers, (std::vector<std::string>{"Alice", "Bob"}));
  EXPECT_EQ(a.length, 3);
  EXPECT_EQ(a.language, "en");
  EXPECT_FALSE(a.all_classes.has_value());
  EXPECT_EQ(a.line, 1u);
  const LongBenchSample& b = f.samples[1];
  ASSERT_TRUE(b.all_classes.has_value());
  EXPECT_EQ(*b.all_classes, (std::vector<std::string>{"Human", "Location"}));
  EXPECT_EQ(b.language, "");
  EXPECT_EQ(b.line, 4u);  // CRLF line parsed, line numbers count blank lines
}

TEST(LongBenchJsonl, StrictErrorsNameFileLineAndField) {
  std::string dir = make_scratch_dir("lb");
  struct Case {
    std::string line;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {R"({"input": "q", "context": "c", "length": 1, "dataset": "d", "_id": "x"})",
       {"missing field 'answers'"}},
      {R"({"input": "q", "context": "c", "answers": "a", "length": 1, "dataset": "d", "_id": "x"})",
       {"field 'answers'", "array of strings"}},
      {R"({"input": "q", "context": "c", "answers": ["a", 5], "length": 1, "dataset": "d", "_id": "x"})",
       {"field 'answers'", "element 1"}},
      {R"({"input": "q", "context": "c", "answers": [], "length": "9", "dataset": "d", "_id": "x"})",
       {"field 'length'", "integer"}},
      {R"({"input": "q", "context": "c", "answers": [], "length": -1, "dataset": "d", "_id": "x"})",
       {"field 'length'", "outside"}},
      {R"({"input": "q", "context": 7, "answers": [], "length": 1, "dataset": "d", "_id": "x"})",
       {"field 'context'", "expected a string"}},
      {R"({"input": "q", "context": "c", "answers": [], "length": 1, "dataset": "d", "_id": "x", )"
       R"("all_classes": "A"})",
       {"field 'all_classes'"}},
      {R"({"input": "q", "context": "c", "answers": [], "length": 1.5, "dataset": "d", "_id": "x"})",
       {"field 'length'"}},
      {R"({"input": "q", "context": "c",)", {"not valid JSON"}},
      {R"(["not", "an", "object"])", {"expected a JSON object"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string path = write_file(dir, "bad" + std::to_string(i) + ".jsonl",
                                  std::string(kRow1) + "\n" + cases[i].line + "\n");
    std::vector<std::string> parts = cases[i].expect;
    try {
      read_longbench_jsonl(path);
      ADD_FAILURE() << "case " << i << " did not throw";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path + ":2: "), std::string::npos) << msg;
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " / " << p;
    }
  }
  expect_error([&] { read_longbench_jsonl(dir + "/missing.jsonl"); },
               {"missing.jsonl", "cannot open"});
}

TEST(LongBenchJsonl, SkipBadLinesCountsThem) {
  std::string dir = make_scratch_dir("lb");
  std::string path =
      write_file(dir, "mixed.jsonl",
                 std::string(kRow1) + "\n{broken\n" + kRow2 + "\n" + R"({"input": 1})" + "\n");
  JsonlOptions opts;
  opts.skip_bad_lines = true;
  LongBenchFile f = read_longbench_jsonl(path, opts);
  ASSERT_EQ(f.samples.size(), 2u);
  EXPECT_EQ(f.samples[1].id, "id-2");
  EXPECT_EQ(f.stats.bad_lines, 2u);
  EXPECT_EQ(f.stats.records, 2u);
  ASSERT_EQ(f.stats.bad_line_errors.size(), 2u);
  EXPECT_NE(f.stats.bad_line_errors[0].find(path + ":2: record: not valid JSON"), std::string::npos);
  EXPECT_NE(f.stats.bad_line_errors[1].find(path + ":4: "), std::string::npos);
  // Without the option the first bad line throws.
  expect_error([&] { read_longbench_jsonl(path); }, {path + ":2:"});
}

TEST(LongBenchTasks, LoadsAndValidates) {
  std::string dir = make_scratch_dir("lbtask");
  std::string path = write_file(dir, "tasks.json", R"({
    "narrativeqa": {"prompt": "Story: {context}\nQ: {input}\nA:", "max_new_tokens": 128,
                    "metric": "qa_f1"},
    "trec": {"prompt": "{context}\n{input} {{braces}}", "max_new_tokens": 64,
             "metric": "classification", "first_line_only": true, "stop": ["\n\n", "Question:"]},
    "lcc": {"prompt": "Complete the code:\n{context}Next line of code:\n", "max_new_tokens": 64,
            "metric": "code_sim"}
  })");
  auto tasks = load_longbench_tasks(path);
  ASSERT_EQ(tasks.size(), 3u);
  const LongBenchTask& nqa = tasks.at("narrativeqa");
  EXPECT_EQ(nqa.name, "narrativeqa");
  EXPECT_EQ(nqa.max_new_tokens, 128);
  EXPECT_EQ(nqa.metric, "qa_f1");
  EXPECT_FALSE(nqa.first_line_only);
  EXPECT_TRUE(tasks.at("trec").first_line_only);
  EXPECT_TRUE(nqa.stop.empty());
  EXPECT_EQ(tasks.at("trec").stop, (std::vector<std::string>{"\n\n", "Question:"}));

  LongBenchSample s;
  s.context = "Once {upon} a time.";  // braces in the substituted text stay as they are
  s.input = "Who?";
  EXPECT_EQ(format_longbench_prompt(nqa, s), "Story: Once {upon} a time.\nQ: Who?\nA:");
  EXPECT_EQ(format_longbench_prompt(tasks.at("trec"), s), "Once {upon} a time.\nWho? {braces}");
  EXPECT_EQ(format_longbench_prompt(tasks.at("lcc"), s),
            "Complete the code:\nOnce {upon} a time.Next line of code:\n");
}

TEST(LongBenchTasks, ErrorsNameTaskAndField) {
  std::string dir = make_scratch_dir("lbtask");
  auto load = [&](const std::string& body) {
    std::string path = write_file(dir, "t.json", body);
    return [path] { load_longbench_tasks(path); };
  };
  expect_error(load(R"({"qa": {"prompt": "{context}", "max_new_tokens": 8, "metric": "qa_f2"}})"),
               {"t.json", "task 'qa'", "field 'metric'", "did you mean 'qa_f1'"});
  expect_error(load(R"({"qa": {"prompt": "{input}", "max_new_tokens": 8, "metric": "qa_f1"}})"),
               {"task 'qa'", "field 'prompt'", "no {context}"});
  expect_error(load(R"({"qa": {"prompt": "{context} {question}", "max_new_tokens": 8,)"
                    R"( "metric": "qa_f1"}})"),
               {"field 'prompt'", "{question}"});
  expect_error(load(R"({"qa": {"prompt": "{context} {inpt}", "max_new_tokens": 8,)"
                    R"( "metric": "qa_f1"}})"),
               {"did you mean 'input'"});
  expect_error(load(R"({"qa": {"prompt": "{context} }", "max_new_tokens": 8, "metric": "qa_f1"}})"),
               {"single '}'"});
  expect_error(load(R"({"qa": {"prompt": "{context", "max_new_tokens": 8, "metric": "qa_f1"}})"),
               {"unclosed '{'"});
  expect_error(load(R"({"qa": {"prompt": "{context}", "max_new_token": 8, "metric": "qa_f1"}})"),
               {"task 'qa'", "unknown field 'max_new_token'", "did you mean 'max_new_tokens'"});
  expect_error(load(R"({"qa": {"prompt": "{context}", "max_new_tokens": 0, "metric": "qa_f1"}})"),
               {"field 'max_new_tokens'"});
  expect_error(load(R"({"qa": {"prompt": "{context}", "metric": "qa_f1"}})"),
               {"missing field 'max_new_tokens'"});
  expect_error(load(R"({"qa": {"prompt": "{context}", "max_new_tokens": 8, "metric": "qa_f1",)"
                    R"( "first_line_only": 1}})"),
               {"field 'first_line_only'"});
  expect_error(load(R"({"qa": {"prompt": "{context}", "max_new_tokens": 8, "metric": "qa_f1",)"
                    R"( "stop": "\n"}})"),
               {"task 'qa'", "field 'stop'"});
  expect_error(load(R"({"qa": {"prompt": "{context}", "max_new_tokens": 8, "metric": "qa_f1",)"
                    R"( "stop": ["x", ""]}})"),
               {"task 'qa'", "field 'stop'", "empty stop string"});
  expect_error(load(R"({"qa": 3})"), {"task 'qa'", "expected an object"});
  expect_error(load(R"([1, 2])"), {"expected a JSON object"});
  expect_error(load(R"({"qa": )"), {"t.json", "not valid JSON"});
}

TEST(LongBenchTruncation, KeepsBothEnds) {
  std::vector<int32_t> ids(10);
  std::iota(ids.begin(), ids.end(), 0);
  EXPECT_EQ(truncate_middle(ids, 6), (std::vector<int32_t>{0, 1, 2, 7, 8, 9}));
  // Odd limit: half = 3 at each end, 6 tokens, exactly as LongBench's pred.py.
  EXPECT_EQ(truncate_middle(ids, 7), (std::vector<int32_t>{0, 1, 2, 7, 8, 9}));
  EXPECT_EQ(truncate_middle(ids, 10), ids);
  EXPECT_EQ(truncate_middle(ids, 100), ids);
  EXPECT_EQ(truncate_middle(ids, 2), (std::vector<int32_t>{0, 9}));
  std::vector<int64_t> big = {5, 6, 7, 8, 9};
  EXPECT_EQ(truncate_middle(big, 4), (std::vector<int64_t>{5, 6, 8, 9}));
  expect_error([&] { truncate_middle(ids, 1); }, {"max_length 1"});
}

}  // namespace
}  // namespace kvb
