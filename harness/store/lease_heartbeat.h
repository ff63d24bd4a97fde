#pragma once
// LeaseHeartbeat: keeps a run's lease (results_db.h) alive while this process computes the run. A
// thread renews it every quarter of the DB's lease time, so a holder on another machine is judged
// alive while its heartbeat goes on, however long one sample takes, and gone soon after it stops.
// Renewal failures (a DB busy for longer than its timeout) are retried at the next beat; a renewal
// that finds the run held by another process marks the lease lost, and the run's next write throws
// RunHeldElsewhere anyway.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace kvb {

class ResultsDb;

class LeaseHeartbeat {
 public:
  LeaseHeartbeat(ResultsDb& db, int64_t run_id);
  ~LeaseHeartbeat();  // stops the thread (at once, not at the next beat)
  LeaseHeartbeat(const LeaseHeartbeat&) = delete;
  LeaseHeartbeat& operator=(const LeaseHeartbeat&) = delete;

  bool lost() const { return lost_.load(); }
  int64_t renewals() const { return renewals_.load(); }

 private:
  void loop(std::chrono::milliseconds every);

  ResultsDb& db_;
  int64_t run_id_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> renewals_{0};
  std::thread thread_;
};

}  // namespace kvb
