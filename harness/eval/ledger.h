#pragma once
// The memory ledger of a run: what the method's KV state really occupies (by tier and kind) next to its
// nominal size and the uncompressed baseline, plus process-level peaks.

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/kv/kv_cache.h"
#include "harness/store/results_db.h"

namespace kvb {

struct LedgerEntry {
  Footprint fp;
  int64_t tokens_seen = 0;         // positions the sequences have processed (what full would hold)
  int64_t baseline_bytes = 0;      // tokens_seen x uncompressed bytes per token (model dtype)
  // tokens_seen x uncompressed bytes per token at 16 bits (what papers compare against); 0: not
  // recorded (rows written before it existed).
  int64_t baseline_bytes_16bit = 0;
};

// The ledger fields of a sample row (stream and qa samples), and back; fields a row written by an
// older kvbench lacks read as "not recorded".
nlohmann::json ledger_to_json(const LedgerEntry& e);
LedgerEntry ledger_from_json(const nlohmann::json& j);

// Physical bytes as a 16-bit deployment would hold them: the bytes the store keeps in the model
// dtype rescaled by baseline_bytes_16bit / baseline_bytes, the rest (codes, fp16 rows, indices) as
// they are. Negative when the store or the row does not say which bytes are in the model dtype.
// device_only: the device tier's bytes alone.
double physical_bytes_16bit(const LedgerEntry& e, bool device_only = false);

// Resident-set high-water mark of this process (CPU), bytes.
int64_t peak_rss_bytes();

// The device allocator's view (CUDA caching allocator statistics: peak and current allocated, reserved)
// for a CUDA device; empty on CPU or when this LibTorch has no CUDA.
std::vector<Metric> device_allocator_metrics(const std::string& device);

// A method is flagged simulated when it claims to hold much less than it allocates: its logical
// bytes are well below the baseline while its physical bytes stay near the baseline.
bool looks_simulated(const LedgerEntry& e);

// Run-level ledger metrics (means over the entries, e.g. over a run's samples at their peak).
std::vector<Metric> ledger_metrics(const std::vector<LedgerEntry>& entries, bool declared_simulated);

}  // namespace kvb
