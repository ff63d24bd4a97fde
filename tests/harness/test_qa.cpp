// The qa protocol end to end on stories260K: story recall (a task it can do), query-agnostic and
// query-aware, full answers identically to the baseline, and a RULER-style run lands per-sample rows.

#include <gtest/gtest.h>

#include <fstream>

#include <filesystem>

#include "datasets/recall_task.h"
#include "harness/common/error.h"
#include "harness/eval/qa.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::metric;

nlohmann::json qa_config(const std::string& method, const std::string& protocol_extra) {
  return resolve_run_config(nlohmann::json::parse(
      "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": \"" + method +
      "\", \"protocol\": {\"name\": \"qa\", " + protocol_extra + "}}"));
}

TEST(RecallTask, SamplesAreDeterministicAndAnswersAreInTheContext) {
  std::string text =
      "Tom had a red ball. He liked to play with the ball. One day the ball went up a tree. Tom was "
      "sad. His dad got the ball down.\n\nshort one.\n\nAnna saw a big dog. The dog was very "
      "friendly. Anna gave the dog a bone. The dog wagged its tail. They became good friends. Anna "
      "went home happy.\n";
  auto a = make_recall_samples(text, 5, 2, 5, 0);
  auto b = make_recall_samples(text, 5, 2, 5, 0);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].hash, b[0].hash);
  EXPECT_EQ(a[0].questions[0].question, "Tom had a red");
  EXPECT_EQ(a[0].questions[0].answer, "ball");
  for (const auto& s : a)
    for (const auto& q : s.questions) EXPECT_NE(s.context.find(q.question + " " + q.answer), std::string::npos);
}

TEST(Qa, RecallWithFullAnswersLikeTheBaselineAndBeatsChance) {
  for (const char* mode : {"query_agnostic", "query_aware"}) {
    std::string dir = test::make_temp_dir("qa");
    ResultsDb db(dir + "/db.sqlite");
    RunEnv env;
    env.data_dir = test::data_dir();
    env.cache_dir = dir + "/cache";
    auto cfg = qa_config("paged", std::string("\"source\": \"recall\", \"num_samples\": 6, \"mode\": \"") + mode + "\"");
    RunOutcome o = execute_run(cfg, db, env);
    EXPECT_EQ(o.samples_total, 6);
    EXPECT_EQ(metric(o.metrics, "agreement_with_full"), 1.0) << mode;  // paged == full cache
    EXPECT_EQ(metric(o.metrics, "accuracy"), metric(o.metrics, "full_accuracy"));
    EXPECT_GT(metric(o.metrics, "accuracy"), 0.3) << mode << ": stories260K should copy from the story";
    EXPECT_EQ(metric(o.metrics, "questions"), 12);
    auto samples = db.samples(o.run_id);
    ASSERT_EQ(samples.size(), 6u);
    auto j = nlohmann::json::parse(samples[0].output_json);
    EXPECT_EQ(j["items"].size(), 2u);
    EXPECT_GT(j["context_tokens"].get<int64_t>(), 20);
  }
}

TEST(Qa, RulerStyleRunLandsPerSampleRows) {
  std::string dir = test::make_temp_dir("ruler");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  env.cache_dir = dir + "/cache";
  for (const char* task : {"niah_single_1", "niah_single_2", "passkey"}) {
    for (int len : {256, 384}) {  // static reserves the model's 512 positions: prompt + answer must fit
      for (const char* method : {"paged", "static"}) {
        auto cfg = qa_config(method, std::string("\"source\": \"synthetic\", \"task\": \"") + task +
                                         "\", \"length\": " + std::to_string(len) + ", \"num_samples\": 1, \"depths\": \"0.5\"");
        RunOutcome o = execute_run(cfg, db, env);
        EXPECT_EQ(o.samples_total, 1) << task;
        EXPECT_EQ(metric(o.metrics, "agreement_with_full"), 1.0) << task << " " << method;
        EXPECT_EQ(db.sample_count(o.run_id), 1);
      }
    }
  }
  EXPECT_EQ(db.list_runs().size(), 12u);
}

}  // namespace
}  // namespace kvb

namespace kvb {
namespace {

TEST(Qa, LongBenchFixtureRunsAndBadLinesNameFileAndLine) {
  std::string dir = test::make_temp_dir("lb");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const std::string fx = test::fixtures_dir() + "/longbench";
  auto make = [&](bool skip) {
    return resolve_run_config(nlohmann::json::parse(
        "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": \"paged\", \"protocol\": "
        "{\"name\": \"qa\", \"source\": \"longbench\", \"path\": \"" + fx + "/tiny.jsonl\", \"tasks\": \"" + fx +
        "/tasks.json\", \"length\": 64, \"num_samples\": 10, \"skip_bad_lines\": " + (skip ? "true" : "false") + "}}"));
  };
  try {
    execute_run(make(false), db, env);
    FAIL() << "a malformed line was accepted";
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny.jsonl:3"), std::string::npos) << e.what();
  }
  RunOutcome o = execute_run(make(true), db, env);
  EXPECT_EQ(o.samples_total, 3);  // the bad line skipped and counted
  auto j = nlohmann::json::parse(db.samples(o.run_id)[0].output_json);
  EXPECT_EQ(j["meta"]["jsonl_bad_lines_skipped"], 1);
  EXPECT_EQ(j["items"][0]["prediction"], j["items"][0]["full_prediction"]);
  // The references are stored with the sample, and survive the round trip.
  ASSERT_TRUE(j["items"][0]["answers"].is_array());
  EXPECT_FALSE(j["items"][0]["answers"].empty());
  EXPECT_EQ(QaSampleResult::from_json(j).items[0].answers,
            j["items"][0]["answers"].get<std::vector<std::string>>());
}

// A task's "stop" strings end the answer without first_line_only: each answer is the unstopped
// answer cut before the first stop string.
TEST(Qa, LongBenchTaskStopStringsCutTheAnswer) {
  std::string dir = test::make_temp_dir("lb_stop");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  const std::string fx = test::fixtures_dir() + "/longbench";
  const std::string task = R"("prompt": "Read the story and answer.\n\n{context}\n\nQuestion: {input}\nAnswer:", "max_new_tokens": 12, "metric": "qa_f1")";
  std::ofstream(dir + "/plain.json") << "{\"tinyqa\": {" << task << "}}";
  std::ofstream(dir + "/stop.json") << "{\"tinyqa\": {" << task << R"(, "stop": [" "]}})";
  auto run = [&](const std::string& tasks) {
    RunOutcome o = execute_run(resolve_run_config(nlohmann::json::parse(
        "{\"model\": \"" + test::models_dir() + "/stories260K\", \"method\": \"full\", \"protocol\": "
        "{\"name\": \"qa\", \"source\": \"longbench\", \"path\": \"" + fx + "/tiny.jsonl\", \"tasks\": \"" + tasks +
        "\", \"length\": 0, \"num_samples\": 2, \"skip_bad_lines\": true}}")), db, env);
    std::vector<std::string> predictions;
    for (const auto& s : db.samples(o.run_id))
      predictions.push_back(nlohmann::json::parse(s.output_json)["items"][0]["prediction"]);
    return predictions;
  };
  const auto plain = run(dir + "/plain.json");
  const auto stopped = run(dir + "/stop.json");
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(stopped.size(), 2u);
  bool any_cut = false;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(stopped[i], plain[i].substr(0, plain[i].find(' '))) << plain[i];
    any_cut = any_cut || stopped[i] != plain[i];
  }
  EXPECT_TRUE(any_cut) << "no unstopped answer held a space: the test proves nothing";
}

}  // namespace
}  // namespace kvb

namespace kvb {
namespace {

// A `full` run leaves its answers in the baseline cache, so a method compared with it afterwards
// pairs with them without computing the full cache again (full_answer_s ~ 0), and with the same
// texts; timing fields land per sample.
TEST(Qa, AFullRunIsTheBaselineOfTheMethodsAfterIt) {
  std::string dir = test::make_temp_dir("qa_baseline");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  env.data_dir = test::data_dir();
  env.cache_dir = dir + "/cache";
  const std::string proto = "\"source\": \"recall\", \"num_samples\": 3";
  RunOutcome full = execute_run(qa_config("full", proto), db, env);
  auto full_rows = db.samples(full.run_id);
  ASSERT_EQ(full_rows.size(), 3u);
  int cached = 0;
  for (const auto& e : std::filesystem::directory_iterator(env.cache_dir))
    cached += e.path().filename().string().rfind("qa-", 0) == 0;
  EXPECT_EQ(cached, 3) << "the full run's answers are the baseline cache's entries";
  RunOutcome paged = execute_run(qa_config("paged", proto), db, env);
  auto rows = db.samples(paged.run_id);
  ASSERT_EQ(rows.size(), 3u);
  for (size_t i = 0; i < rows.size(); ++i) {
    auto j = nlohmann::json::parse(rows[i].output_json);
    auto f = nlohmann::json::parse(full_rows[i].output_json);
    EXPECT_GT(j["timing"]["answer_s"].get<double>(), 0.0);
    EXPECT_GE(j["timing"]["full_answer_s"].get<double>(), 0.0);
    for (size_t k = 0; k < j["items"].size(); ++k)
      EXPECT_EQ(j["items"][k]["full_prediction"], f["items"][k]["prediction"]);
  }
  EXPECT_GT(metric(paged.metrics, "sample_ms"), 0.0);
  EXPECT_EQ(metric(full.metrics, "full_answer_ms"), 0.0);
}

}  // namespace
}  // namespace kvb
