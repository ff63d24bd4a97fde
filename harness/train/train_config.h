#pragma once
// The recipe of a `kvbench train` run, read from configs/models/<name>.json: architecture, tokenizer,
// data mix, optimiser, stages (sequence length x batch size), device and checkpointing. Torch-free.
// Every key is checked: an unknown key is an error with a nearest-name hint, never silently ignored.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/formats/model_config.h"

namespace kvb {

struct TrainTaskMix {
  std::string task;                                  // a synthetic task name (synthetic_tasks.h)
  double weight = 1.0;                               // relative draw probability
  nlohmann::json params = nlohmann::json::object();  // task parameters (TaskSpec::params)
};

struct TrainStage {
  int64_t steps = 0;
  int64_t seq_len = 0;     // tokens per row (inputs; targets are shifted by one)
  int64_t batch_size = 0;  // rows per step
  // A curriculum: this stage's own data mix, else data.synthetic_fraction / data.tasks.
  double synthetic_fraction = -1;  // < 0: data.synthetic_fraction
  std::vector<TrainTaskMix> tasks;  // empty: data.tasks
};

struct TrainConfig {
  std::string name;         // the model's name (and the exported directory's)
  std::string description;
  uint64_t seed = 1234;

  // Architecture (ModelConfig fields; vocab_size comes from the tokenizer).
  ModelConfig model;

  // Tokenizer: an existing SentencePiece model, or one trained with spm_train on the training text.
  std::string tokenizer_path;      // "" -> train one (out/tokenizer.model)
  int64_t vocab_size = 2048;
  std::vector<std::string> spm_extra_args;

  // Data: corpora (names or .txt paths) tokenized whole, the tail of each held out; synthetic
  // retrieval tasks generated per row from the step's seed.
  std::vector<std::string> corpora;
  double heldout_fraction = 0.02;
  double synthetic_fraction = 0.5;  // probability that a row starts with a synthetic task
  int64_t min_task_tokens = 128;    // task prompt lengths are drawn from [min_task_tokens, seq_len]
  // Loss weight of the answer tokens of retrieval rows (passkey, niah_*: the tokens after the
  // answer prefix), against 1 for every other token; 1 = the plain LM loss. The answer is a few
  // tokens of a row of hundreds, so its gradient is tiny unless weighted.
  double answer_loss_weight = 1.0;
  std::vector<TrainTaskMix> tasks;

  // AdamW with linear warm-up and cosine decay to min_lr_ratio * lr over all stages' steps.
  double lr = 3e-3, min_lr_ratio = 0.1, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  int64_t warmup_steps = 100;
  double grad_clip = 1.0;  // max global L2 norm; <= 0 disables
  double init_std = 0.02;

  std::vector<TrainStage> stages;

  // Start from another run's checkpoint (its weights; the optimiser starts fresh): a path to a
  // kvbench training checkpoint, relative to the working directory. "" = seeded initialisation.
  std::string init_from;

  std::string device = "cpu";
  std::string dtype = "fp32";  // compute dtype: fp32, or bf16 (CUDA; fp32 master weights)
  int64_t checkpoint_every = 100;
  int64_t log_every = 10;
  int64_t eval_every = 100;  // held-out loss every N steps (and at the end)
  int64_t eval_windows = 8;  // held-out windows of the last stage's seq_len

  int64_t total_steps() const;
  // The stage that step s (0-based) belongs to.
  const TrainStage& stage_at(int64_t step) const;
  int64_t max_seq_len() const;
  // The data mix of a stage (its own, else the recipe's).
  double synthetic_fraction_of(const TrainStage& s) const {
    return s.synthetic_fraction >= 0 ? s.synthetic_fraction : synthetic_fraction;
  }
  const std::vector<TrainTaskMix>& tasks_of(const TrainStage& s) const {
    return s.tasks.empty() ? tasks : s.tasks;
  }
};

// Parses and validates; throws kvb::Error naming `source` and the key.
TrainConfig parse_train_config(const nlohmann::json& j, const std::string& source);
TrainConfig load_train_config(const std::string& path);
// Applies one "--set key.path=value" override to the JSON before parsing (value parsed as JSON,
// else taken as a string). Throws naming the override when the path does not exist.
void apply_train_override(nlohmann::json& j, const std::string& assignment);

}  // namespace kvb
