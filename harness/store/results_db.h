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
//
// Leases: the process that begins a run holds it (a row in run_leases naming the process, renewed
// by a heartbeat, see lease_heartbeat.h) until it finishes or fails it, so that several processes
// on one DB (two `kvbench grid` on one --db) never compute a run twice or fail another's live run.
// begin_run on a run another live process holds changes nothing and reports the holder (held_by);
// a run whose holder is gone (same machine: its pid exited or was reused; another machine: its
// lease expired) is taken over. Writes to a run (samples, finish, fail) need its lease.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/error.h"
#include "harness/store/process_identity.h"

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

// A write to (or begin of) a run that another process holds, or held and took over after this one's
// lease lapsed. The caller should leave the run alone: its holder computes, finishes or fails it.
class RunHeldElsewhere : public Error {
 public:
  RunHeldElsewhere(std::string message, std::string holder)
      : Error(std::move(message)), holder_(std::move(holder)) {}
  const std::string& holder() const { return holder_; }  // RunLease::describe() of the holder

 private:
  std::string holder_;
};

// Who holds a run, read from run_leases and judged from the calling process.
struct RunLease {
  ProcessIdentity holder;
  std::string acquired_at;   // when the holder began (or took over) the run
  std::string heartbeat_at;  // the holder's last renewal
  std::string
      expires_at;     // heartbeat_at + the holder's lease time; judges holders on other machines
  bool ours = false;  // held by the calling process
  bool live = false;  // ours, alive on this machine, or (another machine) not yet expired
  std::string gone_reason;  // when !live: why the holder counts as gone
  // "host:pid (alive on this machine)", "host:pid (another machine; lease until T)", ...
  std::string describe() const;
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
  // Non-empty: another live process holds the run (RunLease::describe()); nothing was changed and
  // the caller must not compute it.
  std::string held_by;
  // Non-empty: the run was 'running' under a holder that is gone, and this call took it over; says
  // who and why ("host:pid: pid 123 no longer exists").
  std::string taken_over_from;
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
  int64_t runs_held = 0;      // running here under a live process: left to it, changed in no way
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
    // How long a run's lease lasts after its holder's last renewal (LeaseHeartbeat renews it every
    // quarter of this). Decides only for holders on another machine: on this one, a holder counts
    // as alive exactly as long as its process exists. Hosts sharing a DB must agree on the time to
    // well within this.
    int lease_ttl_s = 60;
    // Replaces the built-in schema; for tests of the migration mechanism only.
    const std::vector<store_detail::Migration>* migrations = nullptr;
    // Open for reading only (the read commands: leaderboard, show, compare, grid --dry-run and
    // merge's inputs): nothing is ever written to the file, its directory may be read-only, and a
    // writer's open transaction does not block it (WAL readers see the last commit). The file must
    // exist and be a kvbench results DB; an older schema is read through a migrated copy in memory
    // (the file keeps its version). Every write operation fails.
    bool read_only = false;
    // Run check_integrity() on an existing file before anything is written to it (the journal
    // mode, migrations, the command's rows): what the commands that add runs (run, grid) open with,
    // so that a damaged DB fails loudly instead of taking rows it may garble.
    bool check_integrity = false;
  };
  static Options read_only_options();

  // Opens or creates the DB at `path` (creating missing parent directories), switches it to WAL
  // mode and applies pending migrations, each in its own transaction; with options.read_only,
  // opens it as described there. Throws kvb::Error naming the path if the file is not a SQLite DB,
  // has a newer schema than this build knows, or cannot be opened.
  explicit ResultsDb(std::string path);
  ResultsDb(std::string path, Options options);
  ~ResultsDb();
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;

  const std::string& path() const { return path_; }
  const Options& options() const { return options_; }
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
  // Registers the run identified by spec.config_hash and takes its lease. A new hash inserts a
  // 'running' run. An existing 'running' or 'failed' run is resumed: status back to 'running',
  // error and finish fields cleared, attempts + 1, provenance and worker updated, stored samples
  // kept. A 'done' run is left untouched and reported with already_done. A run another live process
  // holds is left untouched and reported with held_by. Throws if the hash exists with a different
  // config_json.
  RunInfo begin_run(const RunSpec& spec);
  // Writes run-level metrics and marks the run 'done' in one transaction, releasing its lease. The
  // run must be 'running' and not held by another process (RunHeldElsewhere).
  void finish_run(int64_t run_id, const std::vector<Metric>& metrics, double wall_s);
  // Marks the run 'failed' with `error`, releasing its lease; its samples stay so a later begin_run
  // resumes them. Throws RunHeldElsewhere rather than fail a run another process holds.
  void fail_run(int64_t run_id, const std::string& error, std::optional<double> wall_s = {});
  // The run's lease; empty when nobody holds it (finished, failed, or begun before leases existed).
  std::optional<RunLease> lease(int64_t run_id);
  // Extends the calling process's lease on the run; false (changing nothing) when the run is not
  // held by this process any more.
  bool renew_lease(int64_t run_id);
  // Deletes a run with its samples and metrics (for re-running from scratch). Returns false if
  // absent.
  bool delete_run(int64_t run_id);

  std::optional<RunRow> find_run(int64_t run_id);
  std::optional<RunRow> find_run_by_hash(const std::string& config_hash);
  std::vector<RunRow> list_runs(const RunFilter& filter = {});  // ordered by id

  // --- samples ---
  // Stores sample `index` of a 'running' run this process holds. Writing an index that is already
  // stored REPLACES that row (the latest result wins; there is never a duplicate), so a retried
  // sample is harmless.
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
  // this one. Runs are matched by config_hash: a 'done' run here is kept; a 'done' run in the
  // source replaces a non-done one here; two non-done runs are united sample by sample; a run that
  // a live process holds here is left to it (it finishes the run itself). The source is opened
  // read-only and checked with quick_check; an older-schema source is read through a migrated
  // temporary copy (the file itself is never written); a newer one is refused. Each run is copied
  // in one transaction, several runs to a transaction while they take little time, so a killed
  // merge leaves whole runs only (merging again completes it) and a live writer on this DB never
  // waits for more than a short stretch of the merge.
  MergeStats merge_from(const std::string& other_path);

  // Writes a consistent copy of this DB (as read now) to a new file at `path` (SQLite's backup).
  void save_copy(const std::string& path);

 private:
  class Txn;
  class Stmt;
  friend class Txn;

  void open(const std::vector<store_detail::Migration>& migrations);
  void open_read_only(const std::vector<store_detail::Migration>& migrations);
  void migrate(const std::vector<store_detail::Migration>& migrations, int known_version);
  void exec(const std::string& sql);
  std::string switch_to_wal();  // returns the journal mode now in effect
  [[noreturn]] void fail_sqlite(const std::string& what, int rc);
  RunStatus run_status_or_throw(int64_t run_id);
  void require_running(int64_t run_id, const char* operation);
  // Throws RunHeldElsewhere when another process holds the run (live or not: a gone holder's run is
  // taken over by begin_run, never written to directly).
  void require_lease(int64_t run_id, const char* operation);
  void write_lease(int64_t run_id, const std::string& acquired_at);  // this process, now
  void drop_lease(int64_t run_id);
  void insert_sample(int64_t run_id, int64_t index, const std::string& key,
                     const std::string& output_json);
  void insert_metrics(int64_t run_id, const std::vector<Metric>& metrics);
  std::optional<RunRow> read_run(const std::string& where, const std::function<void(Stmt&)>& bind);

  std::string path_;
  Options options_;
  sqlite3* db_ = nullptr;
  std::recursive_mutex mutex_;
  int txn_depth_ = 0;  // 0: no transaction open; >0: nesting depth (savepoints beyond the first)
  bool in_memory_copy_ = false;  // read_only on an older schema: db_ is a migrated copy in memory
};

}  // namespace kvb
