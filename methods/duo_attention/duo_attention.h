#pragma once
// DuoAttention's two parts, exposed for the tests: the calibration that scores every KV head
// (duo_head_scores.cpp) and the split of heads into retrieval and streaming ones. The store and its
// registration are duo_attention.cpp (method `duo_attention`).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "methods/common/calibration_text.h"

namespace kvb {
class Model;
}

namespace kvb::duo {

// kvpress's on-the-fly DuoAttention scoring (duo_attention_on_the_fly), on the calibration text:
// per sample and layer, the mean pre-RoPE query of each query head and mean pre-RoPE key of each
// KV head over the sample's tokens are repeated q_len times and rotated to positions 0 .. q_len - 1;
// the last query's softmax over those keys (scale 1 / sqrt(head_dim)) is cumulated along the
// positions and averaged (the area under the cumulated attention curve), then averaged over the
// group's query heads and over the samples. Low: the head attends locally (a streaming head).
// Returns [n_layers, n_kv_heads] fp32. Refuses a model with sliding-window layers.
at::Tensor head_scores(const std::shared_ptr<Model>& model, const CalibrationText& text,
                       int64_t q_len);

// [n_layers][n_kv_heads], 1 for a streaming head: the round(ratio x heads) lowest scores, ties
// broken by (layer, head) order (kvpress: argsort of the flattened scores).
std::vector<std::vector<uint8_t>> streaming_heads(const at::Tensor& scores, double ratio);

}  // namespace kvb::duo
