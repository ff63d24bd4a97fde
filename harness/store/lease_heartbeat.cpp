#include "harness/store/lease_heartbeat.h"

#include <algorithm>

#include "harness/store/results_db.h"

namespace kvb {

LeaseHeartbeat::LeaseHeartbeat(ResultsDb& db, int64_t run_id) : db_(db), run_id_(run_id) {
  const auto every = std::chrono::milliseconds(std::max(250, db.options().lease_ttl_s * 250));
  thread_ = std::thread([this, every] { loop(every); });
}

LeaseHeartbeat::~LeaseHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void LeaseHeartbeat::loop(std::chrono::milliseconds every) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, every, [this] { return stop_; })) {
    lock.unlock();
    try {
      if (db_.renew_lease(run_id_)) {
        renewals_++;
      } else {
        lost_ = true;
      }
    } catch (...) {
      // Busy or I/O trouble: the next beat tries again; the lease outlives several missed beats.
    }
    lock.lock();
    if (lost_) return;
  }
}

}  // namespace kvb
