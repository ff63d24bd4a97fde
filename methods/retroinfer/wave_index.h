#pragma once
// RetroInfer's wave index for one KV head: the keys of a span of tokens clustered by segmented
// k-means; per cluster the centroid (mean key), the value sum and the member tokens. Decode scores
// the centroids with the query and reads the best clusters exactly, the next ones through their
// centroid (tripartite attention, retroinfer.cpp).
//
// Clustering (from the official code, or inferred where it is silent): the span's mean key is subtracted, the
// span is cut into segments of at most `segment` tokens, and each segment gets ceil(n_seg /
// cluster_size) clusters by spherical k-means on the centered keys (assignment by cosine, `iters`
// Lloyd rounds, deterministic init on evenly spaced tokens). Centroids are stored as the members'
// mean raw key (the mean added back), so q . c_j is the members' mean logit.

#include <cstdint>
#include <vector>

namespace kvb::retroinfer {

struct Cluster {
  std::vector<float> centroid;   // [head_dim] mean of the members' keys
  std::vector<float> value_sum;  // [head_dim] sum of the members' values
  std::vector<int32_t> members;  // token positions, ascending
};

struct ClusterOptions {
  int64_t cluster_size = 16;  // average tokens per cluster
  int64_t segment = 8192;     // tokens per k-means segment
  int iters = 10;
};

// Clusters tokens [begin, end) of one head. k, v: row j at k + j * stride (head_dim floats).
std::vector<Cluster> build_clusters(const float* k, const float* v, int64_t stride,
                                    int64_t head_dim, int64_t begin, int64_t end,
                                    const ClusterOptions& o);

}  // namespace kvb::retroinfer
