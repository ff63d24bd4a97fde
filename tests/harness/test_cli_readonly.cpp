// The read commands (leaderboard, show, compare, merge's inputs) open results DBs for reading only:
// a DB in a read-only directory is readable and no byte or time of it changes, an empty or damaged
// file is refused by name, and what they print from a DB cannot drive the terminal or inject HTML
// into Markdown. Also: run refuses a damaged DB before writing to it, and flags and quoted inputs
// are bounded.

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include "harness/eval/run_config.h"
#include "harness/eval/stream.h"
#include "harness/store/config_hash.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using json = nlohmann::json;
using test::run_kvbench;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file's bytes and modification time: equal before and after means it was not written.
std::pair<std::string, int64_t> file_state(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return {slurp(path), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename());
  return out;
}

// A stream run as the protocol stores it (4 samples), finished; `method` and `error` as given (a
// non-empty error makes it a failed run).
void add_run(ResultsDb& db, const std::string& method, double budget,
             const std::string& error = "") {
  const json cfg = {{"model", "m"},
                    {"device", "cpu"},
                    {"dtype", "fp32"},
                    {"threads", 0},
                    {"seed", 0},
                    {"label", ""},
                    {"method", {{"name", method}, {"params", {{"budget", budget}}}}},
                    {"protocol",
                     {{"name", "stream"},
                      {"dataset", "d"},
                      {"window", 5},
                      {"stride", 0},
                      {"max_windows", 4},
                      {"prefill_tokens", 1},
                      {"prefill_chunk", 512}}}};
  RunSpec spec;
  spec.config_json = canonical_json(cfg);
  spec.config_hash = run_config_hash(cfg);
  spec.method = method;
  spec.model = "m";
  spec.dataset = "d";
  spec.protocol = "stream";
  const int64_t id = db.begin_run(spec).id;
  if (!error.empty()) {
    db.fail_run(id, error);
    return;
  }
  std::vector<StreamSampleResult> all;
  for (int i = 0; i < 4; ++i) {
    const auto bytes = static_cast<int64_t>(400 * budget);
    const json s = {{"tokens", 4},
                    {"nll_sum", 4.0 + 0.1 * i},
                    {"kl", {budget, budget, budget, budget}},
                    {"top1_agree", 3},
                    {"abs_dprob_sum", 0.0},
                    {"baseline_from_cache", false},
                    {"counters", json::object()},
                    {"ledger",
                     {{"tokens_seen", 4},
                      {"baseline_bytes", 400},
                      {"device_payload_bytes", bytes},
                      {"device_metadata_bytes", 0},
                      {"device_index_bytes", 0},
                      {"device_reserved_bytes", 0},
                      {"host_bytes", 0},
                      {"remote_bytes", 0},
                      {"logical_bytes", bytes},
                      {"tokens_held", 4}}}};
    db.add_sample(id, i, "key" + std::to_string(i), s.dump());
    all.push_back(StreamSampleResult::from_json(s));
  }
  db.finish_run(id, stream_metrics(all, false), 1.0);
}

// A DB at rest (closed) with two finished runs and a failed one, in a directory of its own.
struct Archive {
  std::string dir = test::make_temp_dir("ro");
  std::string db = dir + "/db.sqlite";
  explicit Archive(const std::string& method = "evict", const std::string& error = "oom") {
    ResultsDb d(db);
    add_run(d, method, 0.5);
    add_run(d, method, 0.25);
    add_run(d, method, 0.1, error);
  }
};

// run_kvbench, but as a user that may not write what root owns: as root (whom permissions do not
// stop) the command runs as uid/gid 65534 through setpriv. Empty `prefix`: not needed here.
std::string unprivileged_prefix() {
  if (::geteuid() != 0) return "";
  return "setpriv --reuid=65534 --regid=65534 --clear-groups ";
}

test::CommandResult run_unprivileged(const std::string& args) {
  const std::string dir = test::make_temp_dir("cli_ro");
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  const std::string cmd = unprivileged_prefix() + test::kvbench_binary() + " " + args + " >" + out +
                          " 2>" + err + " </dev/null";
  const int status = std::system(cmd.c_str());
  test::CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove_all(dir);
  return r;
}

TEST(CliReadOnly, ReadCommandsReadAReadOnlyDirectoryAndChangeNothing) {
  if (::geteuid() == 0 && std::system("setpriv --version >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "running as root without setpriv: a read-only directory cannot be made";
  Archive a;
  const std::string out_dir = test::make_temp_dir("ro_out");
  const auto before = file_state(a.db);
  const auto listing = entries(a.dir);
  ASSERT_EQ(::chmod(a.db.c_str(), 0444), 0);
  ASSERT_EQ(::chmod(a.dir.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(out_dir.c_str(), 0777), 0);
  for (const std::string& args :
       {"leaderboard --db " + a.db, "show 1 --db " + a.db, "compare 1 2 --db " + a.db,
        "compare --db-a " + a.db + " --db-b " + a.db,
        "merge " + out_dir + "/merged.sqlite " + a.db}) {
    auto r = run_unprivileged(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("error"), std::string::npos) << args << "\n" << r.err;
  }
  ::chmod(a.dir.c_str(), 0755);
  EXPECT_TRUE(file_state(a.db) == before);
  EXPECT_EQ(entries(a.dir), listing);
  ResultsDb merged(out_dir + "/merged.sqlite", ResultsDb::read_only_options());
  EXPECT_EQ(merged.list_runs().size(), 3u);
}

TEST(CliReadOnly, EmptyFileDirectoryAndGarbageAreRefusedByName) {
  const std::string dir = test::make_temp_dir("ro_bad");
  const std::string empty = dir + "/empty.sqlite";
  std::ofstream(empty).close();
  const std::string garbage = dir + "/garbage.sqlite";
  std::ofstream(garbage) << std::string(3000, 'g');
  const std::string folder = dir + "/folder.sqlite";
  std::filesystem::create_directories(folder);
  // Every read command with the empty file (one open path for all), the others once each.
  const std::string out = dir + "/out.sqlite";
  const std::tuple<std::string, std::string, std::string> cases[] = {
      {"leaderboard --db " + empty, empty, ": empty file (0 bytes)"},
      {"show 1 --db " + empty, empty, ": empty file (0 bytes)"},
      {"compare 1 2 --db " + empty, empty, ": empty file (0 bytes)"},
      {"merge " + out + " " + empty, empty, ": empty file (0 bytes)"},
      {"compare --db-a " + garbage + " --db-b " + garbage, garbage, "not a SQLite database"},
      {"leaderboard --db " + folder, folder, "is a directory"}};
  for (const auto& [args, path, what] : cases) {
    auto r = run_kvbench(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(path), std::string::npos) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << args << "\n" << r.err;
  }
  EXPECT_EQ(std::filesystem::file_size(empty), 0u);
  EXPECT_EQ(slurp(garbage), std::string(3000, 'g'));
  EXPECT_EQ(entries(dir),
            (std::set<std::string>{"empty.sqlite", "garbage.sqlite", "folder.sqlite"}));
}

TEST(CliReadOnly, MergeLeavesAnOlderSchemaInputByteIdentical) {
  const std::string dir = test::make_temp_dir("ro_v1");
  const std::string in = dir + "/v1.sqlite";
  {
    const std::vector<store_detail::Migration> v1 = {store_detail::builtin_migrations()[0]};
    ResultsDb::Options o;
    o.migrations = &v1;
    ResultsDb db(in, o);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(in.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "INSERT INTO runs (config_hash, config_json, method, status, created_at, "
                         "started_at) VALUES ('abcd1234', '{}', 'full', 'done', 't', 't')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  const auto before = file_state(in);
  auto r = run_kvbench("merge --json " + dir + "/out.sqlite " + in);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["runs_added"], 1);
  EXPECT_TRUE(file_state(in) == before);
  auto show = run_kvbench("show abcd1234 --json --db " + in);  // read through a migrated copy
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_EQ(json::parse(show.out)["method"], "full");
  EXPECT_TRUE(file_state(in) == before);
}

TEST(CliReadOnly, DamagedDbIsRefusedByShowAndByRunBeforeItWrites) {
  Archive a;
  {
    ResultsDb d(a.db);  // grow the file so that the damage lands in a sample page
    d.transaction([&] {
      for (int i = 0; i < 60; ++i) add_run(d, "grow", 0.01 * (i + 2));
    });
  }
  std::string bytes = slurp(a.db);
  const size_t page = 4096;
  ASSERT_GT(bytes.size(), 12 * page);
  for (size_t i = 8 * page; i < 8 * page + 64; ++i) bytes[i] = static_cast<char>(0xA5);
  std::ofstream(a.db, std::ios::binary) << bytes;
  const auto before = file_state(a.db);
  auto show = run_kvbench("show 1 --db " + a.db);
  EXPECT_EQ(show.exit_code, 2) << show.out << show.err;
  EXPECT_NE(show.err.find(a.db + ": fails PRAGMA quick_check"), std::string::npos) << show.err;
  auto merge = run_kvbench("merge " + a.dir + "/out.sqlite " + a.db);
  EXPECT_EQ(merge.exit_code, 2) << merge.out << merge.err;
  EXPECT_NE(merge.err.find(a.db + ": fails PRAGMA quick_check"), std::string::npos) << merge.err;
  const std::string cfg = a.dir + "/run.json";
  std::ofstream(cfg)
      << R"({"model": ")" + test::models_dir() +
             R"(/stories260K", "method": "full", "protocol": {"name": "stream", )"
             R"("dataset": "tinystories-valid-sample", "window": 32, "max_windows": 1}})";
  auto run = run_kvbench("run -q -c " + cfg + " --db " + a.db + " --data-dir " + test::data_dir());
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_NE(run.err.find(a.db + ": fails PRAGMA quick_check"), std::string::npos) << run.err;
  EXPECT_TRUE(file_state(a.db) == before);
}

TEST(CliReadOnly, TextFromTheDbCannotDriveTheTerminalOrInjectHtml) {
  Archive a("\x1b[31mevict", "<script>alert(1)</script> & \x1b]0;title\x07");
  auto show = run_kvbench("show 3 --db " + a.db);
  ASSERT_EQ(show.exit_code, 0) << show.err;
  EXPECT_EQ(show.out.find('\x1b'), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("method \\x1b[31mevict"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("\\x1b]0;title\\x07"), std::string::npos) << show.out;
  auto cmp = run_kvbench("compare 1 2 --db " + a.db);
  ASSERT_EQ(cmp.exit_code, 0) << cmp.err;
  EXPECT_EQ(cmp.out.find('\x1b'), std::string::npos) << cmp.out;
  EXPECT_NE(cmp.out.find("\\x1b[31mevict"), std::string::npos) << cmp.out;
  auto md = run_kvbench("leaderboard --db " + a.db + " -o " + a.dir + "/lb.md");
  ASSERT_EQ(md.exit_code, 0) << md.err;
  const std::string text = slurp(a.dir + "/lb.md");
  EXPECT_EQ(text.find("<script>"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; \\x1b]0;title\\x07"),
            std::string::npos)
      << text;
  auto term = run_kvbench("leaderboard --db " + a.db);
  ASSERT_EQ(term.exit_code, 0) << term.err;
  EXPECT_EQ(term.out.find('\x1b'), std::string::npos) << term.out;
}

TEST(CliReadOnly, ConfigsOfAForeignShapeAreUserErrors) {
  for (const char* config : {"[]", R"({"method": {"name": "x", "params": 3}})",
                             R"({"method": {"name": "x"}, "protocol": {"context": "long"}})"}) {
    Archive a;
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(a.db.c_str(), &raw), SQLITE_OK);
    const std::string sql =
        std::string("UPDATE runs SET config_json = '") + config + "' WHERE id = 1";
    ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(raw);
    sqlite3_close(raw);
    auto r = run_kvbench("leaderboard --db " + a.db);
    EXPECT_EQ(r.exit_code, 2) << config << "\n" << r.err;
    EXPECT_NE(r.err.find(a.db + ": run 1 config"), std::string::npos) << config << "\n" << r.err;
  }
}

TEST(CliReadOnly, QuotedInputsAndFlagsAreBounded) {
  Archive a;
  // A 100 KB run reference is quoted by its head and length.
  auto r = run_kvbench("show " + std::string(100000, 'z') + " --db " + a.db);
  EXPECT_EQ(r.exit_code, 2) << r.err.substr(0, 500);
  EXPECT_LT(r.err.size(), 600u) << r.err.substr(0, 600);
  EXPECT_NE(r.err.find("... (100000 bytes in all)"), std::string::npos) << r.err.substr(0, 600);
  const std::pair<std::string, std::string> flags[] = {
      {"compare 1 2 --resamples 100000000 --db " + a.db,
       "--resamples: 100000000 is out of range; expected 1..10000000"},
      {"bench --model " + test::models_dir() + "/stories260K --batch 1,5000",
       "--batch: 5000 is out of range; expected 1..1024"},
      {"bench --model " + test::models_dir() + "/stories260K --context 4096",
       "is longer than the context of model"},
      {"bench --model " + test::models_dir() + "/stories260K --batch 1024 --context 65536",
       "tokens in flight"},
      {"bench --model " + test::models_dir() + "/stories260K --repeats 100000",
       "--repeats: 100000 is out of range; expected 1..1000"}};
  for (const auto& [args, needle] : flags) {
    auto f = run_kvbench(args);
    EXPECT_EQ(f.exit_code, 2) << args << "\n" << f.err;
    EXPECT_NE(f.err.find(needle), std::string::npos) << args << "\n" << f.err;
  }
}

}  // namespace
}  // namespace kvb
