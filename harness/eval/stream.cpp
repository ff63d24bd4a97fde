#include "harness/eval/stream.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>

#include "harness/common/atomic_file.h"
#include "harness/common/error.h"
#include "harness/common/fast_hash.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/engine/engine.h"
#include "harness/kv/baseline_method.h"
#include "harness/kv/hindsight.h"
#include "harness/kv/method_registry.h"
#include "harness/metrics/statistics.h"

namespace kvb {

namespace {

// Feeds the window with the stream schedule and hands each position's fp32 logits to `cb`
// ([n, vocab] rows for positions first..first+n-1).
void feed_window(Engine& e, const std::vector<int64_t>& tokens, const StreamOptions& opts,
                 const LogitsCallback& cb) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t P = std::min<int64_t>(std::max<int64_t>(1, opts.prefill_tokens), n - 1);
  const int64_t seq = e.new_sequence();
  std::vector<int64_t> head(tokens.begin(), tokens.begin() + P);
  if (auto* oracle = dynamic_cast<HindsightCache*>(&e.kv())) {
    // An oracle compresses the prompt knowing the tokens the window feeds after it.
    e.prefill({seq}, {head}, cb, /*call_end_prefill=*/false);
    HindsightPass pass;
    pass.engine = &e;
    pass.seq = seq;
    pass.continuations = {std::vector<int64_t>(tokens.begin() + P, tokens.end() - 1)};
    pass.question_tokens = {0};
    oracle->run_hindsight_pass(pass);
    e.kv().end_prefill(seq);
  } else {
    e.prefill({seq}, {head}, cb);
  }
  for (int64_t i = P; i < n - 1; ++i) cb(e.decode({seq}, {tokens[i]}), i);
}

// The cache entry's name: a hash of everything that decides the baseline's logits. The model enters
// by its content, so a checkpoint replaced in place with other weights of the same size misses the
// entries of the old one; its path does not enter (a moved model keeps its entries).
std::string baseline_key(const Model& m, const std::vector<int64_t>& tokens, const StreamOptions& o) {
  nlohmann::json k = {{"v", 2},
                      {"model", m.config.to_json()},
                      {"content", m.content_hash()},
                      {"device", m.device.str()},
                      {"dtype", dtype_name(m.dtype)},
                      {"prefill_tokens", o.prefill_tokens},
                      {"prefill_chunk", o.prefill_chunk},
                      {"tokens", tokens}};
  return sha256_hex(k.dump());
}

// An entry is the [rows, vocab] fp32 log-probabilities followed by this trailer, so a file that was
// cut short, zero-filled or changed is told from a valid one before its numbers are used.
struct EntryTrailer {
  char magic[8];
  uint64_t payload_bytes;
  uint64_t payload_hash;  // FastHash of the payload
};
static_assert(sizeof(EntryTrailer) == 24, "the trailer's layout is the file format");
constexpr char kEntryMagic[8] = {'K', 'V', 'B', 'L', 'O', 'G', 'P', '2'};
constexpr size_t kTrailerFloats = sizeof(EntryTrailer) / sizeof(float);

std::string entry_path(const Model& m, const std::vector<int64_t>& tokens, const StreamOptions& o) {
  return o.cache_dir.empty() ? "" : o.cache_dir + "/" + baseline_key(m, tokens, o) + ".f32";
}

// The entry's log-probabilities ([floats]), or nothing when the file is missing or fails its check
// (it is then recomputed and replaced).
std::optional<std::vector<float>> read_entry(const std::string& path, size_t floats) {
  if (path.empty() || !file_exists(path)) return std::nullopt;
  MappedFile f(path);
  const size_t payload = floats * sizeof(float);
  if (f.size() != payload + sizeof(EntryTrailer)) return std::nullopt;
  EntryTrailer t;
  std::memcpy(&t, f.data() + payload, sizeof(t));
  if (std::memcmp(t.magic, kEntryMagic, sizeof(kEntryMagic)) != 0 || t.payload_bytes != payload ||
      t.payload_hash != fast_hash64(f.data(), payload))
    return std::nullopt;
  const float* p = reinterpret_cast<const float*>(f.data());
  return std::vector<float>(p, p + floats);
}

// Writes `lp` and its trailer (write-then-rename: a killed process never leaves half an entry).
// `lp` has room reserved for the trailer, which is appended and removed again.
void write_entry(const std::string& path, const std::string& dir, std::vector<float>* lp) {
  if (path.empty()) return;
  const size_t payload = lp->size() * sizeof(float);
  EntryTrailer t;
  std::memcpy(t.magic, kEntryMagic, sizeof(kEntryMagic));
  t.payload_bytes = payload;
  t.payload_hash = fast_hash64(lp->data(), payload);
  const size_t floats = lp->size();
  lp->resize(floats + kTrailerFloats);
  std::memcpy(lp->data() + floats, &t, sizeof(t));
  make_directories(dir);
  write_file_atomically(path, lp->data(), payload + sizeof(t));
  lp->resize(floats);
}

// A [rows, vocab] buffer with room for the entry's trailer, so writing it copies nothing.
std::vector<float> logprob_buffer(size_t floats) {
  std::vector<float> v;
  v.reserve(floats + kTrailerFloats);
  v.resize(floats);
  return v;
}

// Runs the window through `e` and returns every position's log-probabilities, [rows, vocab].
std::vector<float> window_logprobs(Engine& e, const std::vector<int64_t>& tokens,
                                   const StreamOptions& opts, int64_t V) {
  std::vector<float> out = logprob_buffer((tokens.size() - 1) * static_cast<size_t>(V));
  feed_window(e, tokens, opts, [&](const at::Tensor& logits, int64_t first) {
    at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1).contiguous().to(at::kCPU);
    std::copy(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel(), out.begin() + first * V);
  });
  return out;
}

// Scores the method's log-probabilities `q` ([n, vocab], positions first..first+n-1) against the
// baseline's `base` ([rows, vocab]).
void score_rows(const float* base, const float* q_rows, int64_t n, int64_t first, int64_t V,
                const std::vector<int64_t>& tokens, StreamSampleResult* r) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = first + i;
    const float* b = base + pos * V;
    const float* q = q_rows + i * V;
    double kl = 0;
    int64_t am_b = 0, am_q = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double pb = std::exp(static_cast<double>(b[v]));
      kl += pb * (static_cast<double>(b[v]) - q[v]);
      if (b[v] > b[am_b]) am_b = v;
      if (q[v] > q[am_q]) am_q = v;
    }
    const int64_t target = tokens[pos + 1];
    r->kl[pos] = static_cast<float>(std::max(0.0, kl));  // rounding can dip below 0
    r->nll_sum += -q[target];
    r->top1_agree += am_b == am_q;
    r->abs_dprob_sum += std::abs(std::exp(static_cast<double>(q[target])) -
                                 std::exp(static_cast<double>(b[target])));
    r->tokens++;
  }
}

// The baseline method with its defaults: its logits are the baseline itself.
bool is_baseline_run(const std::string& method, const nlohmann::json& params) {
  return method == baseline_method() && params.empty();
}

// The baseline run's own logits check the cache: an entry that differs from them is wrong (the
// computation is deterministic), so it is named on stderr and replaced. Returns whether the entry
// held exactly `own`.
bool check_entry(const Model& m, const std::vector<int64_t>& tokens, const StreamOptions& opts,
                 std::vector<float>* own) {
  const std::string path = entry_path(m, tokens, opts);
  if (path.empty()) return false;
  const auto cached = read_entry(path, own->size());
  if (cached && std::memcmp(cached->data(), own->data(), own->size() * sizeof(float)) == 0)
    return true;
  if (cached)
    std::cerr << "kvbench: warning: baseline cache entry " << path
              << " differs from the full cache's own logits; replaced with them\n";
  write_entry(path, opts.cache_dir, own);
  return false;
}

}  // namespace

std::vector<float> stream_baseline_logprobs(std::shared_ptr<Model> model,
                                            const std::vector<int64_t>& tokens,
                                            const StreamOptions& opts, bool* from_cache) {
  const int64_t V = model->config.vocab_size;
  const std::string path = entry_path(*model, tokens, opts);
  if (auto cached = read_entry(path, (tokens.size() - 1) * static_cast<size_t>(V))) {
    *from_cache = true;
    return std::move(*cached);
  }
  *from_cache = false;
  CacheContext ctx{model->config, model->device, model->dtype, model};
  Engine e(model, MethodRegistry::instance().create(baseline_method(), ctx, nlohmann::json::object()));
  std::vector<float> out = window_logprobs(e, tokens, opts, V);
  write_entry(path, opts.cache_dir, &out);
  return out;
}

StreamSampleResult run_stream_sample(std::shared_ptr<Model> model, const std::string& method,
                                     const nlohmann::json& method_params,
                                     const std::vector<int64_t>& tokens, const StreamOptions& opts) {
  KVB_CHECK(tokens.size() >= 2, "stream: a window needs at least 2 tokens");
  const int64_t V = model->config.vocab_size;
  const int64_t rows = static_cast<int64_t>(tokens.size()) - 1;
  StreamSampleResult r;
  r.kl.assign(tokens.size() - 1, 0.f);
  CacheContext ctx{model->config, model->device, model->dtype, model};
  Engine e(model, MethodRegistry::instance().create(method, ctx, method_params));
  if (is_baseline_run(method, method_params)) {
    // Its own logits are the baseline: scored against themselves, and checked against the cache.
    std::vector<float> own = window_logprobs(e, tokens, opts, V);
    r.baseline_from_cache = check_entry(*model, tokens, opts, &own);
    score_rows(own.data(), own.data(), rows, 0, V, tokens, &r);
  } else {
    const std::vector<float> base =
        stream_baseline_logprobs(model, tokens, opts, &r.baseline_from_cache);
    feed_window(e, tokens, opts, [&](const at::Tensor& logits, int64_t first) {
      at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1).contiguous().to(at::kCPU);
      score_rows(base.data(), lp.data_ptr<float>(), lp.size(0), first, V, tokens, &r);
    });
  }
  r.ledger.fp = e.kv().footprint();
  r.ledger.tokens_seen = rows;  // the last token is only predicted
  // full_kv_bytes: a model's window layers hold only their window, in the full cache too.
  r.ledger.baseline_bytes = model->config.full_kv_bytes(r.ledger.tokens_seen, dtype_bytes(model->dtype));
  r.ledger.baseline_bytes_16bit = model->config.full_kv_bytes(r.ledger.tokens_seen, 2);
  r.counters = e.kv().counters();
  return r;
}

nlohmann::json StreamSampleResult::to_json() const {
  return {{"tokens", tokens},
          {"nll_sum", nll_sum},
          {"kl", kl},
          {"top1_agree", top1_agree},
          {"abs_dprob_sum", abs_dprob_sum},
          {"baseline_from_cache", baseline_from_cache},
          {"counters", counters},
          {"ledger", ledger_to_json(ledger)}};
}

StreamSampleResult StreamSampleResult::from_json(const nlohmann::json& j) {
  StreamSampleResult r;
  r.tokens = j.at("tokens").get<int64_t>();
  r.nll_sum = j.at("nll_sum").get<double>();
  r.kl = j.at("kl").get<std::vector<float>>();
  r.top1_agree = j.at("top1_agree").get<int64_t>();
  r.abs_dprob_sum = j.at("abs_dprob_sum").get<double>();
  r.baseline_from_cache = j.value("baseline_from_cache", false);
  r.counters = j.value("counters", std::map<std::string, double>{});
  r.ledger = ledger_from_json(j.at("ledger"));
  return r;
}

std::vector<Metric> stream_metrics(const std::vector<StreamSampleResult>& samples,
                                   bool declared_simulated) {
  using D = Direction;
  double nll = 0, dp = 0;
  int64_t n = 0, agree = 0;
  std::vector<double> kl;
  std::vector<LedgerEntry> ledger;
  for (const auto& s : samples) {
    nll += s.nll_sum;
    dp += s.abs_dprob_sum;
    n += s.tokens;
    agree += s.top1_agree;
    kl.insert(kl.end(), s.kl.begin(), s.kl.end());
    ledger.push_back(s.ledger);
  }
  if (n == 0) return {};
  const double max_kl = *std::max_element(kl.begin(), kl.end());
  std::vector<Metric> m = {
      {"nll", nll / n, "nats/token", D::kLower},
      {"ppl", std::exp(nll / n), "", D::kLower},
      {"kl_mean", mean(kl), "nats", D::kLower},
      {"kl_p50", percentile(kl, 50), "nats", D::kLower},
      {"kl_p90", percentile(kl, 90), "nats", D::kLower},
      {"kl_p99", percentile(kl, 99), "nats", D::kLower},
      {"kl_max", max_kl, "nats", D::kLower},
      {"top1_agreement", static_cast<double>(agree) / n, "", D::kHigher},
      {"mean_abs_dprob", dp / n, "", D::kLower},
      {"tokens_scored", static_cast<double>(n), "tokens", D::kNone},
  };
  for (auto& x : m) x.n = n;
  auto l = ledger_metrics(ledger, declared_simulated);
  m.insert(m.end(), l.begin(), l.end());
  return m;
}

}  // namespace kvb
