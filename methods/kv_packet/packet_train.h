#pragma once
// `kvbench packet-train`: trains KV Packet's header and trailer (packet_adapter.h) on a frozen model
// by self-supervised distillation (the authors' recipe at our scale):
//   data     RULER-style synthetic samples (passkey, needles...) at `length` tokens from a training
//            seed; the context cut into documents of about `doc_tokens` (harness/eval/documents.h),
//            exactly as the qa protocol cuts it (several sizes: sample i gets the i-th, cyclically);
//   teacher  the frozen model with ordinary causal attention over [BOS, context, question] answers
//            greedily (up to the task's answer length, its stop token included); its log-probs at
//            every answer position are kept;
//   student  the same model over [BOS] + [H, doc_i, T] for every document + [question, answer[:-1]]
//            with a block-diagonal mask: a wrapped document attends only to itself (as when it is
//            prefilled alone), the BOS only to itself, question and answer rows to everything;
//            positions run continuously (RoPE is relative: this equals prefilling each packet from
//            position 0 and re-rotating it);
//   loss     KL(teacher || student) summed over the answer positions / answer tokens;
//   update   Adam (no weight decay) on H and T only, the learning rate decaying linearly to 0.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/formats/model_config.h"

namespace kvb {
class Model;
struct TrainWeights;
}

namespace kvb::kv_packet {

struct TrainOptions {
  std::vector<std::string> tasks = {"passkey", "niah_single_1", "niah_single_2"};
  int64_t length = 1024;     // prompt tokens of the training samples (BOS included)
  // Document sizes the adapter is trained for: training sample i is cut at doc_tokens[i % n], so one
  // adapter sees packets of several lengths.
  std::vector<int64_t> doc_tokens = {64, 128, 256};
  int64_t samples = 64;      // training samples per task
  int64_t steps = 200, batch = 4;
  int64_t header_rows = 8, trailer_rows = 8;
  double lr = 1e-3, init_std = 0.02;
  uint64_t seed = 1000;  // data and initialisation seed (keep it apart from evaluation seeds)
  std::string data_dir;
  std::string cache_dir;  // generated task sets (cache_dir/tasks); "" disables caching
  std::string out;        // adapter path (.safetensors)
  int64_t log_every = 10;
  std::function<void(const std::string&)> log;  // progress lines (null: quiet)
};

struct TrainResult {
  int64_t steps = 0, samples = 0;
  double kl_first = 0, kl_last = 0;  // mean KL per answer token over the first / last log interval
  double teacher_answers_correct = 0;  // fraction of training samples the teacher answered right
};

TrainResult train_adapter(const std::shared_ptr<Model>& model, const TrainOptions& o);

// How well a wrapping reproduces the full-context teacher on the samples `o` describes (its tasks,
// length, document sizes, samples and seed; steps and batch unused): the mean KL(teacher ||
// student) per answer token, and the fraction of samples whose every answer position keeps the
// teacher's argmax. header / trailer: [rows, dim] fp32, rows may be 0 (plain concatenation); a BOS
// header is the BOS token's embedding row.
struct EvalResult {
  int64_t samples = 0;
  double kl = 0, argmax_agreement = 0, teacher_answers_correct = 0;
};
EvalResult evaluate_wrap(const std::shared_ptr<Model>& model, const TrainOptions& o,
                         const at::Tensor& header, const at::Tensor& trailer);

// The student's forward for one sample: input rows [BOS] + [header, doc_i, trailer] per document +
// query, the block-diagonal mask above, positions 0.. in order. Returns the query rows' logits
// [query.size(), vocab] fp32. header / trailer: [rows, dim] fp32 (rows may be 0; they may require
// grad); rope tables cover the whole row count. The qa protocol's document route computes the same
// thing with separate prefills and a splice (tested).
at::Tensor student_query_logits(const TrainWeights& w, const ModelConfig& c, const at::Tensor& header,
                                const at::Tensor& trailer,
                                const std::vector<std::vector<int64_t>>& docs,
                                const std::vector<int64_t>& query, const at::Tensor& rope_cos,
                                const at::Tensor& rope_sin);

}  // namespace kvb::kv_packet
