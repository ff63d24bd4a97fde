#include "harness/eval/ledger.h"

#include <sys/resource.h>

#include <cstdint>
#include <optional>

#if KVB_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace kvb {

int64_t peak_rss_bytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

std::vector<Metric> device_allocator_metrics(const std::string& device) {
#if KVB_TORCH_CUDA
  if (device.rfind("cuda", 0) != 0) return {};
  const int index = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
  const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const size_t agg = 0;  // StatType::AGGREGATE
  using D = Direction;
  return {{"device_peak_allocated_bytes", static_cast<double>(st.allocated_bytes[agg].peak),
           "bytes", D::kLower},
          {"device_allocated_bytes", static_cast<double>(st.allocated_bytes[agg].current), "bytes",
           D::kNone},
          {"device_peak_reserved_bytes", static_cast<double>(st.reserved_bytes[agg].peak), "bytes",
           D::kNone},
          {"device_allocator_reserved_bytes", static_cast<double>(st.reserved_bytes[agg].current),
           "bytes", D::kNone}};
#else
  (void)device;
  return {};
#endif
}

namespace {

// What a row written before a field existed reads it as; nullopt: every row has the field.
constexpr std::optional<int64_t> kRequired = std::nullopt;

// Calls visit(key, field, missing) for every ledger field of e (LedgerEntry or const LedgerEntry),
// so that writing a row and reading it back name the same fields.
template <typename Entry, typename Visit>
void for_each_ledger_field(Entry& e, Visit visit) {
  visit("tokens_seen", e.tokens_seen, kRequired);
  visit("baseline_bytes", e.baseline_bytes, kRequired);
  visit("baseline_bytes_16bit", e.baseline_bytes_16bit, std::optional<int64_t>(0));
  auto& f = e.fp;
  visit("device_payload_bytes", f.device_payload_bytes, kRequired);
  visit("device_metadata_bytes", f.device_metadata_bytes, kRequired);
  visit("device_index_bytes", f.device_index_bytes, kRequired);
  visit("device_reserved_bytes", f.device_reserved_bytes, kRequired);
  visit("host_bytes", f.host_bytes, kRequired);
  visit("remote_bytes", f.remote_bytes, kRequired);
  visit("logical_bytes", f.logical_bytes, kRequired);
  visit("tokens_held", f.tokens_held, kRequired);
  visit("model_dtype_device_bytes", f.model_dtype_device_bytes, std::optional<int64_t>(-1));
  visit("model_dtype_host_bytes", f.model_dtype_host_bytes, std::optional<int64_t>(0));
}

}  // namespace

nlohmann::json ledger_to_json(const LedgerEntry& e) {
  nlohmann::json j = nlohmann::json::object();
  for_each_ledger_field(
      e, [&j](const char* key, const int64_t& value, std::optional<int64_t>) { j[key] = value; });
  return j;
}

LedgerEntry ledger_from_json(const nlohmann::json& l) {
  LedgerEntry e;
  for_each_ledger_field(e, [&l](const char* key, int64_t& value, std::optional<int64_t> missing) {
    value = missing ? l.value(key, *missing) : l.at(key).get<int64_t>();
  });
  return e;
}

double physical_bytes_16bit(const LedgerEntry& e, bool device_only) {
  if (e.fp.model_dtype_device_bytes < 0 || e.baseline_bytes_16bit <= 0 || e.baseline_bytes <= 0)
    return -1;
  const double keep =
      static_cast<double>(e.baseline_bytes_16bit) / static_cast<double>(e.baseline_bytes);
  const int64_t off_device = e.fp.host_bytes + e.fp.remote_bytes;
  const double bytes = static_cast<double>(e.fp.physical_bytes() - (device_only ? off_device : 0));
  const double model = static_cast<double>(e.fp.model_dtype_device_bytes +
                                           (device_only ? 0 : e.fp.model_dtype_host_bytes));
  return bytes - model * (1.0 - keep);
}

bool looks_simulated(const LedgerEntry& e) {
  if (e.baseline_bytes <= 0) return false;
  // Simulated = claims to hold less (logical) while its *payload* stays full size (masks,
  // dequantized copies). Metadata is not payload: a method whose savings are eaten by real metadata
  // (sketches, bucket sums) stores physically and is not simulated, it just saves little.
  const double logical = static_cast<double>(e.fp.logical_bytes) / e.baseline_bytes;
  const double payload =
      static_cast<double>(e.fp.device_payload_bytes + e.fp.host_bytes + e.fp.remote_bytes) /
      e.baseline_bytes;
  return logical < 0.9 && payload > 0.9;
}

std::vector<Metric> ledger_metrics(const std::vector<LedgerEntry>& entries,
                                   bool declared_simulated) {
  if (entries.empty()) return {};
  double phys = 0, logical = 0, base = 0, payload = 0, meta = 0, index = 0, reserved = 0, host = 0,
         remote = 0, held = 0, seen = 0;
  bool simulated = declared_simulated;
  for (const auto& e : entries) {
    phys += e.fp.physical_bytes();
    logical += e.fp.logical_bytes;
    base += e.baseline_bytes;
    payload += e.fp.device_payload_bytes;
    meta += e.fp.device_metadata_bytes;
    index += e.fp.device_index_bytes;
    reserved += e.fp.device_reserved_bytes;
    host += e.fp.host_bytes;
    remote += e.fp.remote_bytes;
    held += e.fp.tokens_held;
    seen += e.tokens_seen;
    simulated = simulated || looks_simulated(e);
  }
  const double n = static_cast<double>(entries.size());
  using D = Direction;
  std::vector<Metric> m = {
      {"physical_bytes", phys / n, "bytes", D::kLower},
      {"logical_bytes", logical / n, "bytes", D::kNone},
      {"baseline_bytes", base / n, "bytes", D::kNone},
      {"device_payload_bytes", payload / n, "bytes", D::kLower},
      {"device_metadata_bytes", meta / n, "bytes", D::kLower},
      {"device_index_bytes", index / n, "bytes", D::kLower},
      {"device_reserved_bytes", reserved / n, "bytes", D::kLower},
      {"host_bytes", host / n, "bytes", D::kNone},
      {"remote_bytes", remote / n, "bytes", D::kNone},
      {"tokens_held", held / n, "tokens", D::kNone},
      {"compression_ratio", phys > 0 ? base / phys : 0.0, "x", D::kHigher},
      // Tiering methods (host or remote copies): what stays on the device, and its ratio.
      {"device_bytes", (phys - host - remote) / n, "bytes", D::kLower},
      {"device_compression_ratio", phys - host - remote > 0 ? base / (phys - host - remote) : 0.0,
       "x", D::kHigher},
      {"bytes_per_token", seen > 0 ? phys / seen : 0.0, "bytes", D::kLower},
      {"simulated", simulated ? 1.0 : 0.0, "", D::kNone},
      {"peak_memory_bytes", static_cast<double>(peak_rss_bytes()), "bytes", D::kLower},
  };
  // The same bytes as a 16-bit deployment holds them (an fp32 CPU run's dense rows at 16 bits,
  // codes and fp16 rows as they are) against a 16-bit baseline: the ratio papers report. Only when
  // every entry knows which of its bytes are in the model dtype.
  double phys16 = 0, base16 = 0, dev16 = 0;
  bool known = true;
  for (const auto& e : entries) {
    const double p = physical_bytes_16bit(e);
    known = known && p >= 0;
    phys16 += p;
    base16 += static_cast<double>(e.baseline_bytes_16bit);
    if (p >= 0) dev16 += physical_bytes_16bit(e, /*device_only=*/true);
  }
  if (known && phys16 > 0) {
    m.push_back({"bytes_per_token_16bit", seen > 0 ? phys16 / seen : 0.0, "bytes", D::kLower});
    m.push_back({"compression_ratio_16bit", base16 / phys16, "x", D::kHigher});
    m.push_back(
        {"device_compression_ratio_16bit", dev16 > 0 ? base16 / dev16 : 0.0, "x", D::kHigher});
  }
  return m;
}

}  // namespace kvb
