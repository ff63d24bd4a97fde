#pragma once
// ResultsDb: the SQLite results store (schema documented in results/schema.md).
//
// Kill safety: every write operation is one SQLite transaction (BEGIN IMMEDIATE ... COMMIT), so a
// process killed at any point leaves either all of an operation's rows or none. WAL mode plus a
// busy timeout lets several processes (or threads, each with its own ResultsDb) write one file
// without losing rows. Do not keep a ResultsDb open across fork(): close it first and open a new
// one in the child (SQLite's file locks do not survive being shared that way).
//
// Thread safety: one ResultsDb may be used from several threads (calls are serialized by a mutex),
// but parallel writers are better served by one ResultsDb each.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

struct sqlite3;

namespace kvb {

enum class RunStatus { kRunning, kDone, kFailed };
const char* to_string(RunStatus status);           // "running", "done", "failed"
RunStatus parse_run_status(const std::string& s);  // throws kvb::Error for anything else

// Whether a bigger or smaller value is better; leaderboards rank by it without special cases.
enum class Direction { kHigher, kLower, kNone };
const char* to_string(Direction direction);       // "higher", "lower", "none"
Direction parse_direction(const std::string& s);  // throws kvb::Error for anything else

// What begin_run records about a new run. JSON fields are JSON text (validated by the DB).
struct RunSpec {
  std::string config_hash;  // identifies the run: config_hash(resolved config)
  std::string config_json;  // canonical_json(resolved config)
  std::string method;
  std::string model;
  std::string dataset;
  std::string protocol;
  std::string grid;        // grid name when the run is part of one, else ""
  bool simulated = false;  // the method only simulates its compression (see DESIGN.md §2)
  std::string provenance_json = "{}";
};

// begin_run's answer.
struct RunInfo {
  int64_t id = 0;
  RunStatus status = RunStatus::kRunning;  // after the call: kRunning, or kDone when already_done
  bool already_done = false;               // the run finished before: the caller should skip it
  bool resumed = false;                    // the run existed (running or failed) and was reopened
  int64_t done_samples = 0;                // samples already stored for this run
  int64_t attempts = 1;                    // how many times begin_run has (re)opened this run
  std::string previous_worker;             // resumed runs: "host:pid" that held the run before
};

// One row of `runs`.
struct RunRow {
  int64_t id = 0;
  std::string config_hash;
  std::string config_json;
  std::string method;
  std::string model;
  std::string dataset;
  std::string protocol;
  std::string grid;
  bool simulated = false;
  RunStatus status = RunStatus::kRunning;
  std::string error;  // "" unless failed
  int64_t attempts = 1;
  std::string worker;  // "host:pid" of the last process that began the run
  std::string created_at;
  std::string started_at;
  std::string finished_at;       // "" until done or failed
  std::optional<double> wall_s;  // set by finish_run / fail_run
  std::string provenance_json;
};

// One row of `samples`.
struct SampleRow {
  int64_t index = 0;
  std::string
      key;  // e.g. the sample's content hash, to check that a resumed run sees the same data
  std::string output_json;
  std::string created_at;
};

// One row of `metrics`. (run_id, name, layer, head) is unique; writing it again replaces the row.
struct Metric {
  Metric() = default;
  Metric(std::string name_, double value_, std::string unit_ = "",
         Direction direction_ = Direction::kNone)
      : name(std::move(name_)), value(value_), unit(std::move(unit_)), direction(direction_) {}

  std::string name;
  double value = 0.0;  // NaN is stored as SQL NULL and read back as NaN
  std::string unit;    // e.g. "nats", "bytes", "ms", "" for dimensionless
  Direction direction = Direction::kNone;
  std::optional<int64_t> layer;  // empty: not a per-layer value
  std::optional<int64_t> head;   // empty: not a per-head value
  std::optional<int64_t> n;      // number of observations aggregated into value
  std::optional<double> ci_low;  // confidence interval, when the metric has one
  std::optional<double> ci_high;
};

// One row of `artifacts`: a file (calibration data, cached baseline outputs) known by its content
// hash.
struct Artifact {
  std::string hash;  // sha256_hex of the content
  std::string kind;
  std::string path;
  int64_t bytes = 0;
  std::string created_at;  // set by put_artifact when empty
  std::string meta_json = "{}";
};

// list_runs filter: empty strings and an empty status match everything.
struct RunFilter {
  std::string method;
  std::string model;
  std::string dataset;
  std::string protocol;
  std::string grid;
  std::optional<RunStatus> status;
};

// What merge_from did.
struct MergeStats {
  int64_t runs_added = 0;     // hash not here before
  int64_t runs_replaced = 0;  // here but not done, done in the source: the source's run replaced it
  int64_t runs_combined = 0;  // not done in either: samples and metrics united (this DB's rows win)
  int64_t runs_skipped = 0;   // already done here: kept as is
  int64_t samples_copied = 0;
  int64_t metrics_copied = 0;
  int64_t artifacts_added = 0;
};

namespace store_detail {
// A schema migration: `sql` (one or more statements) brings user_version from `version - 1` to
// `version`. The built-in list is ResultsDb's schema; tests pass their own to exercise the
// mechanism.
struct Migration {
  int version;
  std::string sql;
};
const std::vector<Migration>& builtin_migrations();
}  // namespace store_detail

class ResultsDb {
 public:
  struct Options {
    int busy_timeout_ms = 30000;  // how long a writer waits for another process's transaction
    // Replaces the built-in schema; for tests of the migration mechanism only.
    const std::vector<store_detail::Migration>* migrations = nullptr;
  };

  // Opens or creates the DB at `path` (creating missing parent directories), switches it to WAL
  // mode and applies pending migrations, each in its own transaction. Throws kvb::Error naming the
  // path if the file is not a SQLite DB, has a newer schema than this build knows, or cannot be
  // opened.
  explicit ResultsDb(std::string path);
  ResultsDb(std::string path, Options options);
  ~ResultsDb();
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;

  const std::string& path() const { return path_; }
  static int latest_schema_version();  // the version a DB has after opening with the built-in list
  int schema_version();                // PRAGMA user_version of this file
  // PRAGMA quick_check (O(pages), no index cross-check): throws kvb::Error naming the file and
  // SQLite's first complaint when the file is damaged. Readers that summarise a whole DB call it so
  // that a damaged page fails loudly instead of silently dropping or garbling rows.
  void check_integrity();

  // Runs `fn` inside one transaction: its writes commit together or, if it throws (or the process
  // dies), not at all. Operations called inside it join it (as savepoints) instead of committing
  // separately, which also makes batched sample writes cheaper.
  void transaction(const std::function<void()>& fn);

  // --- runs ---
  // Registers the run identified by spec.config_hash. A new hash inserts a 'running' run. An
  // existing 'running' or 'failed' run is resumed: status back to 'running', error and finish
  // fields cleared, attempts + 1, provenance and worker updated, stored samples kept. A 'done' run
  // is left untouched and reported with already_done. Throws if the hash exists with a different
  // config_json.
  RunInfo begin_run(const RunSpec& spec);
  // Writes run-level metrics and marks the run 'done' in one transaction. The run must be
  // 'running'.
  void finish_run(int64_t run_id, const std::vector<Metric>& metrics, double wall_s);
  // Marks the run 'failed' with `error`; its samples stay so a later begin_run resumes them.
  void fail_run(int64_t run_id, const std::string& error, std::optional<double> wall_s = {});
  // Deletes a run with its samples and metrics (for re-running from scratch). Returns false if
  // absent.
  bool delete_run(int64_t run_id);

  std::optional<RunRow> find_run(int64_t run_id);
  std::optional<RunRow> find_run_by_hash(const std::string& config_hash);
  std::vector<RunRow> list_runs(const RunFilter& filter = {});  // ordered by id

  // --- samples ---
  // Stores sample `index` of a 'running' run. Writing an index that is already stored REPLACES that
  // row (the latest result wins; there is never a duplicate), so a retried sample is harmless.
  void add_sample(int64_t run_id, int64_t index, const std::string& key,
                  const std::string& output_json);
  // The same plus metric rows (e.g. running aggregates) in one transaction, so the two cannot
  // disagree after a crash.
  void add_sample_with_metrics(int64_t run_id, int64_t index, const std::string& key,
                               const std::string& output_json, const std::vector<Metric>& metrics);
  std::set<int64_t> done_sample_indices(int64_t run_id);
  std::map<int64_t, std::string> done_sample_keys(int64_t run_id);  // index -> key
  std::vector<SampleRow> samples(int64_t run_id);                   // ordered by index
  int64_t sample_count(int64_t run_id);

  // --- metrics ---
  // Inserts or replaces metric rows of any existing run (one transaction).
  void put_metrics(int64_t run_id, const std::vector<Metric>& metrics);
  // Ordered by name, then layer and head (non-per-layer rows first).
  std::vector<Metric> metrics(int64_t run_id);

  // --- artifacts ---
  // Records an artifact; returns false (and changes nothing) if its hash is already recorded, since
  // equal hashes mean equal content.
  bool put_artifact(const Artifact& artifact);
  std::optional<Artifact> find_artifact(const std::string& hash);
  std::vector<Artifact> list_artifacts(const std::string& kind = "");  // "" = all kinds

  // --- merge ---
  // Copies runs (with samples and metrics) and artifacts from the results DB at `other_path` into
  // this one, in one transaction. Runs are matched by config_hash: a 'done' run here is kept; a
  // 'done' run in the source replaces a non-done one here; two non-done runs are united sample by
  // sample. An older-schema source is migrated first; a newer one is refused.
  MergeStats merge_from(const std::string& other_path);

 private:
  class Txn;
  class Stmt;
  friend class Txn;

  void open(const std::vector<store_detail::Migration>& migrations);
  void exec(const std::string& sql);
  std::string switch_to_wal();  // returns the journal mode now in effect
  [[noreturn]] void fail_sqlite(const std::string& what, int rc);
  RunStatus run_status_or_throw(int64_t run_id);
  void require_running(int64_t run_id, const char* operation);
  void insert_sample(int64_t run_id, int64_t index, const std::string& key,
                     const std::string& output_json);
  void insert_metrics(int64_t run_id, const std::vector<Metric>& metrics);
  std::optional<RunRow> read_run(const std::string& where, const std::function<void(Stmt&)>& bind);

  std::string path_;
  Options options_;
  sqlite3* db_ = nullptr;
  std::recursive_mutex mutex_;
  int txn_depth_ = 0;  // 0: no transaction open; >0: nesting depth (savepoints beyond the first)
};

}  // namespace kvb
