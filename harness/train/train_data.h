#pragma once
// The training stream of `kvbench train`: rows of BOS-led token sequences mixing real text (the
// corpora, tokenized once, the tail of each held out) with synthetic retrieval tasks (passkey, needle,
// variable tracking, ...) generated for the row with their answers appended. Torch-free.
//
// Every row is a pure function of (seed, step, row index, seq_len): there is no data-loader state to
// checkpoint, so a resumed run sees exactly the batches an uninterrupted run would have seen.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "harness/train/train_config.h"

namespace kvb {

class Tokenizer;

struct TrainRow {
  std::vector<int64_t> tokens;  // seq_len + 1 ids: inputs are [0, seq_len), targets [1, seq_len]
  std::string task;             // the synthetic task at the row's start ("" for text only)
  // A retrieval row's answer (the tokens after the answer prefix: the answer, "." and EOS), as
  // indices into `tokens`, [answer_begin, answer_end); -1 when the row has none (text, drills).
  int64_t answer_begin = -1, answer_end = -1;
};

class TrainData {
 public:
  // Loads and tokenizes the corpora (cfg.corpora, resolved in data_dir); checks the task mix by
  // generating one small sample of each task. Throws kvb::Error naming the corpus or task.
  TrainData(const TrainConfig& cfg, std::shared_ptr<const Tokenizer> tokenizer,
            const std::string& data_dir);

  // Row `row` of step `step` at `seq_len`, drawn from the data mix of the step's stage.
  TrainRow row(int64_t step, int64_t row, int64_t seq_len) const;
  // The held-out windows (BOS + text) of seq_len + 1 tokens, at most n, spread over the held-out
  // parts of all corpora.
  std::vector<std::vector<int64_t>> heldout_windows(int64_t n, int64_t seq_len) const;

  int64_t train_tokens() const;
  int64_t heldout_tokens() const;
  // The training split's text (for the tokenizer trainer): every corpus without its held-out tail.
  static std::string training_text(const TrainConfig& cfg, const std::string& data_dir);

 private:
  // BOS + the text's tokens + EOS: one synthetic sample as a row prefix.
  std::vector<int64_t> bos_text_eos(const std::string& text) const;
  // A random span of `n` training tokens, decoded ("" for n <= 0): drill filler.
  std::string random_text(std::mt19937_64& rng, int64_t n) const;
  // Appends BOS + a random span of training text to `out` until it holds `len` tokens.
  void fill_text(std::vector<int64_t>& out, size_t len, uint64_t seed) const;
  // BOS + prompt + " answer." + EOS of a task sample with the given target length.
  // answer_begin (optional): where a RULER task's answer starts in the returned ids (else -1).
  std::vector<int64_t> task_tokens(const TrainTaskMix& t, int64_t target, uint64_t seed,
                                   int64_t* answer_begin = nullptr) const;
  // The "recall_drill" training task: `pairs` needles ("One of the special magic numbers for
  // <key> is: <value>.") spread through book text, then every key asked in a shuffled order with
  // its answer (RULER's niah question and answer prefix), so one row carries `pairs` retrieval
  // targets instead of one. Not an evaluation task.
  std::vector<int64_t> drill_tokens(const TrainTaskMix& t, int64_t target, uint64_t seed) const;
  // The "copy_drill" training task: `items` random records, book text of random length, the same
  // records again (dense copy targets that teach induction).
  std::vector<int64_t> copy_drill_tokens(const TrainTaskMix& t, int64_t target, uint64_t seed) const;
  // The "repeat_drill" training task: distinct random tokens repeated (`repeats` copies, default 2),
  // where single-token induction is exact: it starts the induction heads the other drills refine.
  std::vector<int64_t> repeat_drill_tokens(const TrainTaskMix& t, int64_t target, uint64_t seed) const;

  TrainConfig cfg_;
  std::shared_ptr<const Tokenizer> tok_;
  std::string data_dir_;
  std::vector<std::vector<int64_t>> train_, heldout_;  // per corpus
  std::vector<std::vector<double>> stage_cdf_;  // per stage: cumulative task weights
};

}  // namespace kvb
