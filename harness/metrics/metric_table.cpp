#include "harness/metrics/metric_table.h"

#include <string>

#include "harness/common/error.h"
#include "harness/common/strings.h"

namespace kvb {

namespace {

constexpr std::string_view kHigher = "higher";
constexpr std::string_view kLower = "lower";

// Text metrics are per-sample scores in [0, 1] averaged over samples; RULER and LongBench print
// them x100. The numeric metrics below are what the stream, perf and qa protocols record (DESIGN.md
// §7). A function-local static, so that other static initializers may already look metrics up.
const std::vector<MetricInfo>& table() {
  static const std::vector<MetricInfo> kMetrics = {
      // ---- task metrics (harness/metrics/text_metrics.h) ----
      {"exact_match", "fraction", kHigher,
       "1 when the SQuAD-normalized answer equals a reference answer, averaged over samples"},
      {"string_match_all", "fraction", kHigher,
       "RULER: fraction of the reference strings contained (case-insensitive) in the answer, "
       "averaged"},
      {"string_match_part", "fraction", kHigher,
       "RULER: 1 when any reference string is contained (case-insensitive) in the answer, "
       "averaged"},
      {"ordered_word_recall", "fraction", kHigher,
       "longest common subsequence of the answer's words and the reference's (SQuAD-normalized) "
       "/ reference words: how much of a list was repeated in order (the copy task), averaged"},
      {"qa_f1", "fraction", kHigher,
       "LongBench qa_f1_score: token F1 of the normalized answer vs the best reference, averaged"},
      {"rouge_l", "fraction", kHigher,
       "LongBench rouge_score: ROUGE-L F of the `rouge` package (summary-level, distinct words), "
       "averaged"},
      {"classification", "fraction", kHigher,
       "LongBench classification_score: 1/len(matched classes) when the true class is matched, "
       "averaged"},
      {"retrieval", "fraction", kHigher,
       "LongBench retrieval_score: fraction of numbers in the answer equal to the true paragraph "
       "number"},
      {"count", "fraction", kHigher,
       "LongBench count_score: fraction of numbers in the answer equal to the true count, "
       "averaged"},
      {"code_sim", "fraction", kHigher,
       "LongBench code_sim_score: fuzz.ratio/100 of the first code line of the answer vs the "
       "reference"},
      // ---- teacher-forced scoring (stream protocol) ----
      {"nll", "nats/token", kLower,
       "mean negative log-likelihood of the reference tokens under teacher forcing"},
      {"ppl", "", kLower, "perplexity: exp(nll)"},
      {"kl_mean", "nats", kLower,
       "mean over scored tokens of KL(full-cache next-token distribution || method's)"},
      {"kl_p50", "nats", kLower, "median over scored tokens of the per-token KL to the full cache"},
      {"kl_p90", "nats", kLower, "90th percentile over scored tokens of the per-token KL"},
      {"kl_p99", "nats", kLower, "99th percentile over scored tokens of the per-token KL"},
      {"kl_max", "nats", kLower, "largest per-token KL to the full cache"},
      {"top1_agreement", "fraction", kHigher,
       "fraction of scored tokens whose argmax next token equals the full cache's"},
      {"mean_abs_dprob", "probability", kLower,
       "mean |p_method - p_full| of the reference token's probability over scored tokens"},
      // ---- speed (perf protocol; medians over repeats) ----
      {"prefill_tok_s", "tokens/s", kHigher, "prompt tokens processed per second during prefill"},
      {"decode_tok_s", "tokens/s", kHigher,
       "generated tokens per second during decode, whole batch"},
      {"ttft_ms", "ms", kLower,
       "time to first token: request start to the first generated token (perf); qa: the context "
       "made ready at query time (its prefill, or the splice of cached documents) plus the first "
       "question's prefill"},
      {"tpot_ms", "ms", kLower, "time per output token after the first"},
      // ---- memory ----
      {"physical_bytes", "bytes", kLower,
       "bytes really allocated behind the KV cache (what a method actually saves)"},
      {"logical_bytes", "bytes", kLower,
       "bytes the compressed cache contents need (payload + metadata), ignoring allocation slack"},
      {"baseline_bytes", "bytes", kLower,
       "bytes the uncompressed cache would take for the same tokens (the reference point)"},
      {"compression_ratio", "x", kHigher, "baseline_bytes / physical_bytes"},
      {"bytes_per_token", "bytes/token", kLower, "physical_bytes / number of cached tokens"},
      {"compression_ratio_16bit", "x", kHigher,
       "compression_ratio as a 16-bit deployment sees it: rows kept in the model dtype counted at 16 "
       "bits, codes and fp16 rows as they are, against a 16-bit baseline (what papers report)"},
      {"bytes_per_token_16bit", "bytes/token", kLower,
       "bytes_per_token with rows kept in the model dtype counted at 16 bits"},
      {"peak_memory_bytes", "bytes", kLower, "peak device memory allocated during the run"},
      // ---- serving (serve protocol: a trace through a continuous-batching simulation driven by
      // the method's measured footprint; times from a roofline model, so simulated) ----
      {"serve_slo_attainment", "fraction", kHigher,
       "requests meeting both the TTFT and the TPOT objective (rejected ones fail)"},
      {"serve_output_tok_s", "tokens/s", kHigher, "output tokens per simulated second over the trace"},
      {"serve_ttft_ms_p50", "ms", kLower, "median time to first token, queueing included"},
      {"serve_ttft_ms_p90", "ms", kLower, "90th-percentile time to first token"},
      {"serve_ttft_ms_p99", "ms", kLower, "99th-percentile time to first token"},
      {"serve_tpot_ms_p50", "ms", kLower, "median per-request time per output token"},
      {"serve_tpot_ms_p99", "ms", kLower, "99th-percentile per-request time per output token"},
      {"serve_prefix_hit_rate", "fraction", kHigher,
       "prompt tokens served from the prefix store (a compressed method fits more blocks)"},
      {"serve_mean_running", "requests", kHigher,
       "time-weighted requests running at once: what the KV pool admits when it binds (below "
       "saturation, fewer can simply mean requests finish sooner)"},
      {"serve_allocator_waste", "fraction", kLower,
       "time-weighted share of reserved KV bytes holding no live token"},
      {"serve_preemptions", "", kLower, "requests preempted (freed and recomputed) for lack of KV room"},
      {"serve_load_imbalance", "x", kLower,
       "most requests the router sent to one instance / the mean (1: even)"},
  };
  return kMetrics;
}

std::vector<std::string> metric_names() {
  std::vector<std::string> names;
  for (const auto& m : table()) names.emplace_back(m.name);
  return names;
}

}  // namespace

const std::vector<MetricInfo>& all_metrics() { return table(); }

const MetricInfo& metric_info(std::string_view name) {
  for (const auto& m : table()) {
    if (m.name == name) return m;
  }
  // The full list too: a missing unit suffix ("ttft" for "ttft_ms") is too far for the typo hint.
  KVB_FAIL("unknown metric '", name, "'", did_you_mean(name, metric_names()),
           "; known: ", join(metric_names(), ", ").c_str());
}

bool is_known_metric(std::string_view name) {
  for (const auto& m : table()) {
    if (m.name == name) return true;
  }
  return false;
}

bool is_better(const MetricInfo& info, double a, double b) {
  return info.direction == kHigher ? a > b : a < b;
}

}  // namespace kvb
