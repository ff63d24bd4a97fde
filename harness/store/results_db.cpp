#include "harness/store/results_db.h"

#include <sqlite3.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "harness/common/disk_full_error.h"
#include "harness/common/enum_names.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/store/process_identity.h"
#include "harness/store/provenance.h"

namespace kvb {

// ---------------------------------------------------------------------------------------------------
// Schema. Never edit a migration that has shipped: add a new one. A migration that must rebuild a
// table follows SQLite's 12-step ALTER TABLE procedure (foreign keys are on).

namespace store_detail {

const std::vector<Migration>& builtin_migrations() {
  static const std::vector<Migration> kMigrations = {
      {1, R"sql(
CREATE TABLE runs (
  id              INTEGER PRIMARY KEY,
  config_hash     TEXT    NOT NULL UNIQUE CHECK (config_hash <> ''),
  config_json     TEXT    NOT NULL CHECK (json_valid(config_json)),
  method          TEXT    NOT NULL DEFAULT '',
  model           TEXT    NOT NULL DEFAULT '',
  dataset         TEXT    NOT NULL DEFAULT '',
  protocol        TEXT    NOT NULL DEFAULT '',
  grid            TEXT    NOT NULL DEFAULT '',
  simulated       INTEGER NOT NULL DEFAULT 0 CHECK (simulated IN (0, 1)),
  status          TEXT    NOT NULL CHECK (status IN ('running', 'done', 'failed')),
  error           TEXT,
  attempts        INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 1),
  worker          TEXT    NOT NULL DEFAULT '',
  created_at      TEXT    NOT NULL,
  started_at      TEXT    NOT NULL,
  finished_at     TEXT,
  wall_s          REAL,
  provenance_json TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(provenance_json))
);
CREATE INDEX runs_by_selection ON runs (method, model, dataset, protocol);
CREATE INDEX runs_by_grid ON runs (grid, status);

CREATE TABLE samples (
  run_id       INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  sample_index INTEGER NOT NULL CHECK (sample_index >= 0),
  sample_key   TEXT    NOT NULL DEFAULT '',
  output_json  TEXT    NOT NULL CHECK (json_valid(output_json)),
  created_at   TEXT    NOT NULL,
  PRIMARY KEY (run_id, sample_index)
);

CREATE TABLE metrics (
  run_id    INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  name      TEXT    NOT NULL CHECK (name <> ''),
  layer     INTEGER CHECK (layer IS NULL OR layer >= 0),
  head      INTEGER CHECK (head IS NULL OR head >= 0),
  value     REAL,
  unit      TEXT    NOT NULL DEFAULT '',
  direction TEXT    NOT NULL DEFAULT 'none' CHECK (direction IN ('higher', 'lower', 'none')),
  n         INTEGER CHECK (n IS NULL OR n >= 0),
  ci_low    REAL,
  ci_high   REAL
);
CREATE UNIQUE INDEX metrics_key ON metrics (run_id, name, ifnull(layer, -1), ifnull(head, -1));

CREATE TABLE artifacts (
  hash       TEXT    PRIMARY KEY CHECK (hash <> ''),
  kind       TEXT    NOT NULL,
  path       TEXT    NOT NULL,
  bytes      INTEGER NOT NULL CHECK (bytes >= 0),
  created_at TEXT    NOT NULL,
  meta_json  TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(meta_json))
);
)sql"},
      // Run leases: which process computes a running run, so that another one on the same DB skips
      // it while that process lives and takes it over once it is gone. One row per held run;
      // merge_from copies none (a lease names a process of the DB it was taken in).
      {2, R"sql(
CREATE TABLE run_leases (
  run_id       INTEGER PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
  host         TEXT    NOT NULL,
  machine      TEXT    NOT NULL,
  pid          INTEGER NOT NULL,
  pid_start    INTEGER NOT NULL,
  acquired_at  TEXT    NOT NULL,
  heartbeat_at TEXT    NOT NULL,
  expires_at   TEXT    NOT NULL
);
)sql"},
  };
  return kMigrations;
}

}  // namespace store_detail

namespace {

constexpr const char* kRunColumns =
    "config_hash, config_json, method, model, dataset, protocol, grid, simulated, status, error, "
    "attempts, worker, created_at, started_at, finished_at, wall_s, provenance_json";

// Creates every missing directory above `path` (mkdir -p of its parent).
void make_parent_dirs(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return;
  const std::string parent = path.substr(0, slash);
  for (size_t pos = 1; pos <= parent.size(); ++pos) {
    if (pos != parent.size() && parent[pos] != '/') continue;
    const std::string prefix = parent.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
      KVB_FAIL("results DB ", path, ": cannot create directory ", prefix, ": ",
               std::strerror(errno));
    }
  }
  struct stat st {};
  KVB_CHECK(::stat(parent.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "results DB ", path, ": ",
            parent, " is not a directory");
}

// Whether the DB at `path` (with its -wal and -journal files) cannot grow: under 1 MiB free for
// this user on its file system, or one of its files within 64 KiB of the process's file size limit.
bool no_room_to_grow(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0 &&
      static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize < (1ull << 20))
    return true;
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return false;
  for (const char* suffix : {"", "-wal", "-journal"}) {
    struct stat st {};
    if (::stat((path + suffix).c_str(), &st) == 0 &&
        static_cast<unsigned long long>(st.st_size) + (64u << 10) >= lim.rlim_cur)
      return true;
  }
  return false;
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// `path` as a SQLite URI filename, every byte that could read as URI syntax percent-encoded, so
// that parameters can follow it and ATTACH can name a file with them.
std::string uri_of(const std::string& path, const std::string& query) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out = !path.empty() && path[0] == '/' ? "file://" : "file:";
  for (const unsigned char c : path) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '/' || c == '.' || c == '_' || c == '-' || c == '~';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return query.empty() ? out : out + "?" + query;
}

// The URI parameters a reader opens the results DB at `path` with. "mode=ro" shares the -shm index
// with the writers, so a WAL DB being written reads as of its last commit; SQLite creates the -shm
// (and an empty -wal) when they are missing, which needs a writable directory. In a read-only
// directory without a -shm (an archive, another user's results) no process has the DB open (every
// open WAL connection keeps one), so "immutable=1" reads the file alone; only a -wal that still
// holds commits would need a -shm to be read, and then the DB cannot be read in place. (A writer
// that starts during such a read is not seen; the file is assumed to be at rest.)
std::string read_only_query(const std::string& path) {
  struct stat st {};
  if (::stat((path + "-shm").c_str(), &st) == 0) return "mode=ro";
  if (::access(dir_of(path).c_str(), W_OK) == 0) return "mode=ro";
  KVB_CHECK(
      ::stat((path + "-wal").c_str(), &st) != 0 || st.st_size == 0, "results DB ", path,
      ": its -wal file holds commits that SQLite can read only with a -shm file, which cannot "
      "be created in the read-only directory ",
      dir_of(path), "; copy the DB with its -wal file to a writable directory and read it there");
  return "immutable=1";
}

// Copies the whole main database of `from` into `to` (SQLite's online backup); SQLite's result
// code.
int copy_database(sqlite3* from, sqlite3* to) {
  sqlite3_backup* backup = sqlite3_backup_init(to, "main", from, "main");
  if (backup == nullptr) return sqlite3_errcode(to);
  const int rc = sqlite3_backup_step(backup, -1);
  sqlite3_backup_finish(backup);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

void check_json(const std::string& db_path, const std::string& text, const std::string& what) {
  KVB_CHECK(nlohmann::json::accept(text), "results DB ", db_path, ": ", what,
            " is not valid JSON: ", text.substr(0, 200));
}

const EnumName<RunStatus> kRunStatuses[] = {
    {RunStatus::kRunning, "running"}, {RunStatus::kDone, "done"}, {RunStatus::kFailed, "failed"}};
const EnumName<Direction> kDirections[] = {
    {Direction::kHigher, "higher"}, {Direction::kLower, "lower"}, {Direction::kNone, "none"}};

}  // namespace

const char* to_string(RunStatus status) { return enum_name(kRunStatuses, status); }
RunStatus parse_run_status(const std::string& s) {
  return parse_enum(kRunStatuses, s, "run status");
}
const char* to_string(Direction direction) { return enum_name(kDirections, direction); }
Direction parse_direction(const std::string& s) {
  return parse_enum(kDirections, s, "metric direction");
}

// ---------------------------------------------------------------------------------------------------
// Stmt: a prepared statement that reports errors through its ResultsDb (so messages name the file).

class ResultsDb::Stmt {
 public:
  Stmt(ResultsDb& db, const std::string& sql) : db_(db) {
    int rc = sqlite3_prepare_v2(db_.db_, sql.c_str(), -1, &stmt_, nullptr);
    if (rc != SQLITE_OK) db_.fail_sqlite("cannot prepare '" + sql + "'", rc);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind_int(int i, int64_t v) { return check_bind(sqlite3_bind_int64(stmt_, i, v)); }
  Stmt& bind_double(int i, double v) {
    // SQLite would store NaN as NULL anyway; doing it explicitly keeps the intent visible.
    if (std::isnan(v)) return bind_null(i);
    return check_bind(sqlite3_bind_double(stmt_, i, v));
  }
  Stmt& bind_text(int i, const std::string& v) {
    return check_bind(
        sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  Stmt& bind_null(int i) { return check_bind(sqlite3_bind_null(stmt_, i)); }
  Stmt& bind_opt_int(int i, const std::optional<int64_t>& v) {
    return v ? bind_int(i, *v) : bind_null(i);
  }
  Stmt& bind_opt_double(int i, const std::optional<double>& v) {
    return v ? bind_double(i, *v) : bind_null(i);
  }

  // True when a row is available; false when the statement is done.
  bool step() {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    db_.fail_sqlite(std::string("cannot execute '") + sqlite3_sql(stmt_) + "'", rc);
  }
  void run() {
    while (step()) {
    }
  }
  // Makes the statement reusable with new bindings.
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  bool is_null(int c) { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
  int64_t col_int(int c) { return sqlite3_column_int64(stmt_, c); }
  double col_double(int c) {
    return is_null(c) ? std::numeric_limits<double>::quiet_NaN() : sqlite3_column_double(stmt_, c);
  }
  std::string col_text(int c) {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, c));
    if (p == nullptr) return "";
    return std::string(p, static_cast<size_t>(sqlite3_column_bytes(stmt_, c)));
  }
  std::optional<int64_t> col_opt_int(int c) {
    return is_null(c) ? std::nullopt : std::optional<int64_t>(col_int(c));
  }
  std::optional<double> col_opt_double(int c) {
    return is_null(c) ? std::nullopt : std::optional<double>(sqlite3_column_double(stmt_, c));
  }

 private:
  Stmt& check_bind(int rc) {
    if (rc != SQLITE_OK) db_.fail_sqlite("cannot bind a parameter", rc);
    return *this;
  }

  ResultsDb& db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// ---------------------------------------------------------------------------------------------------
// Txn: BEGIN IMMEDIATE at the outermost level (so the write lock is taken, with the busy timeout,
// before anything is read: a deferred transaction that reads and then writes can fail with
// SQLITE_BUSY without waiting), SAVEPOINT when nested. Rolls back unless commit() was called, which
// is what makes an exception inside an operation leave nothing behind; a killed process is covered
// by SQLite itself.

class ResultsDb::Txn {
 public:
  explicit Txn(ResultsDb& db) : db_(db), lock_(db.mutex_), depth_(db.txn_depth_) {
    if (depth_ == 0) {
      db_.exec("BEGIN IMMEDIATE");
    } else {
      // An I/O or busy error inside the enclosing transaction may have rolled it back already;
      // carrying on would write outside any transaction.
      KVB_CHECK(!sqlite3_get_autocommit(db_.db_), "results DB ", db_.path_,
                ": the enclosing transaction was rolled back by an earlier error");
      db_.exec(savepoint_name("SAVEPOINT "));
    }
    ++db_.txn_depth_;
  }
  ~Txn() {
    --db_.txn_depth_;
    if (committed_) return;
    // Errors are ignored here: we are usually unwinding from another error, which is the one to
    // report.
    if (depth_ == 0) {
      if (!sqlite3_get_autocommit(db_.db_))
        sqlite3_exec(db_.db_, "ROLLBACK", nullptr, nullptr, nullptr);
    } else if (!sqlite3_get_autocommit(db_.db_)) {
      const std::string sql = savepoint_name("ROLLBACK TO ") + "; " + savepoint_name("RELEASE ");
      sqlite3_exec(db_.db_, sql.c_str(), nullptr, nullptr, nullptr);
    }
  }
  Txn(const Txn&) = delete;
  Txn& operator=(const Txn&) = delete;

  void commit() {
    db_.exec(depth_ == 0 ? std::string("COMMIT") : savepoint_name("RELEASE "));
    committed_ = true;
  }

 private:
  std::string savepoint_name(const char* verb) const {
    return verb + std::string("kvb_sp") + std::to_string(depth_);
  }

  ResultsDb& db_;
  std::unique_lock<std::recursive_mutex> lock_;
  int depth_;
  bool committed_ = false;
};

// ---------------------------------------------------------------------------------------------------

ResultsDb::ResultsDb(std::string path) : ResultsDb(std::move(path), Options{}) {}

ResultsDb::ResultsDb(std::string path, Options options)
    : path_(std::move(path)), options_(options) {
  KVB_CHECK(!path_.empty(), "results DB path is empty");
  const auto& migrations =
      options_.migrations != nullptr ? *options_.migrations : store_detail::builtin_migrations();
  try {
    if (options_.read_only) {
      open_read_only(migrations);
    } else {
      open(migrations);
    }
  } catch (...) {
    sqlite3_close_v2(db_);
    db_ = nullptr;
    throw;
  }
}

ResultsDb::~ResultsDb() { sqlite3_close_v2(db_); }

ResultsDb::Options ResultsDb::read_only_options() {
  Options o;
  o.read_only = true;
  return o;
}

int ResultsDb::latest_schema_version() { return store_detail::builtin_migrations().back().version; }

void ResultsDb::fail_sqlite(const std::string& what, int rc) {
  const std::string detail = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  const int primary = rc & 0xff;
  if (primary == SQLITE_NOTADB) {
    KVB_FAIL("results DB ", path_, ": not a SQLite database (", detail, ")");
  }
  if (primary == SQLITE_CORRUPT) {
    KVB_FAIL("results DB ", path_, ": the database file is corrupt (", detail, ")");
  }
  // SQLite reports ENOSPC on a write as SQLITE_FULL, but EFBIG (a file size limit), EDQUOT and
  // ENOSPC elsewhere as a plain I/O error, and the errno it saved may be a later call's by the time
  // the error arrives; so an I/O error is also checked against the file system and the limit.
  const int err = db_ != nullptr ? sqlite3_system_errno(db_) : 0;
  if (primary == SQLITE_FULL ||
      (primary == SQLITE_IOERR && (is_disk_full_errno(err) || no_room_to_grow(path_)))) {
    throw DiskFullError(
        detail::concat("results DB ", path_, ": ", what, ": no room left to write it (", detail,
                       is_disk_full_errno(err) ? std::string(", ") + std::strerror(err) : "",
                       "); what was committed before is kept"));
  }
  if (primary == SQLITE_BUSY) {
    KVB_FAIL("results DB ", path_, ": ", what, ": locked by another process (", detail, ", code ",
             rc, "; waited up to ", options_.busy_timeout_ms, " ms)");
  }
  KVB_FAIL("results DB ", path_, ": ", what, ": ", detail);
}

void ResultsDb::exec(const std::string& sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
  sqlite3_free(err);  // sqlite3_errmsg(db_) holds the same text for fail_sqlite
  if (rc != SQLITE_OK) fail_sqlite("cannot execute '" + sql.substr(0, 120) + "'", rc);
}

namespace {

int checked_known_version(const std::vector<store_detail::Migration>& migrations) {
  for (size_t i = 0; i < migrations.size(); ++i) {
    KVB_ASSERT(migrations[i].version == static_cast<int>(i) + 1, "results_db",
               "migrations must be numbered 1, 2, ... in order; entry ", i, " has version ",
               migrations[i].version);
  }
  return migrations.empty() ? 0 : migrations.back().version;
}

}  // namespace

void ResultsDb::open(const std::vector<store_detail::Migration>& migrations) {
  const int known_version = checked_known_version(migrations);
  const bool in_memory = path_ == ":memory:";
  if (!in_memory) {
    struct stat st {};
    KVB_CHECK(::stat(path_.c_str(), &st) != 0 || S_ISREG(st.st_mode), "results DB ", path_,
              ": exists but is not a regular file");
    make_parent_dirs(path_);
  }

  // A URI filename (the path encoded) so that merge_from can ATTACH its source read-only.
  const std::string name = in_memory ? path_ : uri_of(path_, "");
  int rc = sqlite3_open_v2(name.c_str(), &db_,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI, nullptr);
  if (rc != SQLITE_OK) fail_sqlite("cannot open", rc);
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, options_.busy_timeout_ms);

  // Reading the header first: a file that is not a DB fails here, before anything writes to it, and
  // a DB from a newer kvbench is refused before its journal mode is touched.
  const int found_version = schema_version();
  KVB_CHECK(found_version <= known_version, "results DB ", path_, " has schema version ",
            found_version, " but this kvbench knows versions up to ", known_version,
            ": it was written by a newer kvbench; use that version or another --db");
  if (options_.check_integrity) check_integrity();

  if (!in_memory) {
    const std::string mode = switch_to_wal();
    KVB_CHECK(mode == "wal", "results DB ", path_, ": cannot switch to WAL mode (journal mode is '",
              mode, "'); a network file system cannot hold a shared SQLite DB, use a local path");
  }
  // NORMAL in WAL mode: a commit survives a killed process; only a power cut can lose the last few
  // commits (never corrupt the file). FULL would add an fsync per sample.
  exec("PRAGMA synchronous = NORMAL");
  exec("PRAGMA foreign_keys = ON");
  migrate(migrations, known_version);
}

void ResultsDb::open_read_only(const std::vector<store_detail::Migration>& migrations) {
  const int known_version = checked_known_version(migrations);
  KVB_CHECK(path_ != ":memory:", "results DB :memory: cannot be opened for reading only");
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    KVB_FAIL("results DB ", path_, ": ", errno == ENOENT ? "no such file" : std::strerror(errno));
  }
  KVB_CHECK(!S_ISDIR(st.st_mode), "results DB ", path_, ": is a directory, not a results DB file");
  KVB_CHECK(S_ISREG(st.st_mode), "results DB ", path_, ": exists but is not a regular file");
  KVB_CHECK(st.st_size > 0, "results DB ", path_,
            ": empty file (0 bytes), not a kvbench results DB");
  KVB_CHECK(::access(path_.c_str(), R_OK) == 0, "results DB ", path_,
            ": cannot read it: ", std::strerror(errno));

  const std::string uri = uri_of(path_, read_only_query(path_));
  int rc = sqlite3_open_v2(uri.c_str(), &db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr);
  if (rc != SQLITE_OK) fail_sqlite("cannot open for reading", rc);
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_busy_timeout(db_, options_.busy_timeout_ms);

  const int found_version = schema_version();
  KVB_CHECK(found_version >= 1, "results DB ", path_,
            ": not a kvbench results DB (a SQLite file without the kvbench schema)");
  KVB_CHECK(found_version <= known_version, "results DB ", path_, " has schema version ",
            found_version, " but this kvbench knows versions up to ", known_version,
            ": it was written by a newer kvbench; use that version");
  if (found_version < known_version) {
    // The readers know only the latest schema, and the file must not change: they read a copy in
    // memory, migrated there (a write command or merge migrates the file itself).
    sqlite3* copy = nullptr;
    rc = sqlite3_open_v2(":memory:", &copy, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    if (rc == SQLITE_OK) rc = copy_database(db_, copy);
    if (rc != SQLITE_OK) {
      sqlite3_close_v2(copy);
      fail_sqlite("cannot copy it (schema version " + std::to_string(found_version) +
                      ") into memory to read it as version " + std::to_string(known_version),
                  rc);
    }
    sqlite3_close_v2(db_);
    db_ = copy;
    in_memory_copy_ = true;
    sqlite3_extended_result_codes(db_, 1);
    exec("PRAGMA foreign_keys = ON");
    migrate(migrations, known_version);
  }
  // Belt and braces: a write through this handle fails even on the writable in-memory copy.
  exec("PRAGMA query_only = ON");
}

void ResultsDb::migrate(const std::vector<store_detail::Migration>& migrations, int known_version) {
  for (const auto& m : migrations) {
    Txn txn(*this);
    // Re-read under the write lock: another process may have migrated since we looked.
    const int current = schema_version();
    KVB_CHECK(current <= known_version, "results DB ", path_, " was upgraded to schema version ",
              current, " by a newer kvbench while opening it (this one knows up to ", known_version,
              ")");
    if (current >= m.version) {
      txn.commit();
      continue;
    }
    try {
      exec(m.sql);
      exec("PRAGMA user_version = " + std::to_string(m.version));
    } catch (const Error& e) {
      KVB_FAIL("results DB ", path_, ": migration to schema version ", m.version,
               " failed (the DB is left at version ", current, "): ", e.what());
    }
    txn.commit();
  }
}

std::string ResultsDb::switch_to_wal() {
  // Changing the journal mode returns SQLITE_BUSY at once, without calling the busy handler, while
  // another connection has the file open mid-change (two workers creating one fresh DB); so retry
  // here for as long as the busy timeout allows.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.busy_timeout_ms);
  for (;;) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v2(db_, "PRAGMA journal_mode = WAL", -1, &stmt, nullptr);
    std::string mode;
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(stmt);
      if (rc == SQLITE_ROW) {
        const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
        mode = text != nullptr ? text : "";
        rc = SQLITE_OK;
      }
    }
    sqlite3_finalize(stmt);
    if (rc == SQLITE_OK) return mode;
    if ((rc & 0xff) != SQLITE_BUSY || std::chrono::steady_clock::now() >= deadline) {
      fail_sqlite("cannot switch to WAL mode", rc);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int ResultsDb::schema_version() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this, "PRAGMA user_version");
  return s.step() ? static_cast<int>(s.col_int(0)) : 0;
}

void ResultsDb::check_integrity() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::string first;
  int64_t problems = 0;
  try {
    Stmt s(*this, "PRAGMA quick_check(10)");
    while (s.step()) {
      const std::string line = s.col_text(0);
      if (line == "ok") continue;
      if (first.empty()) {
        first = line;  // SQLite's lines may hold newlines; the error stays one line
        for (char& c : first)
          if (c == '\n') c = ' ';
      }
      ++problems;
    }
  } catch (const Error& e) {
    // Damage bad enough that the check itself cannot run (a garbled root page) is the same verdict.
    if (first.empty()) first = e.what();
    ++problems;
  }
  KVB_CHECK(problems == 0, "results DB ", path_, ": fails PRAGMA quick_check (", first,
            problems > 1 ? "; and more" : "",
            "): the file is damaged; restore it from a copy or re-run into a new --db");
}

void ResultsDb::transaction(const std::function<void()>& fn) {
  Txn txn(*this);
  fn();
  txn.commit();
}

// ---------------------------------------------------------------------------------------------------
// Runs

RunStatus ResultsDb::run_status_or_throw(int64_t run_id) {
  Stmt s(*this, "SELECT status FROM runs WHERE id = ?1");
  s.bind_int(1, run_id);
  KVB_CHECK(s.step(), "results DB ", path_, ": run ", run_id, " does not exist");
  return parse_run_status(s.col_text(0));
}

void ResultsDb::require_running(int64_t run_id, const char* operation) {
  const RunStatus status = run_status_or_throw(run_id);
  KVB_CHECK(status == RunStatus::kRunning, "results DB ", path_, ": ", operation, " on run ",
            run_id, " whose status is '", to_string(status),
            "' (it must be 'running'; call begin_run)");
}

std::string RunLease::describe() const {
  if (ours) return holder.display() + " (this process)";
  if (!live) return holder.display() + " (gone: " + gone_reason + ")";
  if (liveness_of(holder) == Liveness::kAlive) return holder.display() + " (alive on this machine)";
  return holder.display() + " (another machine; its lease runs until " + expires_at + ")";
}

std::optional<RunLease> ResultsDb::lease(int64_t run_id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this,
         "SELECT host, machine, pid, pid_start, acquired_at, heartbeat_at, expires_at "
         "FROM run_leases WHERE run_id = ?1");
  s.bind_int(1, run_id);
  if (!s.step()) return std::nullopt;
  RunLease l;
  l.holder.host = s.col_text(0);
  l.holder.machine = s.col_text(1);
  l.holder.pid = s.col_int(2);
  l.holder.start_ticks = s.col_int(3);
  l.acquired_at = s.col_text(4);
  l.heartbeat_at = s.col_text(5);
  l.expires_at = s.col_text(6);
  l.ours = l.holder == this_process();
  switch (l.ours ? Liveness::kAlive : liveness_of(l.holder)) {
    case Liveness::kAlive:
      l.live = true;
      break;
    case Liveness::kGone:
      l.gone_reason = gone_reason(l.holder);
      break;
    case Liveness::kOtherMachine: {
      // ISO-8601 UTC strings of one format sort as the times they name.
      const std::string now = utc_now_iso8601();
      l.live = now < l.expires_at;
      if (!l.live) l.gone_reason = "its lease expired at " + l.expires_at + " (now " + now + ")";
      break;
    }
  }
  return l;
}

void ResultsDb::write_lease(int64_t run_id, const std::string& acquired_at) {
  const ProcessIdentity& me = this_process();
  const auto now = std::chrono::system_clock::now();
  Stmt up(*this,
          "INSERT OR REPLACE INTO run_leases (run_id, host, machine, pid, pid_start, acquired_at, "
          "heartbeat_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  up.bind_int(1, run_id)
      .bind_text(2, me.host)
      .bind_text(3, me.machine)
      .bind_int(4, me.pid)
      .bind_int(5, me.start_ticks)
      .bind_text(6, acquired_at)
      .bind_text(7, format_utc_iso8601(now))
      .bind_text(8, format_utc_iso8601(now + std::chrono::seconds(options_.lease_ttl_s)));
  up.run();
}

bool ResultsDb::renew_lease(int64_t run_id) {
  Txn txn(*this);
  const std::optional<RunLease> l = lease(run_id);
  if (!l || !l->ours) return false;  // rolled back: nothing was written
  write_lease(run_id, l->acquired_at);
  txn.commit();
  return true;
}

void ResultsDb::require_lease(int64_t run_id, const char* operation) {
  const std::optional<RunLease> l = lease(run_id);
  if (!l || l->ours) return;
  throw RunHeldElsewhere(
      detail::concat("results DB ", path_, ": ", operation, " on run ", run_id, ", which ",
                     l->describe(), " holds since ", l->acquired_at,
                     l->live ? "; it is computing the run, so this process leaves it alone"
                             : "; this process lost the run (begin_run takes it over)"),
      l->describe());
}

RunInfo ResultsDb::begin_run(const RunSpec& spec) {
  KVB_ASSERT(!spec.config_hash.empty(), "results_db", path_, ": begin_run with an empty config hash");
  check_json(path_, spec.config_json, "config_json of run " + spec.config_hash);
  check_json(path_, spec.provenance_json, "provenance_json of run " + spec.config_hash);
  const std::string now = utc_now_iso8601();
  const std::string worker = worker_id();

  Txn txn(*this);
  Stmt find(*this,
            "SELECT id, status, config_json, attempts, worker FROM runs WHERE config_hash = ?1");
  find.bind_text(1, spec.config_hash);
  RunInfo info;
  if (!find.step()) {
    Stmt ins(*this,
             "INSERT INTO runs (config_hash, config_json, method, model, dataset, protocol, grid, "
             "simulated, status, attempts, worker, created_at, started_at, provenance_json) "
             "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'running', 1, ?9, ?10, ?10, ?11)");
    ins.bind_text(1, spec.config_hash)
        .bind_text(2, spec.config_json)
        .bind_text(3, spec.method)
        .bind_text(4, spec.model)
        .bind_text(5, spec.dataset)
        .bind_text(6, spec.protocol)
        .bind_text(7, spec.grid)
        .bind_int(8, spec.simulated ? 1 : 0)
        .bind_text(9, worker)
        .bind_text(10, now)
        .bind_text(11, spec.provenance_json);
    ins.run();
    info.id = sqlite3_last_insert_rowid(db_);
    write_lease(info.id, now);
    txn.commit();
    return info;
  }

  info.id = find.col_int(0);
  const RunStatus status = parse_run_status(find.col_text(1));
  KVB_CHECK(find.col_text(2) == spec.config_json, "results DB ", path_, ": run ", info.id,
            " has config hash ", spec.config_hash,
            " but a different config_json; the hash must be config_hash(config)");
  info.attempts = find.col_int(3);
  info.previous_worker = find.col_text(4);
  Stmt count(*this, "SELECT count(*) FROM samples WHERE run_id = ?1");
  count.bind_int(1, info.id);
  info.done_samples = count.step() ? count.col_int(0) : 0;

  if (status == RunStatus::kDone) {
    info.status = RunStatus::kDone;
    info.already_done = true;
    txn.commit();
    return info;
  }
  if (const std::optional<RunLease> held = lease(info.id); held && !held->ours) {
    if (held->live) {
      info.status = status;
      info.held_by = held->describe();
      txn.commit();  // nothing written
      return info;
    }
    if (status == RunStatus::kRunning)
      info.taken_over_from = held->holder.display() + ": " + held->gone_reason;
  }
  Stmt upd(*this,
           "UPDATE runs SET status = 'running', error = NULL, finished_at = NULL, wall_s = NULL, "
           "attempts = attempts + 1, worker = ?2, started_at = ?3, provenance_json = ?4 "
           "WHERE id = ?1");
  upd.bind_int(1, info.id)
      .bind_text(2, worker)
      .bind_text(3, now)
      .bind_text(4, spec.provenance_json);
  upd.run();
  write_lease(info.id, now);
  info.status = RunStatus::kRunning;
  info.resumed = true;
  info.attempts += 1;
  txn.commit();
  return info;
}

void ResultsDb::drop_lease(int64_t run_id) {
  Stmt del(*this, "DELETE FROM run_leases WHERE run_id = ?1");
  del.bind_int(1, run_id);
  del.run();
}

void ResultsDb::finish_run(int64_t run_id, const std::vector<Metric>& metrics, double wall_s) {
  Txn txn(*this);
  require_running(run_id, "finish_run");
  require_lease(run_id, "finish_run");
  insert_metrics(run_id, metrics);
  drop_lease(run_id);
  Stmt upd(*this,
           "UPDATE runs SET status = 'done', error = NULL, finished_at = ?2, wall_s = ?3 "
           "WHERE id = ?1");
  upd.bind_int(1, run_id).bind_text(2, utc_now_iso8601()).bind_double(3, wall_s);
  upd.run();
  txn.commit();
}

void ResultsDb::fail_run(int64_t run_id, const std::string& error, std::optional<double> wall_s) {
  Txn txn(*this);
  require_running(run_id, "fail_run");
  require_lease(run_id, "fail_run");
  drop_lease(run_id);
  Stmt upd(*this,
           "UPDATE runs SET status = 'failed', error = ?2, finished_at = ?3, wall_s = ?4 "
           "WHERE id = ?1");
  upd.bind_int(1, run_id).bind_text(2, error).bind_text(3, utc_now_iso8601());
  upd.bind_opt_double(4, wall_s);
  upd.run();
  txn.commit();
}

bool ResultsDb::delete_run(int64_t run_id) {
  Txn txn(*this);
  Stmt del(*this, "DELETE FROM runs WHERE id = ?1");  // samples and metrics go by ON DELETE CASCADE
  del.bind_int(1, run_id);
  del.run();
  const bool deleted = sqlite3_changes(db_) > 0;
  txn.commit();
  return deleted;
}

namespace {

std::string run_select(const std::string& where) {
  return std::string("SELECT id, ") + kRunColumns + " FROM runs " + where;
}

}  // namespace

std::optional<RunRow> ResultsDb::read_run(const std::string& where,
                                          const std::function<void(Stmt&)>& bind) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this, run_select(where));
  bind(s);
  if (!s.step()) return std::nullopt;
  RunRow r;
  r.id = s.col_int(0);
  r.config_hash = s.col_text(1);
  r.config_json = s.col_text(2);
  r.method = s.col_text(3);
  r.model = s.col_text(4);
  r.dataset = s.col_text(5);
  r.protocol = s.col_text(6);
  r.grid = s.col_text(7);
  r.simulated = s.col_int(8) != 0;
  r.status = parse_run_status(s.col_text(9));
  r.error = s.col_text(10);
  r.attempts = s.col_int(11);
  r.worker = s.col_text(12);
  r.created_at = s.col_text(13);
  r.started_at = s.col_text(14);
  r.finished_at = s.col_text(15);
  r.wall_s = s.col_opt_double(16);
  r.provenance_json = s.col_text(17);
  return r;
}

std::optional<RunRow> ResultsDb::find_run(int64_t run_id) {
  return read_run("WHERE id = ?1", [&](Stmt& s) { s.bind_int(1, run_id); });
}

std::optional<RunRow> ResultsDb::find_run_by_hash(const std::string& config_hash) {
  return read_run("WHERE config_hash = ?1", [&](Stmt& s) { s.bind_text(1, config_hash); });
}

std::vector<RunRow> ResultsDb::list_runs(const RunFilter& filter) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  std::string where;
  std::vector<std::string> values;
  auto add = [&](const char* column, const std::string& value) {
    if (value.empty()) return;
    values.push_back(value);
    where += (where.empty() ? "WHERE " : " AND ") + std::string(column) + " = ?" +
             std::to_string(values.size());
  };
  add("method", filter.method);
  add("model", filter.model);
  add("dataset", filter.dataset);
  add("protocol", filter.protocol);
  add("grid", filter.grid);
  if (filter.status) add("status", to_string(*filter.status));
  // Select the ids, then read each row through read_run, so there is one row decoder.
  Stmt s(*this, "SELECT id FROM runs " + where + " ORDER BY id");
  for (size_t i = 0; i < values.size(); ++i) s.bind_text(static_cast<int>(i) + 1, values[i]);
  std::vector<int64_t> ids;
  while (s.step()) ids.push_back(s.col_int(0));
  std::vector<RunRow> rows;
  rows.reserve(ids.size());
  for (int64_t id : ids) {
    if (auto r = find_run(id)) rows.push_back(std::move(*r));
  }
  return rows;
}

// ---------------------------------------------------------------------------------------------------
// Samples

void ResultsDb::insert_sample(int64_t run_id, int64_t index, const std::string& key,
                              const std::string& output_json) {
  KVB_CHECK(index >= 0, "results DB ", path_, ": sample index ", index, " of run ", run_id,
            " is negative");
  check_json(
      path_, output_json,
      "output_json of sample " + std::to_string(index) + " of run " + std::to_string(run_id));
  require_running(run_id, "add_sample");
  require_lease(run_id, "add_sample");
  Stmt ins(*this,
           "INSERT OR REPLACE INTO samples (run_id, sample_index, sample_key, output_json, "
           "created_at) VALUES (?1, ?2, ?3, ?4, ?5)");
  ins.bind_int(1, run_id)
      .bind_int(2, index)
      .bind_text(3, key)
      .bind_text(4, output_json)
      .bind_text(5, utc_now_iso8601());
  ins.run();
}

void ResultsDb::add_sample(int64_t run_id, int64_t index, const std::string& key,
                           const std::string& output_json) {
  Txn txn(*this);
  insert_sample(run_id, index, key, output_json);
  txn.commit();
}

void ResultsDb::add_sample_with_metrics(int64_t run_id, int64_t index, const std::string& key,
                                        const std::string& output_json,
                                        const std::vector<Metric>& metrics) {
  Txn txn(*this);
  insert_sample(run_id, index, key, output_json);
  insert_metrics(run_id, metrics);
  txn.commit();
}

std::set<int64_t> ResultsDb::done_sample_indices(int64_t run_id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this, "SELECT sample_index FROM samples WHERE run_id = ?1");
  s.bind_int(1, run_id);
  std::set<int64_t> out;
  while (s.step()) out.insert(s.col_int(0));
  return out;
}

std::map<int64_t, std::string> ResultsDb::done_sample_keys(int64_t run_id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this, "SELECT sample_index, sample_key FROM samples WHERE run_id = ?1");
  s.bind_int(1, run_id);
  std::map<int64_t, std::string> out;
  while (s.step()) out.emplace(s.col_int(0), s.col_text(1));
  return out;
}

std::vector<SampleRow> ResultsDb::samples(int64_t run_id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this,
         "SELECT sample_index, sample_key, output_json, created_at FROM samples WHERE run_id = ?1 "
         "ORDER BY sample_index");
  s.bind_int(1, run_id);
  std::vector<SampleRow> out;
  while (s.step()) out.push_back({s.col_int(0), s.col_text(1), s.col_text(2), s.col_text(3)});
  return out;
}

int64_t ResultsDb::sample_count(int64_t run_id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this, "SELECT count(*) FROM samples WHERE run_id = ?1");
  s.bind_int(1, run_id);
  return s.step() ? s.col_int(0) : 0;
}

// ---------------------------------------------------------------------------------------------------
// Metrics

void ResultsDb::insert_metrics(int64_t run_id, const std::vector<Metric>& metrics) {
  if (metrics.empty()) return;
  // OR REPLACE resolves against the unique index on (run_id, name, ifnull(layer,-1),
  // ifnull(head,-1)): a plain UNIQUE(run_id, name, layer, head) would let NULL layers repeat, since
  // NULLs are distinct.
  Stmt ins(*this,
           "INSERT OR REPLACE INTO metrics (run_id, name, layer, head, value, unit, direction, n, "
           "ci_low, ci_high) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)");
  for (const auto& m : metrics) {
    KVB_CHECK(!m.name.empty(), "results DB ", path_, ": a metric of run ", run_id, " has no name");
    KVB_CHECK(!m.layer || *m.layer >= 0, "results DB ", path_, ": metric ", m.name, " of run ",
              run_id, " has negative layer ", *m.layer);
    KVB_CHECK(!m.head || *m.head >= 0, "results DB ", path_, ": metric ", m.name, " of run ",
              run_id, " has negative head ", *m.head);
    ins.bind_int(1, run_id)
        .bind_text(2, m.name)
        .bind_opt_int(3, m.layer)
        .bind_opt_int(4, m.head)
        .bind_double(5, m.value)
        .bind_text(6, m.unit)
        .bind_text(7, to_string(m.direction))
        .bind_opt_int(8, m.n)
        .bind_opt_double(9, m.ci_low)
        .bind_opt_double(10, m.ci_high);
    ins.run();
    ins.reset();
  }
}

void ResultsDb::put_metrics(int64_t run_id, const std::vector<Metric>& metrics) {
  Txn txn(*this);
  run_status_or_throw(run_id);  // any status: metrics may be recomputed for a finished run
  insert_metrics(run_id, metrics);
  txn.commit();
}

std::vector<Metric> ResultsDb::metrics(int64_t run_id) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this,
         "SELECT name, layer, head, value, unit, direction, n, ci_low, ci_high FROM metrics "
         "WHERE run_id = ?1 ORDER BY name, layer, head");
  s.bind_int(1, run_id);
  std::vector<Metric> out;
  while (s.step()) {
    Metric m;
    m.name = s.col_text(0);
    m.layer = s.col_opt_int(1);
    m.head = s.col_opt_int(2);
    m.value = s.col_double(3);
    m.unit = s.col_text(4);
    m.direction = parse_direction(s.col_text(5));
    m.n = s.col_opt_int(6);
    m.ci_low = s.col_opt_double(7);
    m.ci_high = s.col_opt_double(8);
    out.push_back(std::move(m));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Artifacts

bool ResultsDb::put_artifact(const Artifact& a) {
  KVB_CHECK(!a.hash.empty(), "results DB ", path_, ": artifact ", a.path, " has no hash");
  check_json(path_, a.meta_json, "meta_json of artifact " + a.hash);
  Txn txn(*this);
  Stmt ins(*this,
           "INSERT OR IGNORE INTO artifacts (hash, kind, path, bytes, created_at, meta_json) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  ins.bind_text(1, a.hash)
      .bind_text(2, a.kind)
      .bind_text(3, a.path)
      .bind_int(4, a.bytes)
      .bind_text(5, a.created_at.empty() ? utc_now_iso8601() : a.created_at)
      .bind_text(6, a.meta_json);
  ins.run();
  const bool inserted = sqlite3_changes(db_) > 0;
  txn.commit();
  return inserted;
}

namespace {

constexpr const char* kArtifactSelect =
    "SELECT hash, kind, path, bytes, created_at, meta_json FROM artifacts ";

}  // namespace

std::optional<Artifact> ResultsDb::find_artifact(const std::string& hash) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this, std::string(kArtifactSelect) + "WHERE hash = ?1");
  s.bind_text(1, hash);
  if (!s.step()) return std::nullopt;
  return Artifact{s.col_text(0), s.col_text(1), s.col_text(2),
                  s.col_int(3),  s.col_text(4), s.col_text(5)};
}

std::vector<Artifact> ResultsDb::list_artifacts(const std::string& kind) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Stmt s(*this, std::string(kArtifactSelect) + (kind.empty() ? "" : "WHERE kind = ?1 ") +
                    "ORDER BY created_at, hash");
  if (!kind.empty()) s.bind_text(1, kind);
  std::vector<Artifact> out;
  while (s.step()) {
    out.push_back(
        {s.col_text(0), s.col_text(1), s.col_text(2), s.col_int(3), s.col_text(4), s.col_text(5)});
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Merge

namespace {

// A temporary file for a migrated copy of a merge source, removed with SQLite's side files.
class TempDbFile {
 public:
  TempDbFile() {
    const char* env = std::getenv("TMPDIR");
    const std::string dir = env != nullptr && *env != '\0' ? env : "/tmp";
    std::string tmpl = dir + "/kvb_merge_XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    KVB_CHECK(fd >= 0, "cannot create a temporary file in ", dir, ": ", std::strerror(errno));
    ::close(fd);
    path_ = tmpl;
  }
  ~TempDbFile() {
    for (const char* suffix : {"", "-journal", "-wal", "-shm"}) ::unlink((path_ + suffix).c_str());
  }
  TempDbFile(const TempDbFile&) = delete;
  TempDbFile& operator=(const TempDbFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A merge copies runs in transactions of about this long, then pauses for longer than SQLite's busy
// handler sleeps between its tries (100 ms at most), so that a writer waiting for the lock (a live
// grid adding a sample) gets it between two of them instead of timing out behind the whole merge.
constexpr auto kMergeBatch = std::chrono::milliseconds(200);
constexpr auto kMergePause = std::chrono::milliseconds(120);

}  // namespace

void ResultsDb::save_copy(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  sqlite3* out = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &out, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> guard(out, &sqlite3_close_v2);
  if (rc == SQLITE_OK) rc = copy_database(db_, out);
  KVB_CHECK(rc == SQLITE_OK, "results DB ", path_, ": cannot copy it to ", path, ": ",
            out != nullptr ? sqlite3_errmsg(out) : sqlite3_errstr(rc));
}

MergeStats ResultsDb::merge_from(const std::string& other_path) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  KVB_ASSERT(txn_depth_ == 0, "results_db", path_, ": merge_from cannot run inside a transaction");
  KVB_CHECK(!options_.read_only, "results DB ", path_,
            ": opened for reading only; cannot merge into it");
  struct stat src_st {};
  struct stat dst_st {};
  KVB_CHECK(::stat(other_path.c_str(), &src_st) != 0 || ::stat(path_.c_str(), &dst_st) != 0 ||
                dst_st.st_dev != src_st.st_dev || dst_st.st_ino != src_st.st_ino,
            "cannot merge ", other_path, " into itself");

  // The source is only ever read: opened read-only (which refuses a file that is not a results DB
  // or is newer) and checked for damage before anything here changes. An older-schema source is
  // read through a migrated temporary copy so that the column lists match.
  std::unique_ptr<TempDbFile> migrated;
  {
    Options ro = read_only_options();
    ro.busy_timeout_ms = options_.busy_timeout_ms;
    ro.migrations = options_.migrations;
    ResultsDb src(other_path, ro);
    src.check_integrity();
    if (src.in_memory_copy_) {
      migrated = std::make_unique<TempDbFile>();
      src.save_copy(migrated->path());
    }
  }
  {
    const std::string uri = migrated ? uri_of(migrated->path(), "mode=ro")
                                     : uri_of(other_path, read_only_query(other_path));
    Stmt attach(*this, "ATTACH DATABASE ?1 AS merge_src");
    attach.bind_text(1, uri);
    attach.run();
  }
  // Declared before the transactions so that it runs after a rollback: DETACH fails inside one.
  struct Detach {
    sqlite3* db;
    ~Detach() { sqlite3_exec(db, "DETACH DATABASE merge_src", nullptr, nullptr, nullptr); }
  } detach{db_};

  {
    // Refused before anything is written, not halfway through.
    Stmt clash(*this,
               "SELECT s.config_hash FROM merge_src.runs s JOIN main.runs m "
               "ON m.config_hash = s.config_hash WHERE m.config_json <> s.config_json LIMIT 1");
    KVB_CHECK(!clash.step(), "cannot merge ", other_path, " into ", path_, ": config hash ",
              clash.col_text(0), " has different config_json in the two DBs");
  }
  struct SrcRun {
    int64_t id;
    std::string hash;
    RunStatus status;
  };
  std::vector<SrcRun> src_runs;
  {
    Stmt s(*this, "SELECT id, config_hash, status FROM merge_src.runs ORDER BY id");
    while (s.step())
      src_runs.push_back({s.col_int(0), s.col_text(1), parse_run_status(s.col_text(2))});
  }

  MergeStats stats;
  const std::string cols = kRunColumns;
  auto copy_children = [&](int64_t src_id, int64_t dst_id) {
    // OR IGNORE: when uniting two unfinished runs, the rows already here win.
    Stmt samples(
        *this,
        "INSERT OR IGNORE INTO main.samples (run_id, sample_index, sample_key, output_json, "
        "created_at) SELECT ?1, sample_index, sample_key, output_json, created_at "
        "FROM merge_src.samples WHERE run_id = ?2");
    samples.bind_int(1, dst_id).bind_int(2, src_id);
    samples.run();
    stats.samples_copied += sqlite3_changes(db_);
    Stmt metrics(*this,
                 "INSERT OR IGNORE INTO main.metrics (run_id, name, layer, head, value, unit, "
                 "direction, n, ci_low, ci_high) SELECT ?1, name, layer, head, value, unit, "
                 "direction, n, ci_low, ci_high FROM merge_src.metrics WHERE run_id = ?2");
    metrics.bind_int(1, dst_id).bind_int(2, src_id);
    metrics.run();
    stats.metrics_copied += sqlite3_changes(db_);
  };
  auto merge_run = [&](const SrcRun& src) {
    Stmt find(*this, "SELECT id, status FROM main.runs WHERE config_hash = ?1");
    find.bind_text(1, src.hash);
    if (!find.step()) {
      Stmt ins(*this, "INSERT INTO main.runs (" + cols + ") SELECT " + cols +
                          " FROM merge_src.runs WHERE id = ?1");
      ins.bind_int(1, src.id);
      ins.run();
      copy_children(src.id, sqlite3_last_insert_rowid(db_));
      ++stats.runs_added;
      return;
    }
    const int64_t dst_id = find.col_int(0);
    const RunStatus dst_status = parse_run_status(find.col_text(1));
    if (dst_status == RunStatus::kDone) {
      ++stats.runs_skipped;
      return;
    }
    // A run a live process is computing is its holder's: replacing it or adding rows under it
    // would make that process's next write (a sample, its finish) fail.
    const std::optional<RunLease> held = lease(dst_id);
    if (held && held->live && !held->ours) {
      ++stats.runs_held;
      return;
    }
    if (src.status == RunStatus::kDone) {
      for (const char* table : {"main.samples", "main.metrics", "main.run_leases"}) {
        Stmt del(*this, std::string("DELETE FROM ") + table + " WHERE run_id = ?1");
        del.bind_int(1, dst_id);
        del.run();
      }
      Stmt upd(*this, "UPDATE main.runs SET (" + cols + ") = (SELECT " + cols +
                          " FROM merge_src.runs WHERE id = ?1) WHERE id = ?2");
      upd.bind_int(1, src.id).bind_int(2, dst_id);
      upd.run();
      copy_children(src.id, dst_id);
      ++stats.runs_replaced;
    } else {
      copy_children(src.id, dst_id);
      ++stats.runs_combined;
    }
  };

  size_t next = 0;
  while (next < src_runs.size()) {
    const auto started = std::chrono::steady_clock::now();
    Txn txn(*this);
    do {
      merge_run(src_runs[next++]);
    } while (next < src_runs.size() && std::chrono::steady_clock::now() - started < kMergeBatch);
    txn.commit();
    if (next < src_runs.size()) std::this_thread::sleep_for(kMergePause);
  }

  Txn txn(*this);
  Stmt art(*this,
           "INSERT OR IGNORE INTO main.artifacts (hash, kind, path, bytes, created_at, meta_json) "
           "SELECT hash, kind, path, bytes, created_at, meta_json FROM merge_src.artifacts");
  art.run();
  stats.artifacts_added = sqlite3_changes(db_);
  txn.commit();
  return stats;
}

}  // namespace kvb
