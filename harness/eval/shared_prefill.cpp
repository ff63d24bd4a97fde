#include "harness/eval/shared_prefill.h"

#include <cstdlib>
#include <string>

#include "harness/common/error.h"
#include "harness/common/fast_hash.h"

namespace kvb {
namespace {

constexpr int64_t kDefaultBudgetMiB = 2048;

int64_t budget_from_env() {
  const char* v = std::getenv("KVB_SHARED_PREFILL_MB");
  if (v == nullptr || *v == '\0') return kDefaultBudgetMiB << 20;
  const std::string s(v);
  KVB_CHECK(s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos,
            "KVB_SHARED_PREFILL_MB: expected a whole number of MiB (0: no shared prefill), got '",
            s.substr(0, 40), "'");
  return std::stoll(s) << 20;
}

}  // namespace

SharedPrefills::SharedPrefills() : budget_bytes_(budget_from_env()) {}

SharedPrefills& SharedPrefills::instance() {
  static SharedPrefills s;
  return s;
}

std::shared_ptr<const PrefillRecording> SharedPrefills::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second;
}

bool SharedPrefills::has_room(int64_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  return budget_bytes_ > 0 && held_bytes_ + bytes <= budget_bytes_;
}

void SharedPrefills::put(const std::string& key, std::shared_ptr<const PrefillRecording> rec) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t bytes = rec->bytes();
  if (budget_bytes_ <= 0 || held_bytes_ + bytes > budget_bytes_ || entries_.count(key)) return;
  held_bytes_ += bytes;
  entries_.emplace(key, std::move(rec));
}

void SharedPrefills::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  held_bytes_ = 0;
}

void SharedPrefills::set_budget(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_bytes_ = bytes;
}

std::string shared_prefill_key(const Model& model, int64_t chunk, const std::vector<int64_t>& tokens) {
  FastHash h;
  h.update_field(model.content_hash());
  h.update_field(model.device.str());
  h.update_field(dtype_name(model.dtype));
  h.update(&chunk, sizeof chunk);
  h.update(tokens.data(), tokens.size() * sizeof(int64_t));
  return h.hex_digest() + ":" + std::to_string(tokens.size());
}

int64_t recording_bytes_estimate(const ModelConfig& c, int64_t dtype_bytes, int64_t tokens) {
  const int64_t per_layer = (c.n_heads + 3 * c.n_kv_heads) * c.head_dim + c.dim;
  return tokens * per_layer * c.n_layers * dtype_bytes;
}

int64_t recording_bytes_estimate(const Model& model, int64_t tokens) {
  return recording_bytes_estimate(model.config, dtype_bytes(model.dtype), tokens);
}

}  // namespace kvb
