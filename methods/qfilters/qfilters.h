#pragma once
// Q-Filters' calibration, exposed for the tests: one filter per layer and KV head from the run's
// own queries (qfilter_calibration.cpp). The store and its registration are qfilters.cpp (method
// `qfilters`).

#include <ATen/core/Tensor.h>

#include <memory>

#include "methods/common/calibration_text.h"

namespace kvb {
class Model;
}

namespace kvb::qfilters {

// [n_layers, n_kv_heads, head_dim] fp32: per KV head, the first right-singular vector of the
// matrix of the calibration text's post-RoPE query states of the head's query group (rows: every
// token x every query head of the group; not centred), computed as the top eigenvector of
// Q^T Q accumulated in fp64, its sign chosen so that the mean projection of those queries on it is
// positive. Unit norm. Refuses a model with sliding-window layers.
at::Tensor calibrate_filters(const std::shared_ptr<Model>& model, const CalibrationText& text);

}  // namespace kvb::qfilters
