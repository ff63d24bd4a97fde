#include "harness/eval/stream.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "harness/common/atomic_file.h"
#include "harness/common/error.h"
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

std::string baseline_key(const Model& m, const std::vector<int64_t>& tokens, const StreamOptions& o) {
  nlohmann::json k = {{"v", 1},
                      {"model", m.config.to_json()},
                      {"source", m.source},
                      {"weights_bytes", m.weight_bytes()},
                      {"device", m.device.str()},
                      {"dtype", dtype_name(m.dtype)},
                      {"prefill_tokens", o.prefill_tokens},
                      {"prefill_chunk", o.prefill_chunk},
                      {"tokens", tokens}};
  return sha256_hex(k.dump());
}

}  // namespace

std::vector<float> stream_baseline_logprobs(std::shared_ptr<Model> model,
                                            const std::vector<int64_t>& tokens,
                                            const StreamOptions& opts, bool* from_cache) {
  const int64_t V = model->config.vocab_size;
  const int64_t rows = static_cast<int64_t>(tokens.size()) - 1;
  const size_t want_bytes = static_cast<size_t>(rows * V) * sizeof(float);
  std::string path;
  if (!opts.cache_dir.empty()) {
    path = opts.cache_dir + "/" + baseline_key(*model, tokens, opts) + ".f32";
    if (file_exists(path)) {
      MappedFile f(path);
      if (f.size() == want_bytes) {
        *from_cache = true;
        const float* p = reinterpret_cast<const float*>(f.data());
        return std::vector<float>(p, p + rows * V);
      }
    }
  }
  *from_cache = false;
  CacheContext ctx{model->config, model->device, model->dtype, model};
  Engine e(model, MethodRegistry::instance().create(baseline_method(), ctx, nlohmann::json::object()));
  std::vector<float> out(static_cast<size_t>(rows * V));
  feed_window(e, tokens, opts, [&](const at::Tensor& logits, int64_t first) {
    at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1).contiguous().to(at::kCPU);
    std::copy(lp.data_ptr<float>(), lp.data_ptr<float>() + lp.numel(), out.begin() + first * V);
  });
  if (!path.empty()) {
    // Write-then-rename: a killed process never leaves a half-written baseline behind.
    make_directories(opts.cache_dir);
    write_file_atomically(path, out.data(), static_cast<size_t>(want_bytes));
  }
  return out;
}

StreamSampleResult run_stream_sample(std::shared_ptr<Model> model, const std::string& method,
                                     const nlohmann::json& method_params,
                                     const std::vector<int64_t>& tokens, const StreamOptions& opts) {
  KVB_CHECK(tokens.size() >= 2, "stream: a window needs at least 2 tokens");
  const int64_t V = model->config.vocab_size;
  StreamSampleResult r;
  const std::vector<float> base = stream_baseline_logprobs(model, tokens, opts, &r.baseline_from_cache);
  CacheContext ctx{model->config, model->device, model->dtype, model};
  Engine e(model, MethodRegistry::instance().create(method, ctx, method_params));
  r.kl.assign(tokens.size() - 1, 0.f);
  feed_window(e, tokens, opts, [&](const at::Tensor& logits, int64_t first) {
    at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1).contiguous().to(at::kCPU);
    const int64_t n = lp.size(0);
    const float* m = lp.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = first + i;
      const float* b = base.data() + pos * V;
      const float* q = m + i * V;
      double kl = 0;
      int64_t am_b = 0, am_q = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double pb = std::exp(static_cast<double>(b[v]));
        kl += pb * (static_cast<double>(b[v]) - q[v]);
        if (b[v] > b[am_b]) am_b = v;
        if (q[v] > q[am_q]) am_q = v;
      }
      const int64_t target = tokens[pos + 1];
      r.kl[pos] = static_cast<float>(std::max(0.0, kl));  // rounding can dip below 0
      r.nll_sum += -q[target];
      r.top1_agree += am_b == am_q;
      r.abs_dprob_sum += std::abs(std::exp(static_cast<double>(q[target])) - std::exp(static_cast<double>(b[target])));
      r.tokens++;
    }
  });
  r.ledger.fp = e.kv().footprint();
  r.ledger.tokens_seen = static_cast<int64_t>(tokens.size()) - 1;  // the last token is only predicted
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
