// ResultsDb: schema and migrations, run lifecycle and resumption, samples, metrics, artifacts,
// merge, concurrent writers (threads and processes) and kill safety (a process that dies
// mid-transaction).

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/store/config_hash.h"
#include "harness/store/results_db.h"

namespace kvb {
namespace {

using nlohmann::json;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvb_store_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A spec whose hash really is config_hash(config), as the harness will build it.
RunSpec make_spec(const std::string& method, int variant) {
  json config = {{"method", method}, {"model", "stories260K"}, {"variant", variant}};
  RunSpec spec;
  spec.config_json = canonical_json(config);
  spec.config_hash = config_hash(config);
  spec.method = method;
  spec.model = "stories260K";
  spec.dataset = "tinyshakespeare";
  spec.protocol = "stream";
  spec.provenance_json = R"({"git_commit":"abc"})";
  return spec;
}

std::string sample_json(int64_t index) {
  return json{{"nll", 0.5 + static_cast<double>(index)}, {"text", "s" + std::to_string(index)}}
      .dump();
}

// Runs one SQL query on `path` with a separate raw connection and returns the first column of every
// row as text: an independent look at the file, not through ResultsDb.
std::vector<std::string> raw_query(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr),
            SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  std::vector<std::string> out;
  int rc = 0;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    out.push_back(text ? text : "NULL");
  }
  EXPECT_EQ(rc, SQLITE_DONE) << sqlite3_errmsg(db);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

std::string raw_one(const std::string& path, const std::string& sql) {
  auto rows = raw_query(path, sql);
  return rows.empty() ? "<no row>" : rows[0];
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no kvb::Error>";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::set<int64_t> range_set(int64_t begin, int64_t end) {
  std::set<int64_t> s;
  for (int64_t i = begin; i < end; ++i) s.insert(i);
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Opening, schema, migrations

TEST(ResultsDbOpen, CreatesParentDirsSchemaAndWal) {
  TempDir tmp;
  const std::string path = tmp.file("a/b/c/results.sqlite");
  {
    ResultsDb db(path);
    EXPECT_EQ(db.schema_version(), ResultsDb::latest_schema_version());
    EXPECT_EQ(ResultsDb::latest_schema_version(), 2);
  }
  ASSERT_TRUE(std::filesystem::is_regular_file(path));
  EXPECT_EQ(raw_one(path, "PRAGMA user_version"), "2");
  EXPECT_EQ(raw_one(path, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw_query(path, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"),
            (std::vector<std::string>{"artifacts", "metrics", "run_leases", "runs", "samples"}));
}

TEST(ResultsDbOpen, ReopenChangesNothing) {
  TempDir tmp;
  const std::string path = tmp.file("r.sqlite");
  int64_t id = 0;
  {
    ResultsDb db(path);
    id = db.begin_run(make_spec("kivi", 1)).id;
    db.add_sample(id, 0, "k0", sample_json(0));
  }
  const auto schema_before = raw_query(path, "SELECT sql FROM sqlite_master ORDER BY name");
  {
    ResultsDb db(path);
    EXPECT_EQ(db.schema_version(), 2);
    auto run = db.find_run(id);
    ASSERT_TRUE(run.has_value());
    EXPECT_EQ(run->status, RunStatus::kRunning);
    EXPECT_EQ(db.done_sample_indices(id), (std::set<int64_t>{0}));
  }
  { ResultsDb db(path); }
  EXPECT_EQ(raw_query(path, "SELECT sql FROM sqlite_master ORDER BY name"), schema_before);
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM runs"), "1");
}

TEST(ResultsDbMigrations, AppliedInOrderEachOnce) {
  TempDir tmp;
  const std::string path = tmp.file("m.sqlite");
  const std::vector<store_detail::Migration> v1 = {
      {1, "CREATE TABLE a (x INTEGER); INSERT INTO a VALUES (1);"}};
  std::vector<store_detail::Migration> v2 = v1;
  v2.push_back({2, "CREATE TABLE b (y TEXT); INSERT INTO a VALUES (2);"});
  ResultsDb::Options o1;
  o1.migrations = &v1;
  ResultsDb::Options o2;
  o2.migrations = &v2;
  { ResultsDb db(path, o1); }
  EXPECT_EQ(raw_one(path, "PRAGMA user_version"), "1");
  EXPECT_EQ(raw_query(path, "SELECT x FROM a ORDER BY x"), (std::vector<std::string>{"1"}));
  { ResultsDb db(path, o2); }  // applies only version 2
  { ResultsDb db(path, o2); }  // applies nothing
  EXPECT_EQ(raw_one(path, "PRAGMA user_version"), "2");
  EXPECT_EQ(raw_query(path, "SELECT x FROM a ORDER BY x"), (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM sqlite_master WHERE name = 'b'"), "1");
}

TEST(ResultsDbMigrations, FailedMigrationLeavesPreviousVersion) {
  TempDir tmp;
  const std::string path = tmp.file("m.sqlite");
  std::vector<store_detail::Migration> ms = {{1, "CREATE TABLE a (x INTEGER);"}};
  ResultsDb::Options opts;
  opts.migrations = &ms;
  { ResultsDb db(path, opts); }
  // The first statement works, the second fails: the transaction must undo the first as well.
  ms.push_back({2, "CREATE TABLE c (z INTEGER); INSERT INTO no_such_table VALUES (1);"});
  const std::string err = error_of([&] { ResultsDb db(path, opts); });
  EXPECT_TRUE(contains(err, path)) << err;
  EXPECT_TRUE(contains(err, "migration to schema version 2")) << err;
  EXPECT_TRUE(contains(err, "no_such_table")) << err;
  EXPECT_EQ(raw_one(path, "PRAGMA user_version"), "1");
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM sqlite_master WHERE name = 'c'"), "0");
}

TEST(ResultsDbMigrations, MisnumberedListIsRejected) {
  TempDir tmp;
  std::vector<store_detail::Migration> ms = {{1, "CREATE TABLE a (x);"},
                                             {3, "CREATE TABLE b (y);"}};
  ResultsDb::Options opts;
  opts.migrations = &ms;
  // The list is kvbench's own, not the user's: a misnumbered one is an internal error.
  try {
    ResultsDb db(tmp.file("m.sqlite"), opts);
    ADD_FAILURE() << "a misnumbered migration list was accepted";
  } catch (const InternalError& e) {
    EXPECT_EQ(e.component(), "results_db");
    EXPECT_TRUE(contains(e.what(), "numbered")) << e.what();
  }
}

TEST(ResultsDbOpen, NewerSchemaIsRefused) {
  TempDir tmp;
  const std::string path = tmp.file("new.sqlite");
  { ResultsDb db(path); }
  raw_query(path, "PRAGMA user_version = 7");
  const std::string err = error_of([&] { ResultsDb db(path); });
  EXPECT_TRUE(contains(err, path)) << err;
  EXPECT_TRUE(contains(err, "schema version 7")) << err;
  EXPECT_TRUE(contains(err, "newer kvbench")) << err;
  EXPECT_EQ(raw_one(path, "PRAGMA user_version"), "7");  // left alone
}

TEST(ResultsDbOpen, GarbageFileIsRefusedAndLeftIntact) {
  TempDir tmp;
  const std::string path = tmp.file("garbage.sqlite");
  std::string garbage;
  for (int i = 0; i < 300; ++i)
    garbage += "this is not a database, line " + std::to_string(i) + "\n";
  std::ofstream(path, std::ios::binary) << garbage;
  const std::string err = error_of([&] { ResultsDb db(path); });
  EXPECT_TRUE(contains(err, path)) << err;
  EXPECT_TRUE(contains(err, "not a SQLite database")) << err;
  EXPECT_EQ(read_file(path), garbage);
}

TEST(ResultsDbOpen, DirectoryPathIsRefused) {
  TempDir tmp;
  const std::string path = tmp.file("dir.sqlite");
  std::filesystem::create_directories(path);
  const std::string err = error_of([&] { ResultsDb db(path); });
  EXPECT_TRUE(contains(err, path)) << err;
  EXPECT_TRUE(contains(err, "not a regular file")) << err;
}

// ---------------------------------------------------------------------------------------------------
// Runs

TEST(ResultsDbRuns, BeginTwiceSameIdThenAlreadyDone) {
  TempDir tmp;
  ResultsDb db(tmp.file("r.sqlite"));
  const RunSpec spec = make_spec("kivi", 1);
  RunInfo first = db.begin_run(spec);
  EXPECT_GT(first.id, 0);
  EXPECT_EQ(first.status, RunStatus::kRunning);
  EXPECT_FALSE(first.already_done);
  EXPECT_FALSE(first.resumed);
  EXPECT_EQ(first.attempts, 1);

  db.add_sample(first.id, 0, "k0", sample_json(0));
  RunInfo second = db.begin_run(spec);  // e.g. the process died and the grid was restarted
  EXPECT_EQ(second.id, first.id);
  EXPECT_TRUE(second.resumed);
  EXPECT_FALSE(second.already_done);
  EXPECT_EQ(second.attempts, 2);
  EXPECT_EQ(second.done_samples, 1);
  EXPECT_FALSE(second.previous_worker.empty());

  db.finish_run(first.id, {{"ppl", 12.5, "", Direction::kLower}}, 3.25);
  RunInfo third = db.begin_run(spec);
  EXPECT_EQ(third.id, first.id);
  EXPECT_TRUE(third.already_done);
  EXPECT_EQ(third.status, RunStatus::kDone);
  EXPECT_EQ(third.attempts, 2);  // a done run is not reopened

  auto row = db.find_run_by_hash(spec.config_hash);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->status, RunStatus::kDone);
  ASSERT_TRUE(row->wall_s.has_value());
  EXPECT_DOUBLE_EQ(*row->wall_s, 3.25);
  EXPECT_FALSE(row->finished_at.empty());
  EXPECT_EQ(row->config_json, spec.config_json);
  EXPECT_EQ(row->provenance_json, spec.provenance_json);
  EXPECT_EQ(db.list_runs().size(), 1u);
}

TEST(ResultsDbRuns, ResumeAfterFail) {
  TempDir tmp;
  ResultsDb db(tmp.file("r.sqlite"));
  RunSpec spec = make_spec("snapkv", 2);
  const int64_t id = db.begin_run(spec).id;
  for (int64_t i = 0; i < 5; ++i) db.add_sample(id, i, "k" + std::to_string(i), sample_json(i));
  db.fail_run(id, "CUDA out of memory at sample 5", 1.5);

  auto failed = db.find_run(id);
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->status, RunStatus::kFailed);
  EXPECT_EQ(failed->error, "CUDA out of memory at sample 5");
  EXPECT_FALSE(failed->finished_at.empty());
  // A failed run takes no more samples until it is begun again.
  EXPECT_TRUE(contains(error_of([&] { db.add_sample(id, 5, "k5", sample_json(5)); }), "'failed'"));

  spec.provenance_json = R"({"git_commit":"def"})";
  RunInfo again = db.begin_run(spec);
  EXPECT_EQ(again.id, id);
  EXPECT_TRUE(again.resumed);
  EXPECT_EQ(again.status, RunStatus::kRunning);
  EXPECT_EQ(again.done_samples, 5);
  auto resumed = db.find_run(id);
  EXPECT_EQ(resumed->status, RunStatus::kRunning);
  EXPECT_EQ(resumed->error, "");
  EXPECT_EQ(resumed->finished_at, "");
  EXPECT_FALSE(resumed->wall_s.has_value());
  EXPECT_EQ(resumed->attempts, 2);
  EXPECT_EQ(resumed->provenance_json, R"({"git_commit":"def"})");

  const std::set<int64_t> done = db.done_sample_indices(id);
  EXPECT_EQ(done, range_set(0, 5));
  for (int64_t i = 0; i < 8; ++i) {
    if (done.count(i) == 0) db.add_sample(id, i, "k" + std::to_string(i), sample_json(i));
  }
  db.finish_run(id, {}, 2.0);
  EXPECT_EQ(db.sample_count(id), 8);
  EXPECT_EQ(db.find_run(id)->status, RunStatus::kDone);
}

TEST(ResultsDbRuns, SameHashDifferentConfigIsRefused) {
  TempDir tmp;
  ResultsDb db(tmp.file("r.sqlite"));
  RunSpec spec = make_spec("kivi", 1);
  db.begin_run(spec);
  spec.config_json = R"({"something":"else"})";
  const std::string err = error_of([&] { db.begin_run(spec); });
  EXPECT_TRUE(contains(err, spec.config_hash)) << err;
  EXPECT_TRUE(contains(err, "different config_json")) << err;
}

TEST(ResultsDbRuns, InvalidOperationsNameTheProblem) {
  TempDir tmp;
  const std::string path = tmp.file("r.sqlite");
  ResultsDb db(path);
  const int64_t id = db.begin_run(make_spec("kivi", 1)).id;
  std::string err = error_of([&] { db.finish_run(999, {}, 1.0); });
  EXPECT_TRUE(contains(err, "run 999 does not exist")) << err;
  EXPECT_TRUE(contains(err, path)) << err;
  err = error_of([&] { db.add_sample(id, 0, "k", "{not json"); });
  EXPECT_TRUE(contains(err, "not valid JSON")) << err;
  err = error_of([&] { db.add_sample(id, -1, "k", "{}"); });
  EXPECT_TRUE(contains(err, "negative")) << err;
  RunSpec bad = make_spec("kivi", 2);
  bad.config_json = "{";
  EXPECT_TRUE(contains(error_of([&] { db.begin_run(bad); }), "config_json"));
  err = error_of([&] { db.finish_run(id, {{"", 1.0}}, 1.0); });
  EXPECT_TRUE(contains(err, "no name")) << err;
  // The failed finish_run wrote nothing: the run is still running, with no metrics.
  EXPECT_EQ(db.find_run(id)->status, RunStatus::kRunning);
  EXPECT_TRUE(db.metrics(id).empty());
  db.finish_run(id, {}, 1.0);
  err = error_of([&] { db.add_sample(id, 0, "k", "{}"); });
  EXPECT_TRUE(contains(err, "'done'")) << err;
  EXPECT_TRUE(contains(error_of([&] { db.fail_run(id, "x"); }), "'done'"));
}

TEST(ResultsDbRuns, ListFilterAndDeleteCascades) {
  TempDir tmp;
  const std::string path = tmp.file("r.sqlite");
  ResultsDb db(path);
  const int64_t a = db.begin_run(make_spec("kivi", 1)).id;
  const int64_t b = db.begin_run(make_spec("kivi", 2)).id;
  RunSpec other = make_spec("snapkv", 1);
  other.grid = "ablation";
  other.simulated = true;
  const int64_t c = db.begin_run(other).id;
  db.add_sample(a, 0, "k", "{}");
  db.finish_run(a, {{"ppl", 10.0, "", Direction::kLower}}, 1.0);

  RunFilter kivi;
  kivi.method = "kivi";
  auto rows = db.list_runs(kivi);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].id, a);
  EXPECT_EQ(rows[1].id, b);
  RunFilter done;
  done.method = "kivi";
  done.status = RunStatus::kDone;
  rows = db.list_runs(done);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].id, a);
  RunFilter grid;
  grid.grid = "ablation";
  rows = db.list_runs(grid);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].id, c);
  EXPECT_TRUE(rows[0].simulated);
  EXPECT_EQ(rows[0].method, "snapkv");
  EXPECT_EQ(rows[0].dataset, "tinyshakespeare");
  EXPECT_EQ(rows[0].protocol, "stream");

  EXPECT_TRUE(db.delete_run(a));
  EXPECT_FALSE(db.delete_run(a));
  EXPECT_FALSE(db.find_run(a).has_value());
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM samples"), "0");
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM metrics"), "0");
  EXPECT_EQ(db.list_runs().size(), 2u);
}

// ---------------------------------------------------------------------------------------------------
// Samples, metrics, artifacts, transactions

TEST(ResultsDbSamples, ResumeSetAndReplaceOnDuplicate) {
  TempDir tmp;
  const std::string path = tmp.file("s.sqlite");
  ResultsDb db(path);
  const int64_t id = db.begin_run(make_spec("kivi", 1)).id;
  for (int64_t i : {7, 0, 3, 1}) db.add_sample(id, i, "key" + std::to_string(i), sample_json(i));
  EXPECT_EQ(db.done_sample_indices(id), (std::set<int64_t>{0, 1, 3, 7}));
  db.add_sample(id, 3, "key3b", R"({"nll":9.5})");  // rewrite: replaces, never duplicates
  EXPECT_EQ(db.sample_count(id), 4);
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM samples WHERE sample_index = 3"), "1");
  auto keys = db.done_sample_keys(id);
  EXPECT_EQ(keys.at(3), "key3b");
  EXPECT_EQ(keys.at(7), "key7");
  auto rows = db.samples(id);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].index, 0);
  EXPECT_EQ(rows[2].index, 3);
  EXPECT_EQ(json::parse(rows[2].output_json)["nll"], 9.5);
  EXPECT_EQ(json::parse(rows[3].output_json)["text"], "s7");
  EXPECT_FALSE(rows[0].created_at.empty());
}

TEST(ResultsDbMetrics, RoundTripUnitsDirectionsLayersHeads) {
  TempDir tmp;
  const std::string path = tmp.file("m.sqlite");
  ResultsDb db(path);
  const int64_t id = db.begin_run(make_spec("kivi", 1)).id;
  std::vector<Metric> ms;
  Metric kl{"kl_mean", 0.0123, "nats", Direction::kLower};
  kl.n = 100;
  kl.ci_low = 0.011;
  kl.ci_high = 0.0135;
  ms.push_back(kl);
  ms.push_back({"top1_agreement", 0.97, "", Direction::kHigher});
  ms.push_back({"undefined", std::numeric_limits<double>::quiet_NaN(), "", Direction::kNone});
  for (int64_t l = 0; l < 4; ++l) {
    Metric m{"attn_out_rel_err", 0.01 * static_cast<double>(l + 1), "", Direction::kLower};
    m.layer = l;
    ms.push_back(m);
  }
  for (int64_t h = 0; h < 2; ++h) {
    Metric m{"attn_out_rel_err", 0.5 + static_cast<double>(h), "", Direction::kLower};
    m.layer = 1;
    m.head = h;
    ms.push_back(m);
  }
  db.finish_run(id, ms, 1.0);

  auto got = db.metrics(id);
  ASSERT_EQ(got.size(), 9u);
  // Ordered by name, then layer (run-level first), then head.
  EXPECT_EQ(got[0].name, "attn_out_rel_err");
  EXPECT_EQ(got[0].layer, std::optional<int64_t>(0));
  EXPECT_FALSE(got[0].head.has_value());
  EXPECT_DOUBLE_EQ(got[0].value, 0.01);
  EXPECT_EQ(got[1].layer, std::optional<int64_t>(1));
  EXPECT_FALSE(got[1].head.has_value());
  EXPECT_EQ(got[2].layer, std::optional<int64_t>(1));
  EXPECT_EQ(got[2].head, std::optional<int64_t>(0));
  EXPECT_DOUBLE_EQ(got[3].value, 1.5);
  EXPECT_EQ(got[3].head, std::optional<int64_t>(1));
  EXPECT_DOUBLE_EQ(got[5].value, 0.04);
  EXPECT_EQ(got[6].name, "kl_mean");
  EXPECT_EQ(got[6].unit, "nats");
  EXPECT_EQ(got[6].direction, Direction::kLower);
  EXPECT_EQ(got[6].n, std::optional<int64_t>(100));
  EXPECT_DOUBLE_EQ(*got[6].ci_low, 0.011);
  EXPECT_DOUBLE_EQ(*got[6].ci_high, 0.0135);
  EXPECT_FALSE(got[6].layer.has_value());
  EXPECT_EQ(got[7].name, "top1_agreement");
  EXPECT_EQ(got[7].direction, Direction::kHigher);
  EXPECT_FALSE(got[7].n.has_value());
  EXPECT_EQ(got[8].name, "undefined");
  EXPECT_TRUE(std::isnan(got[8].value));

  // Writing the same keys again replaces rows, including the run-level one whose layer is NULL
  // (NULLs are distinct in a plain UNIQUE constraint: this is what the expression index prevents).
  db.put_metrics(id, {{"kl_mean", 0.02, "nats", Direction::kLower}});
  Metric layer2{"attn_out_rel_err", 0.3, "", Direction::kLower};
  layer2.layer = 2;
  db.put_metrics(id, {layer2});
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM metrics"), "9");
  EXPECT_EQ(raw_one(path, "SELECT value FROM metrics WHERE name = 'kl_mean' AND layer IS NULL"),
            "0.02");
  EXPECT_EQ(raw_one(path, "SELECT value FROM metrics WHERE layer = 2 AND head IS NULL"), "0.3");
  EXPECT_EQ(raw_one(path, "SELECT direction FROM metrics WHERE name = 'top1_agreement'"), "higher");
}

TEST(ResultsDbMetrics, SampleWithMetricsIsOneUnit) {
  TempDir tmp;
  ResultsDb db(tmp.file("m.sqlite"));
  const int64_t id = db.begin_run(make_spec("kivi", 1)).id;
  db.add_sample_with_metrics(id, 0, "k0", sample_json(0), {{"nll_sum", 0.5, "nats"}});
  db.add_sample_with_metrics(id, 1, "k1", sample_json(1), {{"nll_sum", 2.0, "nats"}});
  // A bad metric fails the whole call: the sample must not be stored either.
  EXPECT_THROW(db.add_sample_with_metrics(id, 2, "k2", sample_json(2), {{"", 1.0}}), Error);
  EXPECT_EQ(db.done_sample_indices(id), (std::set<int64_t>{0, 1}));
  auto ms = db.metrics(id);
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_DOUBLE_EQ(ms[0].value, 2.0);
}

TEST(ResultsDbArtifacts, PutFindListByContentHash) {
  TempDir tmp;
  ResultsDb db(tmp.file("a.sqlite"));
  Artifact a{std::string(64, 'a'), "calibration", "/data/calib.bin", 1234, "", R"({"rows":8})"};
  EXPECT_TRUE(db.put_artifact(a));
  Artifact dup = a;
  dup.path = "/elsewhere/calib.bin";
  EXPECT_FALSE(db.put_artifact(dup));  // same hash: same content, first record kept
  db.put_artifact({std::string(64, 'b'), "baseline_logits", "/c/b.bin", 99, "", "{}"});
  auto found = db.find_artifact(a.hash);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->path, "/data/calib.bin");
  EXPECT_EQ(found->bytes, 1234);
  EXPECT_EQ(found->kind, "calibration");
  EXPECT_EQ(found->meta_json, R"({"rows":8})");
  EXPECT_FALSE(found->created_at.empty());
  EXPECT_FALSE(db.find_artifact(std::string(64, 'c')).has_value());
  EXPECT_EQ(db.list_artifacts().size(), 2u);
  auto calib = db.list_artifacts("calibration");
  ASSERT_EQ(calib.size(), 1u);
  EXPECT_EQ(calib[0].hash, a.hash);
}

TEST(ResultsDbTransactions, ExceptionRollsBackAndSavepointsNest) {
  TempDir tmp;
  ResultsDb db(tmp.file("t.sqlite"));
  const int64_t id = db.begin_run(make_spec("kivi", 1)).id;
  EXPECT_THROW(db.transaction([&] {
    for (int64_t i = 0; i < 5; ++i) db.add_sample(id, i, "k", sample_json(i));
    throw Error("interrupted");
  }),
               Error);
  EXPECT_TRUE(db.done_sample_indices(id).empty());

  db.transaction([&] {
    db.add_sample(id, 0, "k", sample_json(0));
    try {
      db.transaction([&] {
        db.add_sample(id, 1, "k", sample_json(1));
        throw Error("inner");
      });
    } catch (const Error&) {
      // The inner part is undone; the outer transaction goes on.
    }
    db.add_sample(id, 2, "k", sample_json(2));
  });
  EXPECT_EQ(db.done_sample_indices(id), (std::set<int64_t>{0, 2}));
}

// ---------------------------------------------------------------------------------------------------
// Merge

TEST(ResultsDbMerge, DeduplicatesByHashDoneWins) {
  TempDir tmp;
  const std::string a_path = tmp.file("a.sqlite");
  const std::string b_path = tmp.file("b.sqlite");
  const RunSpec h1 = make_spec("kivi", 1), h2 = make_spec("kivi", 2), h3 = make_spec("kivi", 3),
                h4 = make_spec("kivi", 4);
  {
    ResultsDb a(a_path);
    const int64_t r1 = a.begin_run(h1).id;  // done here: kept
    for (int64_t i = 0; i < 3; ++i) a.add_sample(r1, i, "a", sample_json(i));
    a.finish_run(r1, {{"ppl", 1.0, "", Direction::kLower}}, 1.0);
    const int64_t r2 = a.begin_run(h2).id;  // running here, done in B: replaced
    a.add_sample(r2, 0, "a", sample_json(0));
    a.add_sample(r2, 9, "a-only", sample_json(9));
    const int64_t r3 = a.begin_run(h3).id;  // failed here, running in B: united
    a.add_sample(r3, 0, "a", sample_json(0));
    a.fail_run(r3, "oom");
    a.put_artifact({std::string(64, 'x'), "calibration", "/a/x", 1, "", "{}"});
  }
  {
    ResultsDb b(b_path);
    b.begin_run(h4);  // ids in B differ from A's on purpose: runs are matched by hash
    b.begin_run(make_spec("pad", 0));
    b.delete_run(b.find_run_by_hash(make_spec("pad", 0).config_hash)->id);
    const int64_t r1 = b.begin_run(h1).id;
    for (int64_t i = 0; i < 6; ++i) b.add_sample(r1, i, "b", sample_json(i));
    const int64_t r2 = b.begin_run(h2).id;
    for (int64_t i = 0; i < 4; ++i) b.add_sample(r2, i, "b", sample_json(i));
    b.finish_run(r2, {{"ppl", 2.0, "", Direction::kLower}}, 2.0);
    const int64_t r3 = b.begin_run(h3).id;
    b.add_sample(r3, 0, "b", sample_json(0));
    b.add_sample(r3, 1, "b", sample_json(1));
    b.add_sample(r3, 2, "b", sample_json(2));
    const int64_t r4 = b.find_run_by_hash(h4.config_hash)->id;
    b.add_sample(r4, 0, "b", sample_json(0));
    b.finish_run(r4, {{"ppl", 4.0, "", Direction::kLower}}, 4.0);
    b.put_artifact({std::string(64, 'x'), "calibration", "/b/x", 1, "", "{}"});
    b.put_artifact({std::string(64, 'y'), "calibration", "/b/y", 2, "", "{}"});
  }
  ResultsDb a(a_path);
  MergeStats st = a.merge_from(b_path);
  EXPECT_EQ(st.runs_added, 1);
  EXPECT_EQ(st.runs_replaced, 1);
  EXPECT_EQ(st.runs_combined, 1);
  EXPECT_EQ(st.runs_skipped, 1);
  EXPECT_EQ(st.samples_copied, 4 + 2 + 1);  // h2's four, h3's two new ones, h4's one
  EXPECT_EQ(st.metrics_copied, 2);          // ppl of h2 and h4
  EXPECT_EQ(st.artifacts_added, 1);

  EXPECT_EQ(a.list_runs().size(), 4u);
  auto r1 = a.find_run_by_hash(h1.config_hash);
  EXPECT_EQ(r1->status, RunStatus::kDone);
  EXPECT_EQ(a.done_sample_keys(r1->id),
            (std::map<int64_t, std::string>{{0, "a"}, {1, "a"}, {2, "a"}}));
  auto r2 = a.find_run_by_hash(h2.config_hash);
  EXPECT_EQ(r2->status, RunStatus::kDone);
  EXPECT_DOUBLE_EQ(*r2->wall_s, 2.0);
  EXPECT_EQ(a.done_sample_indices(r2->id), range_set(0, 4));  // A's partial rows (9) are gone
  ASSERT_EQ(a.metrics(r2->id).size(), 1u);
  EXPECT_DOUBLE_EQ(a.metrics(r2->id)[0].value, 2.0);
  auto r3 = a.find_run_by_hash(h3.config_hash);
  EXPECT_EQ(r3->status, RunStatus::kFailed);
  EXPECT_EQ(a.done_sample_keys(r3->id),
            (std::map<int64_t, std::string>{{0, "a"}, {1, "b"}, {2, "b"}}));
  auto r4 = a.find_run_by_hash(h4.config_hash);
  EXPECT_EQ(r4->status, RunStatus::kDone);
  EXPECT_EQ(a.sample_count(r4->id), 1);
  EXPECT_DOUBLE_EQ(a.metrics(r4->id)[0].value, 4.0);
  EXPECT_EQ(a.find_artifact(std::string(64, 'x'))->path, "/a/x");
  EXPECT_TRUE(a.find_artifact(std::string(64, 'y')).has_value());

  // Merging again adds nothing.
  MergeStats again = a.merge_from(b_path);
  EXPECT_EQ(again.runs_added, 0);
  EXPECT_EQ(again.runs_skipped, 3);
  EXPECT_EQ(again.runs_combined, 1);
  EXPECT_EQ(again.samples_copied, 0);
  EXPECT_EQ(again.artifacts_added, 0);
  EXPECT_EQ(raw_one(a_path, "SELECT count(*) FROM samples"), std::to_string(3 + 4 + 3 + 1));
  EXPECT_EQ(raw_one(a_path, "PRAGMA foreign_key_check"), "<no row>");
  // The source was only read (its WAL may be checkpointed, but its rows are unchanged).
  EXPECT_EQ(raw_one(b_path, "SELECT count(*) FROM samples"), "14");
}

TEST(ResultsDbMerge, RefusesGarbageMissingAndSelf) {
  TempDir tmp;
  const std::string path = tmp.file("a.sqlite");
  ResultsDb db(path);
  const std::string garbage = tmp.file("garbage.sqlite");
  std::ofstream(garbage) << std::string(5000, 'z');
  std::string err = error_of([&] { db.merge_from(garbage); });
  EXPECT_TRUE(contains(err, garbage)) << err;
  EXPECT_TRUE(contains(err, "not a SQLite database")) << err;
  err = error_of([&] { db.merge_from(tmp.file("missing.sqlite")); });
  EXPECT_TRUE(contains(err, "missing.sqlite")) << err;
  EXPECT_TRUE(contains(error_of([&] { db.merge_from(path); }), "into itself"));
  // A SQLite file that is not a results DB (schema version 0).
  const std::string foreign = tmp.file("foreign.sqlite");
  raw_query(foreign, "CREATE TABLE t (x)");
  err = error_of([&] { db.merge_from(foreign); });
  EXPECT_TRUE(contains(err, "not a kvbench results DB")) << err;
  // The DB is still usable after the failed merges (nothing left attached or open).
  EXPECT_GT(db.begin_run(make_spec("kivi", 1)).id, 0);
}

// ---------------------------------------------------------------------------------------------------
// Reading only

// A file's bytes and modification time: equal before and after means it was not written.
struct FileState {
  std::string bytes;
  int64_t mtime_ns = 0;
  bool operator==(const FileState& o) const { return bytes == o.bytes && mtime_ns == o.mtime_ns; }
};
FileState file_state(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return {read_file(path),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::set<std::string> dir_entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename());
  return out;
}

// A DB at rest (every connection closed, so no -wal or -shm) holding one finished run of `n`
// samples.
int64_t make_finished_db(const std::string& path, int variant = 1, int n = 3) {
  ResultsDb db(path);
  const int64_t id = db.begin_run(make_spec("kivi", variant)).id;
  db.transaction([&] {
    for (int64_t i = 0; i < n; ++i) db.add_sample(id, i, "k", sample_json(i));
  });
  db.finish_run(id, {{"ppl", 1.5, "", Direction::kLower}}, 1.0);
  return id;
}

// Runs `fn` in a child process that cannot write what its user does not own: as root (whom
// permissions do not stop) the child drops to uid/gid 65534 first. Returns fn's result, or false
// when the child failed otherwise (its stderr says why).
bool in_unprivileged_child(const std::function<bool()>& fn) {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    bool ok = false;
    try {
      ok = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
    }
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(ResultsDbReadOnly, ReadsWithoutWritingAndRefusesWrites) {
  TempDir tmp;
  const std::string path = tmp.file("r.sqlite");
  const int64_t id = make_finished_db(path);
  const FileState before = file_state(path);
  {
    ResultsDb db(path, ResultsDb::read_only_options());
    db.check_integrity();
    EXPECT_EQ(db.list_runs().size(), 1u);
    EXPECT_EQ(db.sample_count(id), 3);
    EXPECT_EQ(db.metrics(id).size(), 1u);
    const std::string err = error_of([&] { db.begin_run(make_spec("kivi", 2)); });
    EXPECT_TRUE(contains(err, path)) << err;
    EXPECT_TRUE(contains(error_of([&] { db.merge_from(path); }), "reading only"));
  }
  EXPECT_TRUE(file_state(path) == before);
  EXPECT_EQ(raw_one(path, "SELECT count(*) FROM runs"), "1");
}

TEST(ResultsDbReadOnly, ReadOnlyDirectoryIsReadableAndLeftUntouched) {
  TempDir tmp;
  const std::string dir = tmp.file("archive");
  const std::string out_dir = tmp.file("out");
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(out_dir);
  const std::string path = dir + "/r.sqlite";
  make_finished_db(path);
  const FileState before = file_state(path);
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(out_dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(tmp.file("").c_str(), 0755), 0);
  EXPECT_TRUE(in_unprivileged_child([&] {
    ResultsDb db(path, ResultsDb::read_only_options());
    db.check_integrity();
    if (db.list_runs().size() != 1) return false;
    ResultsDb out(out_dir + "/merged.sqlite");  // a read-only DB as merge's input
    return out.merge_from(path).runs_added == 1 && out.list_runs().size() == 1;
  }));
  ::chmod(dir.c_str(), 0755);
  EXPECT_TRUE(file_state(path) == before);
  EXPECT_EQ(dir_entries(dir), (std::set<std::string>{"r.sqlite"}));  // no -wal, no -shm
}

TEST(ResultsDbReadOnly, WalWithCommitsInReadOnlyDirectoryIsRefusedByName) {
  TempDir tmp;
  const std::string dir = tmp.file("archive");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/r.sqlite";
  make_finished_db(path);
  {
    // A copy taken while a writer was open: the -wal holds commits, there is no -shm.
    ResultsDb db(path);
    raw_query(path, "PRAGMA wal_autocheckpoint = 0");
    db.begin_run(make_spec("kivi", 2));
    std::filesystem::copy_file(path + "-wal", tmp.file("wal"));
    std::filesystem::copy_file(path, tmp.file("db"));
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(tmp.file("db"), path);
  std::filesystem::copy_file(tmp.file("wal"), path + "-wal");
  ASSERT_GT(std::filesystem::file_size(path + "-wal"), 0u);
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(tmp.file("").c_str(), 0755), 0);
  EXPECT_TRUE(in_unprivileged_child([&] {
    const std::string err = error_of([&] { ResultsDb db(path, ResultsDb::read_only_options()); });
    const bool ok = contains(err, path) && contains(err, "-wal file holds commits");
    if (!ok) std::fprintf(stderr, "child: %s\n", err.c_str());
    return ok;
  }));
  ::chmod(dir.c_str(), 0755);
}

TEST(ResultsDbReadOnly, EmptyMissingGarbageForeignAndDirectoryAreRefusedByName) {
  TempDir tmp;
  const auto ro = ResultsDb::read_only_options();
  const std::string empty = tmp.file("empty.sqlite");
  std::ofstream(empty).close();
  std::string err = error_of([&] { ResultsDb db(empty, ro); });
  EXPECT_TRUE(contains(err, empty + ": empty file (0 bytes)")) << err;
  EXPECT_EQ(std::filesystem::file_size(empty), 0u);
  EXPECT_EQ(dir_entries(tmp.file("")), (std::set<std::string>{"empty.sqlite"}));

  const std::string missing = tmp.file("missing.sqlite");
  err = error_of([&] { ResultsDb db(missing, ro); });
  EXPECT_TRUE(contains(err, missing + ": no such file")) << err;
  EXPECT_FALSE(std::filesystem::exists(missing));

  const std::string garbage = tmp.file("garbage.sqlite");
  std::ofstream(garbage, std::ios::binary) << std::string(5000, 'z');
  err = error_of([&] { ResultsDb db(garbage, ro); });
  EXPECT_TRUE(contains(err, garbage) && contains(err, "not a SQLite database")) << err;
  EXPECT_EQ(read_file(garbage), std::string(5000, 'z'));

  const std::string foreign = tmp.file("foreign.sqlite");
  raw_query(foreign, "CREATE TABLE t (x)");
  err = error_of([&] { ResultsDb db(foreign, ro); });
  EXPECT_TRUE(contains(err, foreign) && contains(err, "not a kvbench results DB")) << err;

  const std::string dir = tmp.file("dir.sqlite");
  std::filesystem::create_directories(dir);
  err = error_of([&] { ResultsDb db(dir, ro); });
  EXPECT_TRUE(contains(err, dir + ": is a directory")) << err;
}

// The first built-in migration only: a DB as an older kvbench wrote it.
const std::vector<store_detail::Migration>& schema_v1() {
  static const std::vector<store_detail::Migration> v1 = {store_detail::builtin_migrations()[0]};
  return v1;
}

std::string make_v1_db(const std::string& path) {
  ResultsDb::Options o;
  o.migrations = &schema_v1();
  { ResultsDb db(path, o); }
  const RunSpec spec = make_spec("kivi", 7);
  raw_query(path,
            "INSERT INTO runs (config_hash, config_json, method, status, created_at, "
            "started_at) VALUES ('" +
                spec.config_hash + "', '" + spec.config_json + "', 'kivi', 'done', 't', 't')");
  raw_query(path,
            "INSERT INTO samples (run_id, sample_index, output_json, created_at) "
            "VALUES (1, 0, '{}', 't')");
  return spec.config_hash;
}

TEST(ResultsDbReadOnly, OlderSchemaIsReadThroughAMigratedCopyAndMergedWithoutRewritingIt) {
  TempDir tmp;
  const std::string old_path = tmp.file("v1.sqlite");
  const std::string hash = make_v1_db(old_path);
  const FileState before = file_state(old_path);
  {
    ResultsDb db(old_path, ResultsDb::read_only_options());
    EXPECT_EQ(db.schema_version(), ResultsDb::latest_schema_version());  // the copy's
    ASSERT_EQ(db.list_runs().size(), 1u);
    EXPECT_FALSE(db.lease(db.list_runs()[0].id).has_value());  // a table v1 lacks
  }
  const std::string scratch = tmp.file("scratch");
  std::filesystem::create_directories(scratch);
  const char* saved = std::getenv("TMPDIR");
  const std::string saved_tmpdir = saved != nullptr ? saved : "";
  ::setenv("TMPDIR", scratch.c_str(), 1);
  ResultsDb out(tmp.file("out.sqlite"));
  const MergeStats st = out.merge_from(old_path);
  if (saved != nullptr) {
    ::setenv("TMPDIR", saved_tmpdir.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  EXPECT_EQ(st.runs_added, 1);
  EXPECT_EQ(st.samples_copied, 1);
  EXPECT_EQ(out.find_run_by_hash(hash)->status, RunStatus::kDone);
  EXPECT_TRUE(file_state(old_path) == before);
  EXPECT_EQ(raw_one(old_path, "PRAGMA user_version"), "1");
  EXPECT_TRUE(dir_entries(scratch).empty());  // the migrated temporary copy is gone
}

TEST(ResultsDbReadOnly, ReaderDoesNotWaitForAWriter) {
  TempDir tmp;
  const std::string path = tmp.file("w.sqlite");
  make_finished_db(path);
  ResultsDb writer(path);
  ResultsDb::Options ro = ResultsDb::read_only_options();
  ro.busy_timeout_ms = 2000;  // the old read path waited the full timeout, then failed
  writer.transaction([&] {
    writer.begin_run(make_spec("kivi", 2));  // uncommitted while the reader reads
    const auto t0 = std::chrono::steady_clock::now();
    ResultsDb reader(path, ro);
    EXPECT_EQ(reader.list_runs().size(), 1u);  // the last commit
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  });
  EXPECT_EQ(writer.list_runs().size(), 2u);
}

TEST(ResultsDbIntegrity, DamagedFileIsRefusedBeforeAnythingIsWritten) {
  TempDir tmp;
  const std::string path = tmp.file("d.sqlite");
  make_finished_db(path, 1, 200);
  const size_t page = 4096;
  std::string bytes = read_file(path);
  ASSERT_GT(bytes.size(), 12 * page);
  for (size_t i = 8 * page; i < 8 * page + 64; ++i) bytes[i] = static_cast<char>(0xA5);
  std::ofstream(path, std::ios::binary) << bytes;
  const FileState before = file_state(path);
  ResultsDb::Options o;
  o.check_integrity = true;
  std::string err = error_of([&] { ResultsDb db(path, o); });
  EXPECT_TRUE(contains(err, path + ": fails PRAGMA quick_check")) << err;
  EXPECT_TRUE(file_state(path) == before);
  // A merge refuses it as a source, naming it, before changing the destination.
  ResultsDb out(tmp.file("out.sqlite"));
  err = error_of([&] { out.merge_from(path); });
  EXPECT_TRUE(contains(err, path + ": fails PRAGMA quick_check")) << err;
  EXPECT_TRUE(out.list_runs().empty());
}

TEST(ResultsDbMerge, LeavesARunALiveProcessHoldsToIt) {
  TempDir tmp;
  const std::string dst = tmp.file("dst.sqlite");
  const std::string src = tmp.file("src.sqlite");
  make_finished_db(src, 5);  // done in the source
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    // A live grid computing the same run in the destination.
    ResultsDb db(dst);
    db.begin_run(make_spec("kivi", 5));
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  MergeStats st;
  {
    ResultsDb out(dst);
    st = out.merge_from(src);
    const auto run = out.find_run_by_hash(make_spec("kivi", 5).config_hash);
    EXPECT_EQ(run->status, RunStatus::kRunning);
    EXPECT_EQ(out.sample_count(run->id), 0);
    const auto lease = out.lease(run->id);
    EXPECT_TRUE(lease && lease->live && !lease->ours);
  }
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_EQ(st.runs_held, 1);
  EXPECT_EQ(st.runs_replaced, 0);
  // Once the holder is gone, merging again replaces the run with the source's finished one.
  ResultsDb out(dst);
  EXPECT_EQ(out.merge_from(src).runs_replaced, 1);
  EXPECT_EQ(out.find_run_by_hash(make_spec("kivi", 5).config_hash)->status, RunStatus::kDone);
}

// ---------------------------------------------------------------------------------------------------
// Concurrency and kill safety

constexpr int64_t kPerWriter = 200;

// Writes samples [first, first + kPerWriter) of run `variant`, one transaction each (threads of one
// process share a run: they are one lease holder).
void write_samples(const std::string& path, int64_t first, int64_t* run_id_out, int variant = 0) {
  ResultsDb db(path);
  const RunInfo info = db.begin_run(make_spec("concurrent", variant));
  *run_id_out = info.id;
  for (int64_t i = first; i < first + kPerWriter; ++i) {
    db.add_sample(info.id, i, "k" + std::to_string(i), sample_json(i));
  }
}

TEST(ResultsDbConcurrency, TwoThreadsLoseNothing) {
  TempDir tmp;
  const std::string path = tmp.file("fresh/c.sqlite");  // both writers create it at once
  int64_t id0 = 0, id1 = 0;
  std::string err0, err1;
  std::thread t0([&] { err0 = error_of([&] { write_samples(path, 0, &id0); }); });
  std::thread t1([&] { err1 = error_of([&] { write_samples(path, kPerWriter, &id1); }); });
  t0.join();
  t1.join();
  EXPECT_EQ(err0, "<no kvb::Error>");
  EXPECT_EQ(err1, "<no kvb::Error>");
  EXPECT_EQ(id0, id1);
  ResultsDb db(path);
  EXPECT_EQ(db.list_runs().size(), 1u);
  EXPECT_EQ(db.done_sample_indices(id0), range_set(0, 2 * kPerWriter));
}

TEST(ResultsDbConcurrency, SharedHandleAcrossThreads) {
  TempDir tmp;
  ResultsDb db(tmp.file("shared.sqlite"));
  const int64_t id = db.begin_run(make_spec("shared", 0)).id;
  auto writer = [&](int64_t first) {
    for (int64_t i = first; i < first + 100; ++i) db.add_sample(id, i, "k", sample_json(i));
  };
  std::thread t0(writer, 0);
  std::thread t1(writer, 100);
  t0.join();
  t1.join();
  EXPECT_EQ(db.done_sample_indices(id), range_set(0, 200));
}

TEST(ResultsDbConcurrency, TwoProcessesLoseNothing) {
  TempDir tmp;
  const std::string path = tmp.file("fresh/p.sqlite");  // no ResultsDb is open in this process
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        int64_t id = 0;
        write_samples(path, c * kPerWriter, &id, c);  // one run each: a run has one holder
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", c, e.what());
        code = 1;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  ResultsDb db(path);
  auto runs = db.list_runs();
  ASSERT_EQ(runs.size(), 2u);
  for (const auto& run : runs) {
    const int variant = json::parse(run.config_json)["variant"];
    EXPECT_EQ(db.done_sample_indices(run.id),
              range_set(variant * kPerWriter, (variant + 1) * kPerWriter));
  }
  EXPECT_EQ(raw_one(path, "PRAGMA integrity_check"), "ok");
}

TEST(ResultsDbKillSafety, ProcessKilledMidTransactionLeavesNoPartialRows) {
  TempDir tmp;
  const std::string path = tmp.file("k.sqlite");
  int64_t id = 0;
  {
    ResultsDb db(path);
    id = db.begin_run(make_spec("kill", 0)).id;
    for (int64_t i = 0; i < 10; ++i) db.add_sample(id, i, "k", sample_json(i));
    db.fail_run(id, "handed to the child");  // releases this process's lease on the run
  }  // closed before fork: a SQLite connection must not be shared with a child

  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      ResultsDb db(path);
      db.begin_run(make_spec("kill", 0));  // resumed: the child holds it
      db.transaction([&] {
        // Enough rows that SQLite spills pages into the WAL before the (never reached) commit.
        const std::string big(20000, 'x');
        for (int64_t i = 10; i < 60; ++i) {
          db.add_sample(id, i, "k", json{{"pad", big}}.dump());
        }
        db.put_metrics(id, {{"partial", 1.0}});
        ::_exit(9);  // dies holding the write lock, mid-transaction
      });
    } catch (...) {
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 9);

  ResultsDb db(path);
  EXPECT_EQ(db.done_sample_indices(id), range_set(0, 10));
  EXPECT_TRUE(db.metrics(id).empty());
  EXPECT_EQ(raw_one(path, "PRAGMA integrity_check"), "ok");
  // The lock died with the child, and so did its lease: this process takes the run over and can
  // write and finish it.
  EXPECT_EQ(error_of([&] { db.add_sample(id, 10, "k", sample_json(10)); }).find("lost the run") !=
                std::string::npos,
            true);
  const RunInfo again = db.begin_run(make_spec("kill", 0));
  EXPECT_TRUE(contains(again.taken_over_from, "no longer exists")) << again.taken_over_from;
  db.add_sample(id, 10, "k", sample_json(10));
  db.finish_run(id, {{"ppl", 3.0}}, 1.0);
  EXPECT_EQ(db.find_run(id)->status, RunStatus::kDone);
}

TEST(ResultsDbKillSafety, ProcessKilledBeforeFinishCommitKeepsRunResumable) {
  TempDir tmp;
  const std::string path = tmp.file("k.sqlite");
  int64_t id = 0;
  {
    ResultsDb db(path);
    id = db.begin_run(make_spec("kill", 1)).id;
    db.add_sample(id, 0, "k", sample_json(0));
    db.fail_run(id, "handed to the child");
  }
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      ResultsDb db(path);
      db.begin_run(make_spec("kill", 1));
      db.transaction([&] {
        db.finish_run(id, {{"ppl", 1.0}}, 1.0);  // joins the transaction: not yet committed
        db.begin_run(make_spec("kill", 2));
        ::kill(::getpid(), SIGKILL);
      });
    } catch (...) {
    }
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  ResultsDb db(path);
  EXPECT_EQ(db.find_run(id)->status, RunStatus::kRunning);
  EXPECT_TRUE(db.metrics(id).empty());
  EXPECT_EQ(db.list_runs().size(), 1u);  // the second run's insert died with the transaction
  RunInfo resumed = db.begin_run(make_spec("kill", 1));
  EXPECT_EQ(resumed.id, id);
  EXPECT_TRUE(resumed.resumed);
  EXPECT_EQ(resumed.done_samples, 1);
  EXPECT_TRUE(contains(resumed.taken_over_from, std::to_string(pid))) << resumed.taken_over_from;
}

}  // namespace
}  // namespace kvb
