#pragma once
// KVzap's surrogate, exposed for the tests: the KVzip+ targets it is trained on, its ridge fit, and
// the attention input it reads (kvzap_surrogate.cpp). The store and its registration are kvzap.cpp
// (method `kvzap`).

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "methods/common/calibration_text.h"

namespace kvb {
class Model;
}

namespace kvb::kvzap {

// The layer's attention input, RMSNorm(x) * w (w the layer's attention-norm weight), from the
// residual stream x entering it: [T, dim] -> [T, dim] fp32 CPU.
at::Tensor attention_input(const Model& model, int64_t layer, const at::Tensor& x);

// One calibration window's training pairs. The model reads the window, is asked to repeat it
// (KVzip's prompt "\n\nRepeat the previous context exactly.", the turn closed with "\n", then the
// window's text again, teacher-forced, all in one causal prefill over the full cache), and each
// text token t of KV head h gets
//     y[t, h] = log max over the repeat's rows r and the group's query heads j of
//               softmax_r(t) / ||a_r|| * ||v_t W_O^(j)||
// (KVzip+'s score; a_r the row's attention input, softmax over every key the row sees). x[t] is
// token t's attention input. window: BOS first, then the text. Per layer: x [m, dim], y [m, Hkv],
// m = window size - 1.
struct Targets {
  std::vector<at::Tensor> x, y;
};
Targets kvzip_plus_targets(const std::shared_ptr<Model>& model, const std::vector<int64_t>& window);

// The longest calibration window (BOS included) whose repeat sequence fits the model's context:
// (max_seq_len + 1 - the repeat prompt) / 2; unbounded (INT64_MAX) for a model without a limit.
int64_t max_window_tokens(const Model& model);

// Per layer a linear map from the attention input to the KV heads' targets, fitted by ridge
// regression with an unpenalized intercept (sklearn's Ridge, which kvpress's linear KVzap uses):
// weight [L, dim, Hkv], bias [L, Hkv], fp32. Accumulates X^T X in fp64 over the windows, so the
// calibration set is never held whole.
struct Surrogate {
  at::Tensor weight, bias;
};
Surrogate fit_surrogate(const std::shared_ptr<Model>& model, const CalibrationText& text,
                        double alpha);

// The surrogate's scores of attention inputs a [T, dim]: [T, Hkv].
at::Tensor surrogate_scores(const Surrogate& s, int64_t layer, const at::Tensor& a);

}  // namespace kvb::kvzap
