#pragma once
// `kvbench train`: LibTorch autograd training of a Llama-architecture model whose weights the engine
// loads directly (exported as a Hugging Face directory). AdamW with decoupled weight decay, linear
// warm-up + cosine decay, global-norm gradient clipping, checkpoints with optimiser state, exact
// resume, held-out loss, a JSONL training log. Deterministic under the config's seed (same machine,
// same thread count): data rows are a pure function of (seed, step, row), initial weights come from
// a seeded CPU generator.
//
// Parameters are kept in the engine's fused layout (wqkv = q|k|v rows, w13 = gate|up rows), RoPE in
// the HF half-split style (a loaded model's own style when adapters are trained on it), so the forward here is the engine's computation written for autograd
// (full causal attention over [B, T] instead of a KV cache); train_test checks that the exported model
// gives the trainer's logits through the HF loader and the engine.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/formats/model_config.h"
#include "harness/train/train_config.h"

namespace kvb {

struct ModelWeights;  // harness/model/model.h

// Named trainable tensors in the engine's layout:
//   embed [V, D], final_norm [D], lm_head [V, D] (untied only),
//   layers.L.{attn_norm [D], wqkv [Q + 2KV, D], wo [D, Q], ffn_norm [D], w13 [2F, D], w2 [D, F]}.
struct TrainWeights {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;  // fp32 leaves on the training device
  const at::Tensor& at(const std::string& name) const;
};

// Seeded initialisation: N(0, std) matrices, the residual outputs (wo, w2) scaled by
// 1 / sqrt(2 n_layers) (GPT-2), norms at 1. The same seed gives the same weights on every device.
TrainWeights init_train_weights(const ModelConfig& c, double std, uint64_t seed,
                                const std::string& device);

// The trainer's weights holding a loaded model's tensors as fp32 leaves on `device` (the engine's
// layout is the trainer's): the same forward for a shipped model as for a checkpoint. Throws on a
// model with parts the trainer lacks (projection biases).
TrainWeights train_weights_from_model(const ModelWeights& m, const ModelConfig& c,
                                      const std::string& device);

// An additive attention-score bias per layer, computed from the layer's input x [B, T, D] (the
// residual stream before its attention norm): [B, n_kv_heads, T, T] fp32, added to the scaled
// scores of every query head of the KV head's group before the causal mask (DMS's soft eviction).
using AttentionBiasFn = std::function<at::Tensor(int64_t layer, const at::Tensor& x)>;

// Logits [B, T, V] (fp32) of tokens [B, T] (int64, positions 0..T-1). compute_dtype: fp32, or bf16
// with fp32 master weights cast per call. bias: optional (see AttentionBiasFn).
at::Tensor train_forward(const TrainWeights& w, const ModelConfig& c, const at::Tensor& tokens,
                         const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                         c10::ScalarType compute_dtype, const AttentionBiasFn& bias = nullptr);

// train_forward over input embeddings [B, T, D] instead of token ids: soft tokens (KV Packet's header
// and trailer) are rows like any other, and gradients reach them.
at::Tensor train_forward_embeds(const TrainWeights& w, const ModelConfig& c, const at::Tensor& embeds,
                                const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                                c10::ScalarType compute_dtype, const AttentionBiasFn& bias = nullptr);

// Writes a Hugging Face directory (config.json, model.safetensors in fp32, tokenizer.model copied
// from tokenizer_path) that load_model() reads. Files appear atomically.
void export_hf_model(const TrainWeights& w, const ModelConfig& c, const std::string& tokenizer_path,
                     const std::string& dir);

struct TrainOptions {
  std::string config_path;
  std::string out_dir;   // checkpoints, log, tokenizer, exported model (out_dir/model)
  std::string data_dir;  // "" -> resolve_data_dir("")
  std::vector<std::string> overrides;  // --set key.path=value
  bool fresh = false;         // ignore existing checkpoints (they are removed)
  int64_t stop_after = 0;     // > 0: stop (checkpointed) after this many steps of this invocation
  double max_seconds = 0;     // > 0: stop (checkpointed) at the first step boundary past this many
                              // seconds of this invocation (a lent machine's time budget)
  bool export_only = false;   // export the latest checkpoint and stop
  bool quiet = false;         // no progress lines
  int64_t show_rows = 0;      // > 0: print this many decoded training rows of show_step and stop
  int64_t show_step = 0;
};

struct TrainSummary {
  int64_t steps_done = 0;   // total steps in the latest checkpoint
  int64_t total_steps = 0;
  double last_loss = 0;     // mean training loss over the last log interval
  double heldout_loss = 0;  // at the last evaluation
  std::string model_dir;    // "" until the run finished and was exported
};

// Runs (or resumes) training. Throws kvb::Error naming the config key, file or step on failure;
// checkpoints already written are kept.
TrainSummary run_training(const TrainOptions& opts);

}  // namespace kvb
