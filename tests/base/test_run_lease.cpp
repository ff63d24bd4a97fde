// Run leases (results_db.h): the process that begins a run holds it; another process on the same DB
// is told who holds it and can neither resume, add samples to, finish nor fail it while the holder
// lives; once the holder is gone (killed, its pid reused, or on another machine its lease expired)
// begin_run takes the run over with its samples. Real processes (fork) throughout, and the identity
// that tells a reused pid from the holder.

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <thread>

#include "harness/store/config_hash.h"
#include "harness/store/lease_heartbeat.h"
#include "harness/store/process_identity.h"
#include "harness/store/results_db.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using nlohmann::json;

RunSpec spec_of(int variant) {
  const json config = {{"method", "lease"}, {"model", "stories260K"}, {"variant", variant}};
  RunSpec spec;
  spec.config_json = canonical_json(config);
  spec.config_hash = config_hash(config);
  spec.method = "lease";
  spec.model = "stories260K";
  spec.protocol = "stream";
  return spec;
}

// One statement on `path` through its own connection: what another program would see or do.
std::string raw(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  std::string out = "<no row>";
  if (sqlite3_step(stmt) == SQLITE_ROW) {
    const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    out = t ? t : "NULL";
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

std::string held_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const RunHeldElsewhere& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<another exception: ") + e.what() + ">";
  }
  return "<nothing thrown>";
}

// A child process that begins run `variant`, adds one sample, says so on a pipe and then waits for
// a byte from the parent: 'f' finishes the run, 'k' leaves it held until it is killed.
struct Holder {
  pid_t pid = -1;
  int to_child = -1;

  Holder(const std::string& path, int variant) {
    int ready[2], go[2];
    EXPECT_EQ(::pipe(ready), 0);
    EXPECT_EQ(::pipe(go), 0);
    pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      int code = 0;
      try {
        ResultsDb db(path);
        const RunInfo info = db.begin_run(spec_of(variant));
        db.add_sample(info.id, 0, "k0", R"({"x": 0})");
        char c = 'r';
        if (::write(ready[1], &c, 1) != 1) ::_exit(3);
        if (::read(go[0], &c, 1) != 1) ::_exit(4);
        if (c == 'f') {
          db.add_sample(info.id, 1, "k1", R"({"x": 1})");
          db.finish_run(info.id, {{"m", 1.0}}, 0.5);
        } else {
          ::pause();
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "holder: %s\n", e.what());
        code = 1;
      }
      ::_exit(code);
    }
    ::close(ready[1]);
    ::close(go[0]);
    to_child = go[1];
    char c = 0;
    EXPECT_EQ(::read(ready[0], &c, 1), 1) << "the holder did not start";
    ::close(ready[0]);
  }
  void tell(char c) { EXPECT_EQ(::write(to_child, &c, 1), 1); }
  int wait() {
    int status = 0;
    EXPECT_EQ(::waitpid(pid, &status, 0), pid);
    ::close(to_child);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

TEST(ProcessIdentity, TellsThisProcessAChildAndAReusedPidApart) {
  const ProcessIdentity me = this_process();
  EXPECT_EQ(me.pid, ::getpid());
  EXPECT_GT(me.start_ticks, 0);
  EXPECT_FALSE(me.machine.empty());
  EXPECT_EQ(liveness_of(me), Liveness::kAlive);

  ProcessIdentity reused = me;  // the same pid, started at another time: another process
  reused.start_ticks -= 1;
  EXPECT_EQ(liveness_of(reused), Liveness::kGone);
  EXPECT_NE(gone_reason(reused).find("another process now"), std::string::npos)
      << gone_reason(reused);

  ProcessIdentity elsewhere = me;
  elsewhere.machine = "otherhost|boot|pid:[1]";
  EXPECT_EQ(liveness_of(elsewhere), Liveness::kOtherMachine);

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const ProcessIdentity child = this_process();  // recomputed after fork: another process
    const bool ok = child.pid == ::getpid() && child != me && child.machine == me.machine;
    char c = ok ? 'y' : 'n';
    if (::write(fds[1], &c, 1) != 1) ::_exit(2);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  ProcessIdentity child = me;
  child.pid = pid;
  child.start_ticks = process_start_ticks(pid);
  EXPECT_GT(child.start_ticks, 0);
  EXPECT_EQ(liveness_of(child), Liveness::kAlive);
  ::kill(pid, SIGKILL);
  // Dead but not yet reaped (a zombie): gone already.
  for (int i = 0; i < 200 && liveness_of(child) == Liveness::kAlive; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(liveness_of(child), Liveness::kGone);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_EQ(liveness_of(child), Liveness::kGone);
  EXPECT_NE(gone_reason(child).find("no longer exists"), std::string::npos) << gone_reason(child);
}

TEST(RunLease, BeginTakesItFinishAndFailRelease) {
  const std::string path = ptest::scratch_dir("lease") + "/db.sqlite";
  ResultsDb db(path);
  const RunInfo a = db.begin_run(spec_of(1));
  auto l = db.lease(a.id);
  ASSERT_TRUE(l.has_value());
  EXPECT_TRUE(l->ours);
  EXPECT_TRUE(l->live);
  EXPECT_EQ(l->holder, this_process());
  EXPECT_LT(l->heartbeat_at, l->expires_at);
  db.finish_run(a.id, {}, 1.0);
  EXPECT_FALSE(db.lease(a.id).has_value());

  const RunInfo b = db.begin_run(spec_of(2));
  db.fail_run(b.id, "boom");
  EXPECT_FALSE(db.lease(b.id).has_value());
  const RunInfo b2 = db.begin_run(spec_of(2));  // a failed run is resumed and held again
  EXPECT_TRUE(b2.resumed);
  EXPECT_TRUE(b2.taken_over_from.empty());
  EXPECT_TRUE(db.lease(b.id)->ours);
  db.delete_run(b.id);
  EXPECT_EQ(raw(path, "SELECT count(*) FROM run_leases"), "0");  // deleted with its run
}

TEST(RunLease, ALiveHolderKeepsItsRunFromEveryOtherProcess) {
  const std::string path = ptest::scratch_dir("lease") + "/db.sqlite";
  Holder holder(path, 1);
  {
    ResultsDb db(path);
    const int64_t id = db.find_run_by_hash(spec_of(1).config_hash)->id;
    const RunInfo info = db.begin_run(spec_of(1));
    EXPECT_EQ(info.id, id);
    EXPECT_FALSE(info.resumed);
    EXPECT_NE(info.held_by.find(":" + std::to_string(holder.pid) + " (alive on this machine)"),
              std::string::npos)
        << info.held_by;
    const RunRow row = *db.find_run(id);
    EXPECT_EQ(row.attempts, 1);  // nothing was changed
    EXPECT_EQ(row.worker, this_process().host + ":" + std::to_string(holder.pid));

    // No write of this process reaches the run: no sample, no finish, and above all no failure.
    for (const auto& [what, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
             {"add_sample", [&] { db.add_sample(id, 5, "k", "{}"); }},
             {"finish_run", [&] { db.finish_run(id, {}, 1.0); }},
             {"fail_run", [&] { db.fail_run(id, "not mine"); }}}) {
      const std::string err = held_error(fn);
      EXPECT_NE(err.find(what + " on run"), std::string::npos) << err;
      EXPECT_NE(err.find("leaves it alone"), std::string::npos) << err;
    }
    EXPECT_EQ(db.find_run(id)->status, RunStatus::kRunning);
    EXPECT_EQ(db.sample_count(id), 1);
    EXPECT_FALSE(db.renew_lease(id));
  }
  holder.tell('f');
  EXPECT_EQ(holder.wait(), 0);
  ResultsDb db(path);
  const RunInfo after = db.begin_run(spec_of(1));
  EXPECT_TRUE(after.already_done);
  EXPECT_EQ(db.sample_count(after.id), 2);
  EXPECT_FALSE(db.lease(after.id).has_value());
}

TEST(RunLease, AKilledHoldersRunIsTakenOverWithItsSamples) {
  const std::string path = ptest::scratch_dir("lease") + "/db.sqlite";
  Holder holder(path, 1);
  ::kill(holder.pid, SIGKILL);
  EXPECT_EQ(holder.wait(), 128 + SIGKILL);
  ResultsDb db(path);
  const int64_t id = db.find_run_by_hash(spec_of(1).config_hash)->id;
  auto before = db.lease(id);
  ASSERT_TRUE(before.has_value());
  EXPECT_FALSE(before->live);
  EXPECT_NE(before->gone_reason.find("no longer exists"), std::string::npos) << before->gone_reason;
  // Written to without being taken over first: refused, so that two processes never both write.
  EXPECT_NE(held_error([&] { db.add_sample(id, 1, "k1", "{}"); }).find("lost the run"),
            std::string::npos);

  const RunInfo info = db.begin_run(spec_of(1));
  EXPECT_TRUE(info.held_by.empty());
  EXPECT_TRUE(info.resumed);
  EXPECT_EQ(info.done_samples, 1);
  EXPECT_EQ(info.attempts, 2);
  EXPECT_NE(info.taken_over_from.find(std::to_string(holder.pid) + ": pid "), std::string::npos)
      << info.taken_over_from;
  EXPECT_TRUE(db.lease(id)->ours);
  db.add_sample(id, 1, "k1", "{}");
  db.finish_run(id, {}, 1.0);
  EXPECT_EQ(db.find_run(id)->status, RunStatus::kDone);
}

TEST(RunLease, AReusedPidDoesNotKeepTheRun) {
  const std::string path = ptest::scratch_dir("lease") + "/db.sqlite";
  ResultsDb db(path);
  const int64_t id = db.begin_run(spec_of(1)).id;
  // The holder's pid now names this (live) test process, which started at another time than the
  // recorded holder: the holder is gone.
  raw(path, "UPDATE run_leases SET pid_start = pid_start - 7");
  auto l = db.lease(id);
  EXPECT_FALSE(l->ours);
  EXPECT_FALSE(l->live);
  EXPECT_NE(l->gone_reason.find("another process now"), std::string::npos) << l->gone_reason;
  const RunInfo info = db.begin_run(spec_of(1));
  EXPECT_TRUE(info.held_by.empty());
  EXPECT_FALSE(info.taken_over_from.empty());
  EXPECT_TRUE(db.lease(id)->ours);
}

TEST(RunLease, AnotherMachinesHolderCountsUntilItsLeaseExpires) {
  const std::string path = ptest::scratch_dir("lease") + "/db.sqlite";
  ResultsDb db(path);
  const int64_t id = db.begin_run(spec_of(1)).id;
  raw(path,
      "UPDATE run_leases SET host = 'node7', machine = 'node7|b00t|pid:[1]', pid = 4242, "
      "expires_at = '2999-01-01T00:00:00.000Z'");
  RunInfo info = db.begin_run(spec_of(1));
  EXPECT_NE(info.held_by.find("node7:4242 (another machine; its lease runs until 2999"),
            std::string::npos)
      << info.held_by;
  EXPECT_NE(held_error([&] { db.fail_run(id, "x"); }).find("node7:4242"), std::string::npos);

  raw(path, "UPDATE run_leases SET expires_at = '2001-01-01T00:00:00.000Z'");
  info = db.begin_run(spec_of(1));
  EXPECT_TRUE(info.held_by.empty());
  EXPECT_NE(info.taken_over_from.find("node7:4242: its lease expired at 2001"), std::string::npos)
      << info.taken_over_from;
  EXPECT_TRUE(db.lease(id)->ours);
}

TEST(RunLease, HeartbeatRenewsTheLeaseAndNoticesWhenItIsLost) {
  const std::string path = ptest::scratch_dir("lease") + "/db.sqlite";
  ResultsDb::Options o;
  o.lease_ttl_s = 1;  // a beat every 250 ms
  ResultsDb db(path, o);
  const int64_t id = db.begin_run(spec_of(1)).id;
  const std::string first = db.lease(id)->heartbeat_at;
  LeaseHeartbeat beat(db, id);
  for (int i = 0; i < 100 && beat.renewals() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(beat.renewals(), 2);
  EXPECT_GT(db.lease(id)->heartbeat_at, first);
  EXPECT_GT(db.lease(id)->expires_at, db.lease(id)->heartbeat_at);
  EXPECT_FALSE(beat.lost());
  raw(path, "UPDATE run_leases SET machine = 'node7|b00t|pid:[1]'");  // another process took it
  for (int i = 0; i < 100 && !beat.lost(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(beat.lost());
}

TEST(RunLease, AVersionOneDbIsMigratedAndItsRunningRunResumes) {
  const std::string path = ptest::scratch_dir("lease") + "/db.sqlite";
  std::vector<store_detail::Migration> v1 = {store_detail::builtin_migrations()[0]};
  ResultsDb::Options o;
  o.migrations = &v1;
  { ResultsDb db(path, o); }
  const RunSpec spec = spec_of(1);
  raw(path,
      "INSERT INTO runs (config_hash, config_json, status, worker, created_at, started_at) VALUES "
      "('" +
          spec.config_hash + "', '" + spec.config_json +
          "', 'running', 'oldhost:1', '2020-01-01T00:00:00.000Z', '2020-01-01T00:00:00.000Z')");
  ResultsDb db(path);
  EXPECT_EQ(db.schema_version(), 2);
  const RunRow old = db.list_runs().at(0);
  EXPECT_EQ(old.worker, "oldhost:1");
  EXPECT_FALSE(db.lease(old.id).has_value());
  const RunInfo info = db.begin_run(spec);  // no lease: left by a kvbench without leases
  EXPECT_TRUE(info.resumed);
  EXPECT_TRUE(info.held_by.empty());
  EXPECT_TRUE(db.lease(old.id)->ours);
}

}  // namespace
}  // namespace kvb
