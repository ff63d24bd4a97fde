#pragma once
// The measurements of the profile protocol (profile.h) on one attention distribution, one query
// step at a time: each is a small function of the probabilities (and the keys and values where it
// needs them), so that a test can check it on a case computed by hand.
//
// Throughout, p: [n] fp32 attention probabilities over the rows a store holds (summing to 1), and
// index: [n] int64 the sequence position of each row (0 = the first token), as HeadSnapshot gives
// them. A row's age is (newest position) - index: the step's own token has age 0.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <vector>

#include "kvb/kernels/quantize.h"

namespace kvb::attention_measures {

// Attention mass on the rows younger than `max_age` (age < max_age), newest = the largest index.
double mass_within_age(const at::Tensor& p, const at::Tensor& index, int64_t max_age);
// Attention mass on the first `n_sink` positions (index < n_sink): the attention sink.
double sink_mass(const at::Tensor& p, const at::Tensor& index, int64_t n_sink);
// Shannon entropy in nats (0 log 0 = 0).
double entropy(const at::Tensor& p);
// The fewest rows whose mass reaches `share` (effective support): rows by decreasing p.
int64_t support_count(const at::Tensor& p, double share);
// The sequence positions of the k most attended rows (k clipped to n), sorted ascending; ties go to
// the lower row.
std::vector<int64_t> top_k_positions(const at::Tensor& p, const at::Tensor& index, int64_t k);
// |a ∩ b| / |a ∪ b| of two ascending position lists; 1 when both are empty.
double jaccard(const std::vector<int64_t>& a, const std::vector<int64_t>& b);
// Attention mass on the rows at the given positions (positions the store does not hold add 0).
double mass_at(const at::Tensor& p, const at::Tensor& index, const std::vector<int64_t>& positions);
// Mass a StreamingLLM-shaped window of `rows` rows keeps: the first min(n_sink, rows) positions and
// the most recent rows - that many.
double window_mass(const at::Tensor& p, const at::Tensor& index, int64_t rows, int64_t n_sink);
// Mass of the k largest probabilities among the rows whose mask is set (mask: [n] bool).
double top_k_mass_among(const at::Tensor& p, const at::Tensor& mask, int64_t k);

// Reuse distance of top-k rows: for each position in a step's top-k, the steps since it was last in
// a top-k (steps are numbered by the caller, increasing).
class TopKReuse {
 public:
  struct StepResult {
    double distance_sum = 0;  // summed over the rows that were in an earlier top-k
    int64_t reused = 0;       // how many rows were
    int64_t fresh = 0;        // rows in no earlier top-k
  };
  StepResult observe(int64_t step, const std::vector<int64_t>& positions);

 private:
  std::map<int64_t, int64_t> last_step_;  // position -> the last step it was in a top-k
};

// A clustered key index as content retrieval builds one (RetroInfer): k-means over one head's keys,
// then, per query, the clusters ranked by the query's score against their centroids and scanned in
// that order until a fixed share of the rows is read.
class ClusteredKeyIndex {
 public:
  // keys: [n, d] fp32; positions: [n] int64. ceil(n / rows_per_cluster) clusters, Lloyd's
  // iterations from centroids at evenly spaced rows (deterministic), `iterations` of them.
  ClusteredKeyIndex(const at::Tensor& keys, const at::Tensor& positions, int64_t rows_per_cluster,
                    int64_t iterations);
  // A key that arrives after the index is built joins its nearest centroid (centroids stay).
  void add(const at::Tensor& key, int64_t position);
  // queries: [g, d] (a KV head's query heads); a cluster's score is the mean over them of q . c.
  // Returns the positions scanned: whole clusters by decreasing score until at least
  // ceil(share * size()) rows (one cluster at least).
  std::vector<int64_t> scan(const at::Tensor& queries, double share) const;
  int64_t size() const { return static_cast<int64_t>(cluster_of_.size()); }
  int64_t clusters() const { return centroids_.size(0); }

 private:
  at::Tensor centroids_;                       // [c, d]
  std::map<int64_t, int64_t> cluster_of_;      // position -> cluster
  std::vector<std::vector<int64_t>> members_;  // per cluster, positions
};

// x quantized and dequantized with the tree's group quantizer (kernels/quantize.h): x [n, d] fp32,
// groups of `group` along `axis` (kColumn: per-channel groups of `group` tokens, KIVI's keys; kRow:
// per-token groups of `group` channels, values).
at::Tensor quantize_dequantize(const at::Tensor& x, int32_t bits, int64_t group,
                               kernels::QuantAxis axis);

// Attention output of the queries [g, d] over keys [n, d] / values [n, d] at scale `scale`: [g, d].
at::Tensor attention_output(const at::Tensor& queries, const at::Tensor& keys,
                            const at::Tensor& values, double scale);
// ||a - b|| / ||b|| (Frobenius); 0 when both are 0.
double relative_error(const at::Tensor& a, const at::Tensor& b);

}  // namespace kvb::attention_measures
