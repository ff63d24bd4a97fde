#pragma once
// The `profile` protocol's measurement: what the attention of a model on a workload looks like, per
// layer and KV head, on the exact (uncompressed) cache, so that one can tell which family of KV
// methods the workload favours (temporal locality: StreamingLLM, H2O, TTKV; content retrieval:
// RetroInfer, Quest, SnapKV; speculative prefetch: SpeCache).
//
// A window of `window` tokens is prefilled but for its last `decode_steps` tokens, which are then
// decoded one by one (teacher-forced: the text's own next token). At every decode step, for every
// global layer l and KV head h, the KV head's attention distribution is the MEAN of its query
// heads' softmax distributions (what a KV-head-granular store keeps or reads for the group), over
// every row the exact cache holds, the step's own token included. Per step:
//   recency_A           mass on the rows younger than A tokens (A = 16, 64, 256, 1024; age 0 = the
//                       step's own token)
//   sink_mass           mass on the first 4 positions
//   entropy             nats; entropy_norm = entropy / log(n)
//   support90           fewest rows holding 90% of the mass; support90_frac = support90 / n
//   topk_mass           mass on the top_k rows (the oracle read of top_k rows)
//   temporal_capture    mass a StreamingLLM window of top_k rows keeps (4 sink + top_k - 4 recent)
//                       / topk_mass
//   topk_jaccard        Jaccard of this step's and the previous step's top-k positions
//   speculative_capture mass on the previous step's top-k rows / topk_mass (what a prefetch of the
//                       rows the last query wanted hits; the step's own token is never among them)
//   reuse_distance      mean steps since a top-k row was last in a top-k (rows seen before);
//   topk_fresh_share    share of the top-k in no earlier top-k of the window (both from step 2 on)
//   cluster_recall      share of the top-k in the rows a clustered index scans: k-means over the
//                       head's keys at the first decode step (cluster_rows rows per cluster; later
//                       keys join their nearest centroid), clusters ranked by the mean of the
//                       group's q . centroid and scanned until scan_share of the rows is read
//   content_capture     mass of the top_k rows among the scanned ones / topk_mass
//   key_quant_err_B, value_quant_err_B   ||o_q - o|| / ||o|| of the group's attention outputs
//                       when the keys (per-channel groups of quant_group tokens, KIVI's layout),
//                       resp. the values (per-token groups of quant_group channels), held at the
//                       first decode step are quantized to B = 4 or 2 bits (kernels/quantize.h);
//                       later tokens stay exact (KIVI's full-precision residual)
// Sliding-window layers (LayerInput::window > 0) are not measured.

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/model/model.h"
#include "harness/store/results_db.h"

namespace kvb {

struct ProfileOptions {
  int64_t decode_steps = 16;
  int64_t top_k = 32;
  int64_t cluster_rows = 32;
  double scan_share = 0.1;
  int64_t kmeans_iterations = 8;
  int64_t quant_group = 32;
};

// The measure names in report order, and each one's unit.
const std::vector<std::string>& profile_measure_names();
std::string profile_measure_unit(const std::string& name);

struct ProfileSampleResult {
  int64_t layers = 0, kv_heads = 0;
  // Per measure, per (layer * kv_heads + head): the sum over steps and how many steps it holds (so
  // samples aggregate exactly).
  std::map<std::string, std::vector<double>> sum;
  std::map<std::string, std::vector<int64_t>> count;
  void add(const std::string& measure, int64_t layer, int64_t head, double value);
  nlohmann::json to_json() const;
  static ProfileSampleResult from_json(const nlohmann::json& j);
};

ProfileSampleResult run_profile_sample(std::shared_ptr<Model> model,
                                       const std::vector<int64_t>& tokens,
                                       const ProfileOptions& opts);

// Per (layer, head) metrics (Metric::layer and ::head set) and each measure's mean over them.
std::vector<Metric> profile_metrics(const std::vector<ProfileSampleResult>& samples);

}  // namespace kvb
