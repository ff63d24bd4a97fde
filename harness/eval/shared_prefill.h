#pragma once
// The process's recordings of context prefills (harness/engine/prefill_replay.h), so that the runs
// of a grid, and a method's run and the full-cache answers it is paired with, prefill each context
// once. An entry is keyed by everything that decides the prefill: the model's content, device and
// dtype, the chunk size and the token ids.
//
// The store holds at most KVB_SHARED_PREFILL_MB MiB (default 2048; 0 turns sharing off, the
// per-cell path). Once full it keeps what it has and records nothing new: a grid visits its samples
// cell after cell, so the first samples stay shared for every cell, where evicting the oldest would
// miss on every visit.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "harness/engine/prefill_replay.h"
#include "harness/model/model.h"

namespace kvb {

class SharedPrefills {
 public:
  static SharedPrefills& instance();

  bool enabled() const { return budget_bytes() > 0; }
  int64_t budget_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return budget_bytes_;
  }
  std::shared_ptr<const PrefillRecording> find(const std::string& key) const;
  // Whether a recording of `bytes` would be kept.
  bool has_room(int64_t bytes) const;
  // Keeps `rec` when it fits.
  void put(const std::string& key, std::shared_ptr<const PrefillRecording> rec);
  void clear();
  // For tests: the budget in bytes (0: off).
  void set_budget(int64_t bytes);

 private:
  SharedPrefills();
  mutable std::mutex mu_;
  int64_t budget_bytes_ = 0;
  int64_t held_bytes_ = 0;
  std::unordered_map<std::string, std::shared_ptr<const PrefillRecording>> entries_;
};

// The key of the prefill of `tokens` on `model` in chunks of `chunk`.
std::string shared_prefill_key(const Model& model, int64_t chunk, const std::vector<int64_t>& tokens);

// About what the recording of a `tokens`-token prefill holds: q, k before and after RoPE, v and the
// hidden state of every layer, at the model's dtype.
int64_t recording_bytes_estimate(const ModelConfig& config, int64_t dtype_bytes, int64_t tokens);
int64_t recording_bytes_estimate(const Model& model, int64_t tokens);

}  // namespace kvb
