#include "harness/train/train_data.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "datasets/corpus.h"
#include "datasets/synthetic_tasks.h"
#include "datasets/word_lists.h"
#include "harness/common/error.h"
#include "harness/common/strings.h"
#include "harness/formats/tokenizer.h"
#include "harness/metrics/portable_random.h"

namespace kvb {

namespace {

// Splits a corpus text into (train, held-out) at the first newline after (1 - fraction) of its bytes,
// so the tokenizer trainer and the model see the same split.
std::pair<std::string, std::string> split_text(const std::string& text, double heldout_fraction) {
  size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - heldout_fraction));
  cut = std::min(text.size(), cut);
  const size_t nl = text.find('\n', cut);
  if (nl != std::string::npos) cut = nl + 1;
  return {text.substr(0, cut), text.substr(cut)};
}

// A 64-bit mix of the run seed and the row's coordinates (splitmix64 finaliser), so rows are
// independent streams.
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a + 0x9e3779b97f4a7c15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool is_needle_task(const std::string& t) { return starts_with(t, "niah") || t == "passkey"; }

}  // namespace

std::string TrainData::training_text(const TrainConfig& cfg, const std::string& data_dir) {
  std::string out;
  for (const auto& name : cfg.corpora) {
    auto c = load_corpus(name, data_dir);
    out += split_text(c->text, cfg.heldout_fraction).first;
    out += "\n";
  }
  return out;
}

TrainData::TrainData(const TrainConfig& cfg, std::shared_ptr<const Tokenizer> tokenizer,
                     const std::string& data_dir)
    : cfg_(cfg), tok_(std::move(tokenizer)), data_dir_(data_dir) {
  for (const auto& name : cfg_.corpora) {
    auto c = load_corpus(name, data_dir_);
    auto [train, held] = split_text(c->text, cfg_.heldout_fraction);
    train_.push_back(encode_long_text(*tok_, train));
    heldout_.push_back(encode_long_text(*tok_, held));
    KVB_CHECK(static_cast<int64_t>(train_.back().size()) > cfg_.max_seq_len(), "corpus '", name,
              "': ", train_.back().size(), " training tokens, fewer than one row of ",
              cfg_.max_seq_len());
  }
  // One draw table per stage (a stage may carry its own mix); every task validated now, not at
  // step 3,000.
  for (const auto& st : cfg_.stages) {
    const auto& tasks = cfg_.tasks_of(st);
    double total = 0;
    for (const auto& t : tasks) total += t.weight;
    std::vector<double> cdf;
    double acc = 0;
    for (const auto& t : tasks) {
      acc += t.weight / total;
      cdf.push_back(acc);
      try {
        (void)task_tokens(t, std::max<int64_t>(cfg_.min_task_tokens, 256), cfg_.seed);
      } catch (const Error& e) {
        KVB_FAIL("data.tasks '", t.task, "': ", e.what());
      }
    }
    stage_cdf_.push_back(std::move(cdf));
  }
}

int64_t TrainData::train_tokens() const {
  int64_t n = 0;
  for (const auto& v : train_) n += static_cast<int64_t>(v.size());
  return n;
}

int64_t TrainData::heldout_tokens() const {
  int64_t n = 0;
  for (const auto& v : heldout_) n += static_cast<int64_t>(v.size());
  return n;
}

void TrainData::fill_text(std::vector<int64_t>& out, size_t len, uint64_t seed) const {
  std::mt19937_64 rng(seed);
  while (out.size() < len) {
    // Corpora are drawn in proportion to their size: every training token is equally likely.
    uint64_t pick = uniform_index(rng, static_cast<uint64_t>(train_tokens()));
    size_t ci = 0;
    while (pick >= train_[ci].size()) pick -= train_[ci++].size();
    const auto& src = train_[ci];
    const size_t need = len - out.size() - 1;
    const size_t start = std::min<size_t>(pick, src.size() > need ? src.size() - need : 0);
    out.push_back(tok_->bos_id());
    const size_t n = std::min(need, src.size() - start);
    out.insert(out.end(), src.begin() + static_cast<std::ptrdiff_t>(start),
               src.begin() + static_cast<std::ptrdiff_t>(start + n));
  }
  out.resize(len);
}

std::vector<int64_t> TrainData::bos_text_eos(const std::string& text) const {
  std::vector<int64_t> ids = {tok_->bos_id()};
  auto e = tok_->encode(text);
  ids.insert(ids.end(), e.begin(), e.end());
  ids.push_back(tok_->eos_id());
  return ids;
}

std::string TrainData::random_text(std::mt19937_64& rng, int64_t n) const {
  if (n <= 0) return "";
  // A random span of n training tokens (every token equally likely to start it), decoded.
  uint64_t pick = uniform_index(rng, static_cast<uint64_t>(train_tokens()));
  size_t ci = 0;
  while (pick >= train_[ci].size()) pick -= train_[ci++].size();
  const auto& src = train_[ci];
  const size_t start = std::min<size_t>(pick, src.size() - static_cast<size_t>(n));
  return tok_->decode(std::vector<int64_t>(src.begin() + static_cast<std::ptrdiff_t>(start),
                                           src.begin() + static_cast<std::ptrdiff_t>(start + n)));
}

std::vector<int64_t> TrainData::drill_tokens(const TrainTaskMix& t, int64_t target,
                                             uint64_t seed) const {
  std::mt19937_64 rng(seed);
  const int64_t pairs = t.params.value("pairs", int64_t{6});
  const int64_t digits = t.params.value("digits", int64_t{7});
  KVB_CHECK(pairs >= 1 && digits >= 1 && digits <= 12, "recall_drill: pairs >= 1, 1 <= digits <= 12");
  const auto& adj = key_adjectives();
  const auto& noun = key_nouns();
  std::vector<std::string> keys, vals;
  while (static_cast<int64_t>(keys.size()) < pairs) {
    std::string k = adj[uniform_index(rng, adj.size())] + "-" + noun[uniform_index(rng, noun.size())];
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
    std::string v(1, static_cast<char>('1' + uniform_index(rng, 9)));
    while (static_cast<int64_t>(v.size()) < digits) v.push_back(static_cast<char>('0' + uniform_index(rng, 10)));
    keys.push_back(k);
    vals.push_back(v);
  }
  // About 20 tokens per needle and 40 per question-answer; the rest is book text in pairs + 1 gaps.
  const int64_t gap = std::max<int64_t>(0, (target - pairs * 60) / (pairs + 1));
  auto filler = [&](int64_t n) { return random_text(rng, n); };
  std::string text;
  for (int64_t i = 0; i < pairs; ++i)
    text += filler(gap) + " One of the special magic numbers for " + keys[i] + " is: " + vals[i] + ". ";
  text += filler(gap) + "\n";
  std::vector<int64_t> order(static_cast<size_t>(pairs));
  for (int64_t i = 0; i < pairs; ++i) order[i] = i;
  for (int64_t i = pairs - 1; i > 0; --i) std::swap(order[i], order[uniform_index(rng, static_cast<uint64_t>(i + 1))]);
  for (int64_t i : order)
    text += "What is the special magic number for " + keys[i] +
            " mentioned in the provided text? The special magic number for " + keys[i] +
            " mentioned in the provided text is " + vals[i] + ".\n";
  return bos_text_eos(text);
}

std::vector<int64_t> TrainData::copy_drill_tokens(const TrainTaskMix& t, int64_t target,
                                                  uint64_t seed) const {
  std::mt19937_64 rng(seed);
  // A list of random records ("<adjective>-<noun> 4821;"), book text, then the same list again:
  // every token of the repeat after its first is predictable only by finding the earlier copy
  // (an induction head), a dense version of what retrieval needs.
  const int64_t items = t.params.value("items", int64_t{12});
  const auto& adj = key_adjectives();
  const auto& noun = key_nouns();
  std::string list;
  for (int64_t i = 0; i < items; ++i) {
    list += adj[uniform_index(rng, adj.size())] + "-" + noun[uniform_index(rng, noun.size())] + " ";
    for (int d = 0; d < 4; ++d) list.push_back(static_cast<char>('0' + uniform_index(rng, 10)));
    list += "; ";
  }
  const int64_t list_tokens = static_cast<int64_t>(tok_->encode(list).size());
  const int64_t gap = std::max<int64_t>(0, target - 2 * list_tokens - 4);
  const int64_t n = gap > 0 ? static_cast<int64_t>(uniform_index(rng, static_cast<uint64_t>(gap + 1))) : 0;
  const std::string filler = random_text(rng, n);
  return bos_text_eos(list + "\n" + filler + "\nAgain: " + list);
}

std::vector<int64_t> TrainData::repeat_drill_tokens(const TrainTaskMix& t, int64_t target,
                                                    uint64_t seed) const {
  std::mt19937_64 rng(seed);
  // `n` distinct token ids drawn uniformly from the vocabulary (never BOS, EOS or UNK), then the
  // same ids `repeats` - 1 more times. Each id is unique within one copy, so "find this token's
  // previous occurrence, predict its successor" is exact: the canonical data on which induction
  // heads form. Uniform ids matter: ids drawn from the text's own distribution (cheap to predict
  // from unigram statistics, which hides the copy signal) left the repeat as costly as the first
  // copy after 600 steps on this trainer. n varies per row on purpose: with one fixed length a
  // single RoPE offset head copies without matching anything (configs/models/README.md). Digits
  // and records need the harder multi-token match (a digit recurs within one number), which the
  // other drills train.
  const int64_t repeats = t.params.value("repeats", int64_t{2});
  KVB_CHECK(repeats >= 2 && repeats <= 8, "repeat_drill: 2 <= repeats <= 8");
  const int64_t most = std::max<int64_t>(4, (target - 1) / repeats);
  const int64_t least = std::max<int64_t>(4, most / 4);
  const int64_t n = least + static_cast<int64_t>(uniform_index(rng, static_cast<uint64_t>(most - least + 1)));
  const int64_t V = tok_->vocab_size();
  KVB_CHECK(V > n + 3, "repeat_drill: the vocabulary (", V, ") is too small for ", n, " distinct ids");
  std::vector<int64_t> seq;
  std::vector<bool> used(static_cast<size_t>(V), false);
  used[static_cast<size_t>(tok_->bos_id())] = used[static_cast<size_t>(tok_->eos_id())] = true;
  if (tok_->unk_id() >= 0) used[static_cast<size_t>(tok_->unk_id())] = true;
  while (static_cast<int64_t>(seq.size()) < n) {
    const int64_t id = static_cast<int64_t>(uniform_index(rng, static_cast<uint64_t>(V)));
    if (used[static_cast<size_t>(id)]) continue;
    used[static_cast<size_t>(id)] = true;
    seq.push_back(id);
  }
  std::vector<int64_t> ids = {tok_->bos_id()};
  for (int64_t r = 0; r < repeats; ++r) ids.insert(ids.end(), seq.begin(), seq.end());
  // "fill": further copies up to the target length, so a row holds no text to learn first (text
  // is easier to fit and delays the induction heads: measured, see configs/models/README.md).
  if (t.params.value("fill", false)) {
    while (static_cast<int64_t>(ids.size()) < target + 1) ids.insert(ids.end(), seq.begin(), seq.end());
    ids.resize(static_cast<size_t>(target + 1));
  }
  return ids;
}

std::vector<int64_t> TrainData::task_tokens(const TrainTaskMix& t, int64_t target,
                                            uint64_t seed, int64_t* answer_begin) const {
  if (answer_begin) *answer_begin = -1;
  // The training-only drills take only their own parameters (the RULER tasks check theirs).
  static const std::map<std::string, std::set<std::string>> kDrillParams = {
      {"recall_drill", {"pairs", "digits"}}, {"copy_drill", {"items"}}, {"repeat_drill", {"repeats", "fill"}}};
  if (auto d = kDrillParams.find(t.task); d != kDrillParams.end()) {
    for (const auto& kv : t.params.items())
      KVB_CHECK(d->second.count(kv.key()), t.task, ": unknown parameter '", kv.key(), "'");
  }
  if (t.task == "recall_drill") return drill_tokens(t, target, seed);
  if (t.task == "copy_drill") return copy_drill_tokens(t, target, seed);
  if (t.task == "repeat_drill") return repeat_drill_tokens(t, target, seed);
  std::mt19937_64 rng(seed);
  TaskSpec spec;
  spec.task = t.task;
  spec.num_samples = 1;
  spec.seed = rng();
  spec.params = t.params;
  spec.data_dir = data_dir_;
  if (is_needle_task(t.task)) spec.depths = {uniform_unit(rng)};
  // Short targets can miss the generator's +-1% length bound (a haystack grows in whole sentences)
  // or a task's minimum length; a longer one then fits: +25% per attempt for 5 attempts, then
  // 3% steps from the original target (coarse tokenizers need the fine steps).
  for (int attempt = 0;; ++attempt) {
    spec.target_tokens = target;
    if (attempt <= 5) {
      for (int a = 0; a < attempt; ++a) spec.target_tokens += spec.target_tokens / 4;
    } else {
      spec.target_tokens = target + target * 3 * (attempt - 5) / 100 + (attempt - 5);
    }
    try {
      SampleSet set = generate_task(*tok_, spec);
      const TaskSample& s = set.samples.at(0);
      std::vector<int64_t> ids = bos_text_eos(s.prompt() + " " + join(s.answers, ", ") + ".");
      if (answer_begin) {
        // The answer starts where the prompt's own tokens stop matching (BOS first).
        const auto prompt = tok_->encode(s.prompt());
        size_t n = 0;
        while (n < prompt.size() && 1 + n < ids.size() && ids[1 + n] == prompt[n]) ++n;
        *answer_begin = static_cast<int64_t>(1 + n);
      }
      return ids;
    } catch (const Error&) {
      if (attempt >= 40) throw;
    }
  }
}

TrainRow TrainData::row(int64_t step, int64_t row, int64_t seq_len) const {
  const uint64_t seed = mix(mix(cfg_.seed, static_cast<uint64_t>(step)), static_cast<uint64_t>(row));
  std::mt19937_64 rng(seed);
  TrainRow r;
  const size_t len = static_cast<size_t>(seq_len + 1);
  size_t si = 0;  // the step's stage
  for (int64_t first = 0; si + 1 < cfg_.stages.size() && step >= first + cfg_.stages[si].steps; ++si)
    first += cfg_.stages[si].steps;
  const TrainStage& stage = cfg_.stages[si];
  const auto& tasks = cfg_.tasks_of(stage);
  const auto& cdf = stage_cdf_[si];
  if (!tasks.empty() && uniform_unit(rng) < cfg_.synthetic_fraction_of(stage)) {
    const double u = uniform_unit(rng);
    size_t ti = 0;
    while (ti + 1 < cdf.size() && u >= cdf[ti]) ++ti;
    const TrainTaskMix& t = tasks[ti];
    const int64_t lo = std::min(cfg_.min_task_tokens, seq_len);
    const int64_t target = lo + static_cast<int64_t>(uniform_index(rng, static_cast<uint64_t>(seq_len - lo + 1)));
    int64_t answer = -1;
    r.tokens = task_tokens(t, target, rng(), &answer);
    r.task = t.task;
    if (answer >= 0 && answer < static_cast<int64_t>(std::min(len, r.tokens.size()))) {
      r.answer_begin = answer;
      r.answer_end = static_cast<int64_t>(std::min(len, r.tokens.size()));
    }
    if (r.tokens.size() > len) r.tokens.resize(len);
  }
  fill_text(r.tokens, len, rng());
  return r;
}

std::vector<std::vector<int64_t>> TrainData::heldout_windows(int64_t n, int64_t seq_len) const {
  std::vector<std::vector<int64_t>> out;
  const size_t w = static_cast<size_t>(seq_len);  // BOS + seq_len text tokens = seq_len + 1
  // Round-robin over corpora, consecutive non-overlapping windows from each held-out part.
  std::vector<size_t> pos(heldout_.size(), 0);
  bool any = true;
  while (static_cast<int64_t>(out.size()) < n && any) {
    any = false;
    for (size_t c = 0; c < heldout_.size() && static_cast<int64_t>(out.size()) < n; ++c) {
      if (pos[c] + w > heldout_[c].size()) continue;
      std::vector<int64_t> win = {tok_->bos_id()};
      win.insert(win.end(), heldout_[c].begin() + static_cast<std::ptrdiff_t>(pos[c]),
                 heldout_[c].begin() + static_cast<std::ptrdiff_t>(pos[c] + w));
      out.push_back(std::move(win));
      pos[c] += w;
      any = true;
    }
  }
  KVB_CHECK(!out.empty(), "held-out data: no window of ", seq_len,
            " tokens fits; raise data.heldout_fraction");
  return out;
}

}  // namespace kvb
