#include "harness/eval/perf.h"

#include <ATen/ATen.h>

#include <chrono>
#include <random>

#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "harness/metrics/portable_random.h"
#include "harness/metrics/statistics.h"

namespace kvb {

PerfCell run_perf_cell(std::shared_ptr<Model> model, const std::string& method,
                       const nlohmann::json& method_params, int64_t batch, int64_t context,
                       int64_t decode_tokens, int64_t repeats, int64_t prefill_chunk, uint64_t seed) {
  using clock = std::chrono::steady_clock;
  const auto& c = model->config;
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int64_t>> prompts(batch);
  for (auto& p : prompts) {
    if (c.add_bos) p.push_back(c.bos_id);
    // Never-zero ids from the vocabulary (not a run of zeros: kernels must not be timed on zeros).
    while (static_cast<int64_t>(p.size()) < context)
      p.push_back(3 + static_cast<int64_t>(uniform_index(rng, static_cast<uint64_t>(c.vocab_size - 3))));
  }
  CacheContext ctx{c, model->device, model->dtype, model};
  std::vector<double> prefill_tps, decode_tps, ttft, tpot;
  PerfCell cell;
  cell.batch = batch;
  cell.context = context;
  cell.decode_tokens = decode_tokens;
  cell.repeats = repeats;
  for (int64_t r = 0; r <= repeats; ++r) {
    EngineOptions eo;
    eo.prefill_chunk = prefill_chunk;
    Engine e(model, MethodRegistry::instance().create(method, ctx, method_params), eo);
    std::vector<int64_t> seqs;
    for (int64_t b = 0; b < batch; ++b) seqs.push_back(e.new_sequence());
    auto t0 = clock::now();
    at::Tensor logits = e.prefill(seqs, prompts).to(at::kCPU);  // to(kCPU) waits for the device
    auto t1 = clock::now();
    std::vector<int64_t> next(batch);
    at::Tensor am = logits.argmax(-1);
    for (int64_t b = 0; b < batch; ++b) next[b] = am[b].item<int64_t>();
    auto t2 = clock::now();
    std::vector<double> steps;
    for (int64_t i = 0; i < decode_tokens; ++i) {
      auto s0 = clock::now();
      at::Tensor l = e.decode(seqs, next).to(at::kCPU);
      at::Tensor a = l.argmax(-1);
      for (int64_t b = 0; b < batch; ++b) next[b] = a[b].item<int64_t>();
      steps.push_back(std::chrono::duration<double, std::milli>(clock::now() - s0).count());
    }
    const double decode_s = std::chrono::duration<double>(clock::now() - t2).count();
    if (r == 0) continue;  // warm-up
    prefill_tps.push_back(batch * context / std::chrono::duration<double>(t1 - t0).count());
    ttft.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    decode_tps.push_back(batch * decode_tokens / decode_s);
    tpot.insert(tpot.end(), steps.begin(), steps.end());
    if (r == repeats) {
      cell.ledger.fp = e.kv().footprint();
      cell.ledger.tokens_seen = batch * (context + decode_tokens);
      // Per sequence: a model's window layers hold only their window, in the full cache too.
      cell.ledger.baseline_bytes = batch * c.full_kv_bytes(context + decode_tokens, dtype_bytes(model->dtype));
      cell.ledger.baseline_bytes_16bit = batch * c.full_kv_bytes(context + decode_tokens, 2);
    }
  }
  cell.prefill_tok_s = percentile(prefill_tps, 50);
  cell.decode_tok_s = percentile(decode_tps, 50);
  cell.decode_tok_s_min = *std::min_element(decode_tps.begin(), decode_tps.end());
  cell.decode_tok_s_max = *std::max_element(decode_tps.begin(), decode_tps.end());
  cell.ttft_ms = percentile(ttft, 50);
  cell.tpot_ms_p50 = percentile(tpot, 50);
  cell.tpot_ms_p10 = percentile(tpot, 10);
  cell.tpot_ms_p90 = percentile(tpot, 90);
  return cell;
}

namespace {

// A cell's settings and figures under their JSON names: to_json and from_json walk the same lists.
constexpr std::pair<const char*, int64_t PerfCell::*> kCellSettings[] = {
    {"batch", &PerfCell::batch},
    {"context", &PerfCell::context},
    {"decode_tokens", &PerfCell::decode_tokens},
    {"repeats", &PerfCell::repeats}};
constexpr std::pair<const char*, double PerfCell::*> kCellFigures[] = {
    {"prefill_tok_s", &PerfCell::prefill_tok_s},
    {"decode_tok_s", &PerfCell::decode_tok_s},
    {"decode_tok_s_min", &PerfCell::decode_tok_s_min},
    {"decode_tok_s_max", &PerfCell::decode_tok_s_max},
    {"ttft_ms", &PerfCell::ttft_ms},
    {"tpot_ms_p50", &PerfCell::tpot_ms_p50},
    {"tpot_ms_p10", &PerfCell::tpot_ms_p10},
    {"tpot_ms_p90", &PerfCell::tpot_ms_p90}};

}  // namespace

nlohmann::json PerfCell::to_json() const {
  nlohmann::json j = {{"physical_bytes", ledger.fp.physical_bytes()},
                      {"logical_bytes", ledger.fp.logical_bytes},
                      {"reserved_bytes", ledger.fp.device_reserved_bytes},
                      {"tokens_held", ledger.fp.tokens_held},
                      {"tokens_seen", ledger.tokens_seen},
                      {"baseline_bytes", ledger.baseline_bytes},
                      {"baseline_bytes_16bit", ledger.baseline_bytes_16bit},
                      {"model_dtype_device_bytes", ledger.fp.model_dtype_device_bytes},
                      {"model_dtype_host_bytes", ledger.fp.model_dtype_host_bytes}};
  for (const auto& [name, member] : kCellSettings) j[name] = this->*member;
  for (const auto& [name, member] : kCellFigures) j[name] = this->*member;
  return j;
}

PerfCell PerfCell::from_json(const nlohmann::json& j) {
  PerfCell c;
  for (const auto& [name, member] : kCellSettings) c.*member = j.at(name).get<int64_t>();
  for (const auto& [name, member] : kCellFigures) c.*member = j.at(name).get<double>();
  // The ledger's physical total is stored as payload so that physical_bytes() reads back the same.
  c.ledger.fp.device_payload_bytes = j.at("physical_bytes");
  c.ledger.fp.logical_bytes = j.at("logical_bytes");
  c.ledger.fp.device_reserved_bytes = j.at("reserved_bytes");
  c.ledger.fp.tokens_held = j.at("tokens_held");
  c.ledger.tokens_seen = j.at("tokens_seen");
  c.ledger.baseline_bytes = j.at("baseline_bytes");
  c.ledger.baseline_bytes_16bit = j.value("baseline_bytes_16bit", int64_t{0});
  c.ledger.fp.model_dtype_device_bytes = j.value("model_dtype_device_bytes", int64_t{-1});
  c.ledger.fp.model_dtype_host_bytes = j.value("model_dtype_host_bytes", int64_t{0});
  return c;
}

std::vector<Metric> perf_metrics(const std::vector<PerfCell>& cells, bool declared_simulated) {
  using D = Direction;
  std::vector<Metric> m;
  std::vector<LedgerEntry> ledger;
  for (size_t i = 0; i < cells.size(); ++i) {
    const PerfCell& c = cells[i];
    ledger.push_back(c.ledger);
    for (const std::string& suffix : {std::string(i == 0 ? "" : "-"), "_b" + std::to_string(c.batch)}) {
      if (suffix == "-") continue;
      m.push_back({"prefill_tok_s" + suffix, c.prefill_tok_s, "tok/s", D::kHigher});
      m.push_back({"decode_tok_s" + suffix, c.decode_tok_s, "tok/s", D::kHigher});
      m.push_back({"ttft_ms" + suffix, c.ttft_ms, "ms", D::kLower});
      m.push_back({"tpot_ms" + suffix, c.tpot_ms_p50, "ms", D::kLower});
      m.push_back({"tpot_ms_p10" + suffix, c.tpot_ms_p10, "ms", D::kLower});
      m.push_back({"tpot_ms_p90" + suffix, c.tpot_ms_p90, "ms", D::kLower});
    }
  }
  auto l = ledger_metrics(ledger, declared_simulated);
  m.insert(m.end(), l.begin(), l.end());
  return m;
}

}  // namespace kvb
