#pragma once
// The `qa` protocol: a context, then one or more questions, answered greedily.
//   query_agnostic — the context alone is prefilled (and compressed at end_prefill); each question is
//                    answered on a copy-on-write fork of that one compressed cache, and the fork is
//                    released afterwards (the answer is truncated off: decode-time state never leaks
//                    from one question to the next).
//   query_aware    — the question is part of the prefix the method compresses; one prefill per question.
// The full cache answers the same samples under the same schedule (computed once, cached on disk by
// content hash, the model's and the tokenizer's included, each entry checksummed), so every answer
// is paired with the uncompressed one. A `full` run's own answers check the cache: an entry that
// differs is named in one warning line on stderr and replaced.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/eval/ledger.h"
#include "harness/formats/chat_template.h"
#include "harness/model/model.h"

namespace kvb {

class Tokenizer;

struct QaItem {
  std::string question;              // text after the context (question + answer prefix)
  std::vector<std::string> answers;  // references
  std::string metric;                // a text metric (harness/metrics/text_metrics.h)
  std::vector<std::string> all_classes;
};

struct QaSample {
  std::string key;      // content hash
  std::string context;  // text before the questions (BOS is prepended)
  std::vector<QaItem> items;
  int64_t max_new_tokens = 32;
  std::vector<std::string> stop;  // stop strings (the prediction is cut before them)
  int64_t max_context_tokens = 0; // > 0: middle-truncate the context tokens (LongBench)
  nlohmann::json meta;            // task, depth, lengths... (stored with the sample)
};

struct QaOptions {
  std::string mode = "query_agnostic";
  // An instruct model's chat template: the context opens the user turn (after the system turn), the
  // question closes it with the assistant's generation prompt, so a query-agnostic method compresses
  // system + context and the question arrives with the turn's closing tokens. Inactive: raw text, the
  // context after BOS when the model's tokenizer adds one.
  ChatTemplate chat;
  int64_t prefill_chunk = 512;
  std::string cache_dir;  // full-cache answers; "" disables caching
  // Where a long prefill's progress lines go (prefill_progress_lines); empty: nowhere.
  std::function<void(const std::string&)> progress;
  // Shared context prefill (harness/eval/shared_prefill.h): the full cache's prefill of a context is
  // recorded once and replayed into every store that reproduces it bitwise; a store that does not
  // prefills itself. The answers are the same either way. record_eagerly: a method whose full-cache
  // answers came from the baseline cache records the prefill for the runs after it (a grid).
  bool share_prefill = false;
  bool record_eagerly = false;
};

struct QaItemResult {
  std::string prediction, full_prediction;
  double score = 0, full_score = 0;
  std::vector<std::string> answers;  // the references (stored so a sample can be read alone)
};

// Where a sample's time to first token went (wall clock on the run's machine). At query time a
// context is either prefilled (context_s: its prefill, compression included) or, with document reuse,
// spliced from caches prefilled earlier (context_s: the splice; document_prefill_s: the offline
// per-document prefills, not part of the time to first token). question_s: the first question's
// prefill. prefill_tokens: tokens run through the model at query time.
struct QaTiming {
  double context_s = -1, question_s = -1;  // -1: not recorded (rows stored before timings existed)
  int64_t prefill_tokens = 0;
  int64_t documents = 0;
  double document_prefill_s = 0;
  // Wall time of the method's whole sample (context, questions, greedy answers), and of computing the
  // full-cache answers it is paired with (0 when they came from the baseline cache or the run is full).
  double answer_s = -1, full_answer_s = -1;
};

struct QaSampleResult {
  std::vector<QaItemResult> items;
  int64_t context_tokens = 0;
  QaTiming timing;
  std::map<std::string, double> counters;  // the method's counters after the last answer
  LedgerEntry ledger;  // the method's cache right after the context (what every question reads)
  // How the context reached the store: "shared" (the process's recording of the full cache's
  // prefill, replayed: context_s is then the recorded model time plus the store's own attend calls
  // and compression), "recorded" (prefilled and recorded) or "own"; prefill_why: why not shared.
  std::string prefill_path, prefill_why;
  // A shared prefill's parts of context_s: the replay (the store's attend calls) and the recorded
  // prefill's model work outside the full cache's attend calls.
  double prefill_replay_s = 0, prefill_shared_model_s = 0;
  nlohmann::json to_json() const;
  static QaSampleResult from_json(const nlohmann::json& j);
};

QaSampleResult run_qa_sample(std::shared_ptr<Model> model, const Tokenizer& tok,
                             const std::string& method, const nlohmann::json& method_params,
                             const QaSample& sample, const QaOptions& opts);

// accuracy, full_accuracy, agreement_with_full (identical predictions), questions, + the ledger; where
// timings were recorded: ttft_ms (context ready + first question prefilled), query_prefill_tokens,
// and with document reuse documents and document_prefill_ms.
std::vector<Metric> qa_metrics(const std::vector<QaSampleResult>& samples, bool declared_simulated);

// Refuses a qa length the model cannot hold (kvb::Error naming config.protocol.length and `model`):
// a synthetic prompt (question included; `length` is its target) or a LongBench context cap longer
// than the context the model declares (0: unknown, not checked). The answer may run past the
// context, as RULER's tokens_to_generate do beyond a prompt of the full length.
void check_qa_length(const nlohmann::json& protocol, int64_t context_tokens,
                     const std::string& model);

// Reads a longbench qa run's JSONL and task files as the run will (every sample it answers must
// have its task's settings, and there must be one); throws kvb::Error naming the file (and line).
void check_longbench_inputs(const nlohmann::json& protocol);

// The samples a qa run answers, from its protocol parameters (synthetic RULER tasks, story recall,
// LongBench JSONL). *dataset_hash identifies the set.
std::vector<QaSample> qa_samples(const Tokenizer& tok, const nlohmann::json& protocol,
                                 const std::string& data_dir, const std::string& cache_dir,
                                 std::string* dataset_hash);

}  // namespace kvb
