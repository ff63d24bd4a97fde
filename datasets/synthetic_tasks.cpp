#include "datasets/synthetic_tasks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "datasets/corpus.h"
#include "datasets/token_counter.h"
#include "datasets/word_lists.h"
#include "harness/common/atomic_file.h"
#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/params.h"
#include "harness/common/sha256.h"
#include "harness/common/strings.h"
#include "harness/formats/tokenizer.h"
#include "harness/metrics/portable_random.h"

namespace kvb {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Texts. RULER's (scripts/data/synthetic/constants.py, niah.py, variable_tracking.py, ...) and the
// Landmark Attention passkey prompt, verbatim.

constexpr const char* kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

constexpr const char* kPasskeyInstruction =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there.";

constexpr const char* kVtInstruction =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";

constexpr const char* kCweInstruction =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n";

constexpr const char* kFweInstruction =
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. ";
constexpr const char* kFweQuestion =
    "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three "
    "most frequently appeared words in the above coded text?";
constexpr const char* kFweAnswerPrefix =
    " Answer: According to the coded text above, the three most frequently appeared words are:";

// The copy task (kvbench's own: a long answer, for decode-time compression). Not RULER's.
constexpr const char* kCopyInstruction = "Here is a list of words:\n";
constexpr const char* kCopyQuestion =
    "Write the same list of words again, exactly as it is, separated by spaces.";
constexpr const char* kCopyAnswerPrefix = "";

// RULER's tokens_to_generate per task family.
constexpr int64_t kNiahMaxNewTokens = 128;
constexpr int64_t kVtMaxNewTokens = 30;
constexpr int64_t kCweMaxNewTokens = 120;
constexpr int64_t kFweMaxNewTokens = 50;
constexpr int64_t kPasskeyMaxNewTokens = 16;  // a 5-digit key and a full stop, with room

constexpr int kMaxAttempts = 32;  // fresh draws when a value happens to occur twice in the context

// ---------------------------------------------------------------------------------------------
// Task table.

enum class Kind { kNiah, kVt, kCwe, kFwe, kPasskey, kCopy };

// niah_*: what fills the context around the needles.
enum class Haystack { kNoise, kCorpus, kNeedles };
const EnumName<Haystack> kHaystacks[] = {
    {Haystack::kNoise, "noise"}, {Haystack::kCorpus, "corpus"}, {Haystack::kNeedles, "needles"}};

// niah_*: what a needle's key or value is. The name is also the prompt's word for it ("special
// magic numbers"), so the generator keeps it as text.
enum class NeedleItem { kWords, kNumbers, kUuids };
const EnumName<NeedleItem> kNeedleItems[] = {{NeedleItem::kWords, "words"},
                                             {NeedleItem::kNumbers, "numbers"},
                                             {NeedleItem::kUuids, "uuids"}};

struct TaskDef {
  const char* name;
  Kind kind;
  const char* defaults;  // JSON: the RULER preset (scripts/synthetic.yaml)
};

const std::vector<TaskDef>& task_defs() {
  static const std::vector<TaskDef> kDefs = {
      {"niah_single_1", Kind::kNiah,
       R"({"haystack":"noise","key_type":"words","value_type":"numbers","num_keys":1,"num_values":1,"num_queries":1})"},
      {"niah_single_2", Kind::kNiah,
       R"({"haystack":"corpus","key_type":"words","value_type":"numbers","num_keys":1,"num_values":1,"num_queries":1})"},
      {"niah_single_3", Kind::kNiah,
       R"({"haystack":"corpus","key_type":"words","value_type":"uuids","num_keys":1,"num_values":1,"num_queries":1})"},
      {"niah_multikey_1", Kind::kNiah,
       R"({"haystack":"corpus","key_type":"words","value_type":"numbers","num_keys":4,"num_values":1,"num_queries":1})"},
      {"niah_multikey_2", Kind::kNiah,
       R"({"haystack":"needles","key_type":"words","value_type":"numbers","num_keys":1,"num_values":1,"num_queries":1})"},
      {"niah_multikey_3", Kind::kNiah,
       R"({"haystack":"needles","key_type":"uuids","value_type":"uuids","num_keys":1,"num_values":1,"num_queries":1})"},
      {"niah_multivalue", Kind::kNiah,
       R"({"haystack":"corpus","key_type":"words","value_type":"numbers","num_keys":1,"num_values":4,"num_queries":1})"},
      {"niah_multiquery", Kind::kNiah,
       R"({"haystack":"corpus","key_type":"words","value_type":"numbers","num_keys":4,"num_values":1,"num_queries":4})"},
      {"vt", Kind::kVt, R"({"num_chains":1,"num_hops":4,"few_shot":"auto"})"},
      // cwe's settings depend on the length (RULER switches at 4096), so they stay unset here.
      {"cwe", Kind::kCwe, R"({})"},
      {"fwe", Kind::kFwe, R"({"alpha":2.0,"vocab_size":0,"coded_wordlen":6})"},
      {"passkey", Kind::kPasskey, R"({"digits":5})"},
      {"copy", Kind::kCopy, R"({})"},
  };
  return kDefs;
}

// A task's parameters, with its preset (TaskDef::defaults) as their defaults.
std::vector<ParamSpec> param_specs(const TaskDef& def) {
  const json d = json::parse(def.defaults);
  // few_shot: true, false, or "auto" (the example is kept when it fits the target).
  const auto few_shot = [](const char* doc) { return bool_param("few_shot", true, doc).or_auto(); };
  switch (def.kind) {
    case Kind::kNiah:
      return {
          string_param("haystack", d.at("haystack").get<std::string>(), enum_choices(kHaystacks),
                       "what fills the context around the needles")
              .with_aliases({{"repeat", "noise"}, {"essay", "corpus"}, {"needle", "needles"}}),
          string_param("key_type", d.at("key_type").get<std::string>(), enum_choices(kNeedleItems),
                       "needle keys"),
          string_param("value_type", d.at("value_type").get<std::string>(),
                       enum_choices(kNeedleItems), "needle values"),
          int_param("num_keys", d.at("num_keys").get<int64_t>(), 1, 100,
                    "needles (raised to num_queries)"),
          int_param("num_values", d.at("num_values").get<int64_t>(), 1, 100, "values per key"),
          int_param("num_queries", d.at("num_queries").get<int64_t>(), 1, 100, "keys asked for"),
      };
    case Kind::kVt: {
      ParamSpec fs = few_shot("an example chain before the task");
      fs.default_value = d.at("few_shot");
      return {int_param("num_chains", d.at("num_chains").get<int64_t>(), 1, 100, "variable chains"),
              int_param("num_hops", d.at("num_hops").get<int64_t>(), 1, 100, "hops per chain"), fs};
    }
    case Kind::kCwe:
      // No defaults: RULER's settings depend on the length (see setup_cwe).
      return {
          int_param("freq_cw", 0, 2, 10000, "occurrences of each common word").unset_by_default(),
          int_param("freq_ucw", 0, 1, 10000, "occurrences of each uncommon word")
              .unset_by_default(),
          int_param("num_cw", 0, 1, 1000, "common words asked for").unset_by_default(),
          few_shot("a worked example before the task").unset_by_default()};
    case Kind::kFwe:
      return {
          float_param("alpha", d.at("alpha").get<double>(), 1.0, 10.0, "Zipf exponent").above_min(),
          int_param("vocab_size", d.at("vocab_size").get<int64_t>(), 0, 1000000,
                    "coded words (0: target_tokens / 50, RULER's)"),
          int_param("coded_wordlen", d.at("coded_wordlen").get<int64_t>(), 2, 20,
                    "letters per coded word")};
    case Kind::kPasskey:
      return {int_param("digits", d.at("digits").get<int64_t>(), 1, 18, "digits of the pass key")};
    case Kind::kCopy:
      return {};
  }
  return {};
}

const TaskDef& find_task(const std::string& name) {
  for (const auto& d : task_defs())
    if (name == d.name) return d;
  KVB_FAIL("unknown synthetic task '", name, "'", did_you_mean(name, synthetic_task_names()),
           "; known tasks: ", join(synthetic_task_names(), ", "));
}

bool uses_corpus(Kind kind, const json& params) {
  if (kind == Kind::kCwe) return true;
  return kind == Kind::kNiah &&
         params.value("haystack", "") == enum_name(kHaystacks, Haystack::kCorpus);
}

// ---------------------------------------------------------------------------------------------
// Portable randomness: only std::mt19937_64's raw output and portable_random.h.

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t sample_seed(uint64_t seed, int64_t sample) {
  return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(sample) + 1));
}

template <typename T>
void shuffle_in_place(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[uniform_index(rng, i)]);
}

// k distinct indices of [0, n), in draw order.
std::vector<size_t> sample_distinct(std::mt19937_64& rng, size_t n, size_t k) {
  std::vector<size_t> out;
  std::set<size_t> seen;
  while (out.size() < k) {
    const size_t i = uniform_index(rng, n);
    if (seen.insert(i).second) out.push_back(i);
  }
  return out;
}

// RULER's needle depths: np.round(np.linspace(0, 100, num=40)) percent. 100 i / 39 is never a
// half-integer for 0 < i < 39, so rounding half up in integers is numpy's answer.
double grid_depth(size_t i) { return static_cast<double>((200 * i + 39) / 78) / 100.0; }
constexpr size_t kGridSize = 40;

std::string random_number(std::mt19937_64& rng, int digits) {
  uint64_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  return std::to_string(lo + uniform_index(rng, 9 * lo));
}

// As Python's uuid.UUID(int=getrandbits(128), version=4): random bits with the version nibble 4 and
// the RFC 4122 variant.
std::string random_uuid(std::mt19937_64& rng) {
  uint64_t hi = rng(), lo = rng();
  hi = (hi & ~(0xFull << 12)) | (0x4ull << 12);
  lo = (lo & ~(0x3ull << 62)) | (0x2ull << 62);
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xFFFF),
                static_cast<unsigned long long>(hi & 0xFFFF),
                static_cast<unsigned long long>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFull));
  return buf;
}

std::string random_key_word(std::mt19937_64& rng) {
  const auto& adj = key_adjectives();
  const auto& noun = key_nouns();
  const std::string& a = adj[uniform_index(rng, adj.size())];
  return a + "-" + noun[uniform_index(rng, noun.size())];
}

std::string random_letters(std::mt19937_64& rng, int n, char base) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>(base + uniform_index(rng, 26));
  return s;
}

// Draws strings that are distinct from every string drawn before (keys, values, names), so that an
// answer can never be confused with a distractor.
class Drawer {
 public:
  std::string fresh(std::mt19937_64& rng, const std::string& type) {
    for (int tries = 0; tries < 100000; ++tries) {
      std::string s;
      if (type == "numbers")
        s = random_number(rng, 7);
      else if (type == "words")
        s = random_key_word(rng);
      else
        s = random_uuid(rng);
      if (used_.insert(s).second) return s;
    }
    KVB_FAIL("synthetic task: ran out of distinct ", type, " (too many needles for the key space)");
  }
  bool use(const std::string& s) { return used_.insert(s).second; }

 private:
  std::set<std::string> used_;
};

size_t count_occurrences(std::string_view text, std::string_view needle) {
  if (needle.empty()) return 0;
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string_view::npos;
       pos = text.find(needle, pos + 1))
    ++n;
  return n;
}

std::vector<std::string_view> split_ws(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  auto is_ws = [](char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  };
  while (i < text.size()) {
    while (i < text.size() && is_ws(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && !is_ws(text[j])) ++j;
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j;
  }
  return out;
}

// A word that ends a sentence: its last character, after closing quotes and brackets (ASCII, and
// the UTF-8 right quotes of the Gutenberg texts), is '.', '!' or '?'.
bool ends_sentence(std::string_view w) {
  while (!w.empty()) {
    const char c = w.back();
    if (c == '"' || c == '\'' || c == ')' || c == ']') {
      w.remove_suffix(1);
    } else if (w.size() >= 3 && (w.substr(w.size() - 3) == "\xE2\x80\x9D" ||
                                 w.substr(w.size() - 3) == "\xE2\x80\x99")) {
      w.remove_suffix(3);
    } else {
      break;
    }
  }
  return !w.empty() && (w.back() == '.' || w.back() == '!' || w.back() == '?');
}

const std::vector<std::string_view>& noise_words() {
  static const std::vector<std::string_view> kWords = split_ws(kNoise);
  return kWords;
}

// ---------------------------------------------------------------------------------------------
// Context layout: haystack units (words or needles) joined by spaces, with inserted texts at gaps
// (gap g = before unit g; gap n = at the end). An insert marked `newline` sits on its own line.

struct Insert {
  size_t gap;
  std::string text;
  bool newline;
};

struct Layout {
  size_t n = 0;
  std::function<std::string_view(size_t)> unit;
  std::vector<Insert> inserts;  // sorted by gap (stable: equal gaps keep their order)
  std::string target;           // the target needle ("" for none)
  size_t target_gap = 0;
  bool target_newline = false;
  // At its gap the target goes before the other inserts there (depth < 0.5) or after them, so
  // that depth 0 and depth 1 can put it first and last even when another needle shares the gap.
  bool target_first = false;
};

// Renders the context. `target_offset` receives the byte offset of the target; with stop_at_target
// the text ends right before it (including the separator), for measuring the tokens before it.
std::string render(const Layout& l, size_t* target_offset = nullptr, bool stop_at_target = false) {
  std::string out;
  bool first = true, prev_newline = false;
  auto separate = [&](bool newline) {
    if (!first) out += (newline || prev_newline) ? '\n' : ' ';
  };
  auto put = [&](std::string_view text, bool newline) {
    separate(newline);
    out.append(text.data(), text.size());
    first = false;
    prev_newline = newline;
  };
  size_t next_insert = 0;
  auto put_inserts = [&](size_t g) {
    while (next_insert < l.inserts.size() && l.inserts[next_insert].gap == g) {
      put(l.inserts[next_insert].text, l.inserts[next_insert].newline);
      ++next_insert;
    }
  };
  for (size_t g = 0; g <= l.n; ++g) {
    const bool here = !l.target.empty() && g == l.target_gap;
    if (!(here && l.target_first)) put_inserts(g);
    if (here) {
      separate(l.target_newline);
      if (target_offset) *target_offset = out.size();
      if (stop_at_target) return out;
      out += l.target;
      first = false;
      prev_newline = l.target_newline;
      put_inserts(g);
    }
    if (g < l.n) put(l.unit(g), false);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Length search. f(n) is the token count of the prompt built with n haystack units; it grows with n
// (up to a token of noise where a junction changes). Returns the n whose count is nearest to
// `budget` (ties and `floor_only` pick the largest n with f(n) <= budget), n in [lo, max_n].

int64_t search_units(int64_t lo, int64_t max_n, int64_t budget, bool floor_only,
                     const std::function<int64_t(int64_t)>& f) {
  if (f(lo) > budget) return lo;
  int64_t hi = std::min<int64_t>(max_n, std::max<int64_t>(lo + 1, 64));
  while (hi > lo && f(hi) <= budget) {
    lo = hi;
    if (hi == max_n) return hi;
    hi = std::min<int64_t>(max_n, hi * 2);
  }
  if (hi <= lo) return lo;
  // f(lo) <= budget < f(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (f(mid) <= budget)
      lo = mid;
    else
      hi = mid;
  }
  if (floor_only) return lo;
  return (f(hi) - budget < budget - f(lo)) ? hi : lo;
}

// ---------------------------------------------------------------------------------------------
// The generator.

struct NiahParams {
  Haystack haystack = Haystack::kNoise;
  std::string key_type, value_type;  // kNeedleItems names
  int num_keys = 1, num_values = 1, num_queries = 1;
};

struct CweParams {
  int freq_cw = 30, freq_ucw = 3, num_cw = 10;
  bool few_shot = true;
  int ex_words = 40, ex_freq_cw = 10, ex_freq_ucw = 3;  // the one-shot example (RULER)
  json to_json() const {
    json j = {
        {"freq_cw", freq_cw}, {"freq_ucw", freq_ucw}, {"num_cw", num_cw}, {"few_shot", few_shot}};
    if (few_shot) {
      j["example_words"] = ex_words;
      j["example_freq_cw"] = ex_freq_cw;
      j["example_freq_ucw"] = ex_freq_ucw;
    }
    return j;
  }
};

class Generator {
 public:
  Generator(const Tokenizer& tok, const TaskSpec& spec, std::shared_ptr<const Corpus> corpus)
      : counter_(tok), spec_(spec), def_(find_task(spec.task)), corpus_(std::move(corpus)) {
    budget_ = spec.target_tokens - 1;  // BOS
    tol_ = spec.target_tokens / 100;
    if (corpus_) {
      words_ = split_ws(corpus_->text);
      KVB_CHECK(words_.size() >= 2, "corpus '", corpus_->name, "' has too few words");
      for (size_t i = 0; i < words_.size(); ++i)
        if (i == 0 || ends_sentence(words_[i - 1])) sentence_starts_.push_back(i);
    }
    setup();
  }

  json effective_params() const { return effective_; }

  TaskSample make(std::optional<double> depth, uint64_t seed) {
    for (int pass = 0; pass < 2; ++pass) {
      TaskSample s = make_once(depth, seed);
      int64_t exact = 0;
      // The fast counter is exact for Llama-style SentencePiece models; if it ever disagrees, it
      // switches to whole-text encoding and the sample is made again with exact counts.
      if (counter_.verify(s.prompt(), &exact)) {
        s.actual_tokens = exact + 1;
        KVB_CHECK(std::llabs(s.actual_tokens - spec_.target_tokens) <= tol_, "task '", spec_.task,
                  "': cannot reach target_tokens ", spec_.target_tokens, " within 1% (got ",
                  s.actual_tokens, ")", min_hint());
        return s;
      }
    }
    KVB_FAIL("task '", spec_.task, "': token counting did not settle");
  }

 private:
  std::string min_hint() const {
    return "; the task's minimum length with this tokenizer may be larger than the target";
  }

  void setup() {
    const json& p = spec_.params;
    const std::string& t = spec_.task;
    switch (def_.kind) {
      case Kind::kNiah:
        niah_.haystack = param_enum(p, "haystack", kHaystacks);
        niah_.key_type = p.at("key_type").get<std::string>();
        niah_.value_type = p.at("value_type").get<std::string>();
        niah_.num_keys = static_cast<int>(p.at("num_keys").get<int64_t>());
        niah_.num_values = static_cast<int>(p.at("num_values").get<int64_t>());
        niah_.num_queries = static_cast<int>(p.at("num_queries").get<int64_t>());
        effective_ = p;
        break;
      case Kind::kVt: {
        vt_chains_ = static_cast<int>(p.at("num_chains").get<int64_t>());
        vt_hops_ = static_cast<int>(p.at("num_hops").get<int64_t>());
        const json& fs = p.at("few_shot");
        if (fs.is_boolean()) {
          vt_few_shot_ = fs.get<bool>();
        } else {
          // RULER always prepends a ~500-token example; a short target cannot afford one. "auto"
          // keeps it when its smallest form fits in min(500, target / 8) tokens (8% of RULER's
          // 4k; the whole budget at 4k and beyond).
          std::mt19937_64 probe(0);
          Drawer d;
          const VtExample ex = vt_example(probe, d);
          vt_few_shot_ = counter_.count(vt_example_text(ex, 0)) <= vt_example_budget();
        }
        effective_ = p;
        effective_["few_shot"] = vt_few_shot_;
        break;
      }
      case Kind::kCwe:
        setup_cwe(p, t);
        break;
      case Kind::kFwe: {
        fwe_alpha_ = p.at("alpha").get<double>();
        fwe_wordlen_ = static_cast<int>(p.at("coded_wordlen").get<int64_t>());
        const int64_t vs = p.at("vocab_size").get<int64_t>();
        // RULER: max_seq_length // 50. At least 5 (the noise word, three answers and one more) so
        // that a short target still has a 4th-ranked word to tell the top three from.
        fwe_vocab_ = static_cast<int>(vs > 0 ? vs : std::max<int64_t>(5, spec_.target_tokens / 50));
        KVB_CHECK(fwe_vocab_ >= 5, "task 'fwe': vocab_size ", fwe_vocab_, " must be at least 5");
        // zeta(alpha) by direct summation plus the Euler-Maclaurin tail (error < 1e-15).
        const int kTerms = 1000;
        double z = 0;
        for (int k = kTerms; k >= 1; --k) z += std::pow(static_cast<double>(k), -fwe_alpha_);
        const double K = kTerms;
        z += std::pow(K, 1 - fwe_alpha_) / (fwe_alpha_ - 1) - 0.5 * std::pow(K, -fwe_alpha_) +
             fwe_alpha_ / 12 * std::pow(K, -fwe_alpha_ - 1);
        fwe_weights_.resize(static_cast<size_t>(fwe_vocab_));
        for (int k = 0; k < fwe_vocab_; ++k)
          fwe_weights_[k] = std::pow(static_cast<double>(k + 1), -fwe_alpha_) / z;
        effective_ = p;
        effective_["vocab_size"] = fwe_vocab_;
        break;
      }
      case Kind::kPasskey:
        passkey_digits_ = static_cast<int>(p.at("digits").get<int64_t>());
        effective_ = p;
        break;
      case Kind::kCopy:
        effective_ = p;
        break;
    }
  }

  TaskSample make_once(std::optional<double> depth, uint64_t seed) {
    switch (def_.kind) {
      case Kind::kNiah:
        return niah(depth, seed);
      case Kind::kVt:
        return vt(seed);
      case Kind::kCwe:
        return cwe(seed);
      case Kind::kFwe:
        return fwe(seed);
      case Kind::kPasskey:
        return passkey(depth, seed);
      case Kind::kCopy:
        return copy(seed);
    }
    KVB_FAIL("unreachable");
  }

  TaskSample base_sample(uint64_t seed, const char* metric, int64_t max_new_tokens) const {
    TaskSample s;
    s.task = spec_.task;
    s.seed = seed;
    s.metric = metric;
    s.max_new_tokens = max_new_tokens;
    s.target_tokens = spec_.target_tokens;
    return s;
  }

  int64_t prompt_count(const std::string& preamble, const std::string& context,
                       const std::string& rest) {
    return counter_.count(preamble + context + rest);
  }

  // Places the target of `l` at the gap whose preceding tokens are nearest to depth * (context -
  // needle) tokens, preferring a sentence boundary (is_boundary) when one is within 0.5% of the
  // context of that point (so that needles in prose sit between sentences, as RULER puts them,
  // wherever the tolerance allows). Fills the sample's measured fields.
  void place_target(Layout& l, double depth, const std::function<bool(size_t)>& is_boundary,
                    TaskSample& s, bool snap_moved = false) {
    l.target_first = depth < 0.5;
    l.target_gap = static_cast<size_t>(std::llround(depth * static_cast<double>(l.n)));
    const int64_t context_tokens = counter_.count(render(l));
    const int64_t needle_tokens = counter_.count(l.target);
    const double desired = depth * static_cast<double>(context_tokens - needle_tokens);
    // The prefix without the space before the needle: that space belongs to the needle's first
    // token ("▁One"), so the count is the index of that token in the context's tokens.
    auto before = [&](size_t g) {
      l.target_gap = g;
      std::string prefix = render(l, nullptr, true);
      while (!prefix.empty() && prefix.back() == ' ') prefix.pop_back();
      return counter_.count(prefix);
    };
    auto search = [&]() {
      // Smallest gap with before(g) >= desired, then the nearer of it and its left neighbour.
      size_t lo = 0, hi = l.n;
      if (static_cast<double>(before(hi)) < desired) {
        lo = hi;
      } else {
        while (lo < hi) {
          const size_t mid = lo + (hi - lo) / 2;
          if (static_cast<double>(before(mid)) >= desired)
            hi = mid;
          else
            lo = mid + 1;
        }
      }
      size_t best = lo;
      double best_err = std::fabs(static_cast<double>(before(lo)) - desired);
      if (lo > 0) {
        const double e = std::fabs(static_cast<double>(before(lo - 1)) - desired);
        if (e <= best_err) best = lo - 1, best_err = e;
      }
      if (!is_boundary(best)) {
        const double sentence_tol = 0.005 * static_cast<double>(context_tokens);
        constexpr size_t kReach = 48;
        size_t cand[2] = {SIZE_MAX, SIZE_MAX};
        for (size_t d = 1; d <= kReach && best >= d; ++d)
          if (is_boundary(best - d)) {
            cand[0] = best - d;
            break;
          }
        for (size_t d = 1; d <= kReach && best + d <= l.n; ++d)
          if (is_boundary(best + d)) {
            cand[1] = best + d;
            break;
          }
        size_t pick = best;
        double pick_err = 1e300;
        for (size_t c : cand) {
          if (c == SIZE_MAX) continue;
          const double e = std::fabs(static_cast<double>(before(c)) - desired);
          if (e <= sentence_tol && e < pick_err) pick = c, pick_err = e;
        }
        best = pick;
      }
      return best;
    };
    size_t best = search();
    if (!l.inserts.empty()) {
      // Another needle standing where the target should be would hold it a needle's length off
      // its depth. Such needles move out of a window of 2.5 target lengths of haystack on each
      // side of the target (staying on their side where there is room), and the target is placed
      // again: the window then holds haystack words only.
      int64_t others_tokens = 0;
      for (const auto& ins : l.inserts) others_tokens += counter_.count(ins.text);
      const double per_unit =
          std::max(1.0, static_cast<double>(context_tokens - needle_tokens - others_tokens) /
                            static_cast<double>(std::max<size_t>(1, l.n)));
      const size_t z =
          static_cast<size_t>(std::ceil(2.5 * static_cast<double>(needle_tokens) / per_unit)) + 1;
      auto outside = [&](size_t g) { return g + z <= best || g >= best + z; };
      bool moved = false;
      for (auto& ins : l.inserts) {
        if (outside(ins.gap)) continue;
        const bool before_side = ins.gap < best || (ins.gap == best && !l.target_first);
        size_t g;
        if (before_side && best >= z)
          g = best - z;
        else if (best + z <= l.n)
          g = best + z;
        else
          g = best >= z ? best - z : 0;
        if (snap_moved) g = nearest_sentence_gap(l, g, outside);
        ins.gap = g;
        moved = true;
      }
      if (moved) {
        std::stable_sort(l.inserts.begin(), l.inserts.end(),
                         [](const Insert& a, const Insert& b) { return a.gap < b.gap; });
        best = search();
      }
    }
    s.needle_token_offset = before(best);
    l.target_gap = best;
    size_t offset = 0;
    s.context = render(l, &offset);
    s.context_tokens = counter_.count(s.context);
    s.needle_tokens = needle_tokens;
    s.needle = l.target;
    s.depth = depth;
  }

  // ---- NIAH ----

  // The allowed sentence boundary (a gap after a sentence-ending unit, or either end) nearest to
  // `gap` within 64 units; `gap` itself when there is none.
  static size_t nearest_sentence_gap(const Layout& l, size_t gap,
                                     const std::function<bool(size_t)>& allowed) {
    auto boundary = [&](size_t g) {
      return allowed(g) && (g == 0 || g == l.n || ends_sentence(l.unit(g - 1)));
    };
    for (size_t d = 0; d <= 64; ++d) {
      if (gap >= d && boundary(gap - d)) return gap - d;
      if (gap + d <= l.n && boundary(gap + d)) return gap + d;
    }
    return gap;
  }

  std::string needle_text(const std::string& key, const std::string& value) const {
    return "One of the special magic " + niah_.value_type + " for " + key + " is: " + value + ".";
  }

  TaskSample niah(std::optional<double> depth_in, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const NiahParams& p = niah_;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      Drawer draw;
      std::vector<std::string> keys;
      std::vector<std::vector<std::string>> values;
      for (int k = 0; k < p.num_keys; ++k) {
        keys.push_back(draw.fresh(rng, p.key_type));
        values.emplace_back();
        for (int v = 0; v < p.num_values; ++v)
          values.back().push_back(draw.fresh(rng, p.value_type));
      }
      struct Needle {
        size_t key, value;
      };
      std::vector<Needle> needles;
      for (size_t k = 0; k < keys.size(); ++k)
        for (size_t v = 0; v < values[k].size(); ++v) needles.push_back({k, v});
      shuffle_in_place(needles, rng);
      const std::vector<size_t> queries =
          sample_distinct(rng, keys.size(), static_cast<size_t>(p.num_queries));
      std::vector<std::string> answers;
      for (size_t k : queries)
        for (const auto& v : values[k]) answers.push_back(v);
      const double depth = depth_in ? *depth_in : grid_depth(uniform_index(rng, kGridSize));
      // Prompt pieces (RULER's template; the singular form when one value is asked for).
      std::string query;
      for (size_t i = 0; i < queries.size(); ++i) {
        if (i > 0) query += (i + 1 == queries.size()) ? ", and " : ", ";
        query += keys[queries[i]];
      }
      const bool single = p.num_queries * p.num_values == 1;
      const std::string type_v =
          single ? p.value_type.substr(0, p.value_type.size() - 1) : p.value_type;
      TaskSample s = base_sample(seed, "string_match_all", kNiahMaxNewTokens);
      s.preamble = std::string(single ? "A special magic " : "Some special magic ") + type_v +
                   (single ? " is" : " are") +
                   " hidden within the following text. Make sure to memorize it. I will quiz you "
                   "about the " +
                   type_v + " afterwards.\n";
      s.postamble = "\n";
      s.question = std::string(single ? "What is the" : "What are all the") + " special magic " +
                   type_v + " for " + query + " mentioned in the provided text?";
      s.answer_prefix = " The special magic " + type_v + " for " + query +
                        " mentioned in the provided text " + (single ? "is" : "are");
      s.answers = answers;
      const std::string rest = s.postamble + s.question + s.answer_prefix;

      const std::string target = needle_text(keys[queries[0]], values[queries[0]][0]);
      // The target is the first value of the first key asked for; every other needle goes to a
      // random depth of RULER's grid (distinct while the grid lasts), as RULER places all of its.
      std::vector<std::pair<double, std::string>> others;
      {
        const std::vector<size_t> grid =
            sample_distinct(rng, kGridSize, std::min(kGridSize, needles.size() - 1));
        size_t gi = 0;
        for (const Needle& nd : needles) {
          if (nd.key == queries[0] && nd.value == 0) continue;
          const size_t g = gi < grid.size() ? grid[gi] : uniform_index(rng, kGridSize);
          ++gi;
          others.emplace_back(grid_depth(g), needle_text(keys[nd.key], values[nd.key][nd.value]));
        }
      }

      // Haystack.
      size_t start_index = 0, start = 0;  // the haystack's first word (corpus or noise stream)
      if (p.haystack == Haystack::kCorpus) {
        start_index = uniform_index(rng, sentence_starts_.size());
        start = sentence_starts_[start_index];
      }
      std::mt19937_64 distractor_rng(rng());
      std::vector<std::string> distractors;
      auto ensure_distractors = [&](size_t m) {
        while (distractors.size() < m)
          distractors.push_back(needle_text(draw.fresh(distractor_rng, p.key_type),
                                            draw.fresh(distractor_rng, p.value_type)));
      };

      // Layout: `count` haystack words, or `count` distractor needles with a block of pad_words
      // noise words after the first pad_block of them. Everything is joined by single spaces
      // (RULER puts the noise paragraphs and the needle-haystack needles on lines of their own):
      // word-level units are what let the length and the depth hit 1%.
      Layout l;
      l.target = target;
      size_t pad_words = 0, pad_block = 0;
      auto configure = [&](size_t count) {
        if (p.haystack == Haystack::kNoise) {
          l.n = count;
          l.unit = [start](size_t i) { return noise_words()[(start + i) % noise_words().size()]; };
        } else if (p.haystack == Haystack::kCorpus) {
          l.n = count;
          l.unit = [this, start](size_t i) { return words_[(start + i) % words_.size()]; };
        } else {
          ensure_distractors(count);
          l.n = count + pad_words;
          const size_t pb = std::min(pad_block, count), pw = pad_words;
          l.unit = [&distractors, pb, pw](size_t i) -> std::string_view {
            if (i < pb) return distractors[i];
            if (i < pb + pw) return noise_words()[(i - pb) % noise_words().size()];
            return distractors[i - pw];
          };
        }
        const double n = static_cast<double>(l.n);
        l.inserts.clear();
        for (const auto& o : others) {
          size_t gap = static_cast<size_t>(std::llround(o.first * n));
          // Other needles need no precision: in prose they go to the nearest sentence boundary,
          // as RULER inserts every needle between sentences.
          if (p.haystack == Haystack::kCorpus)
            gap = nearest_sentence_gap(l, gap, [](size_t) { return true; });
          l.inserts.push_back({gap, o.second, false});
        }
        std::stable_sort(l.inserts.begin(), l.inserts.end(),
                         [](const Insert& a, const Insert& b) { return a.gap < b.gap; });
        l.target_gap = static_cast<size_t>(std::llround(depth * n));
      };
      auto f = [&](int64_t count) {
        configure(static_cast<size_t>(count));
        return prompt_count(s.preamble, render(l), rest);
      };
      if (p.haystack == Haystack::kNeedles) {
        // A needle is tens of tokens: too coarse for 1% of a short target, and for the depth.
        // So two needles fewer than fit, and the rest is a block of noise words placed where the
        // target goes, which lets the target sit at word precision. (RULER's needle haystack has
        // no noise; here it is a few dozen words of "The grass is green..." among the needles.)
        pad_block = SIZE_MAX;
        const int64_t fit = search_units(0, 1 << 24, budget_, true, f);
        const size_t m = static_cast<size_t>(std::max<int64_t>(0, fit - 2));
        pad_block = m;
        auto fp = [&](int64_t pad) {
          pad_words = static_cast<size_t>(pad);
          configure(m);
          return prompt_count(s.preamble, render(l), rest);
        };
        pad_words = static_cast<size_t>(search_units(0, 1 << 24, budget_, false, fp));
        configure(m);
        // The block starts at the last needle boundary before the target's token position.
        const int64_t context_tokens = counter_.count(render(l));
        const double desired = depth * static_cast<double>(context_tokens - counter_.count(target));
        auto needles_before = [&](size_t g) {
          std::string t;
          for (size_t i = 0; i < g; ++i) (t += distractors[i]) += ' ';
          return static_cast<double>(counter_.count(t));
        };
        size_t lo = 0, hi = m;  // largest g with needles_before(g) <= desired
        while (lo < hi) {
          const size_t mid = lo + (hi - lo + 1) / 2;
          if (needles_before(mid) <= desired)
            lo = mid;
          else
            hi = mid - 1;
        }
        pad_block = lo;
        configure(m);
      } else {
        const int64_t max_n =
            p.haystack == Haystack::kCorpus ? static_cast<int64_t>(words_.size()) : 1 << 26;
        // Word granularity (a few tokens) can miss 1% of a short target; then the haystack starts
        // at the next sentence instead (other words, other lengths), up to 8 times.
        int64_t best_n = 0, best_err = INT64_MAX;
        size_t best_start = 0;
        for (int retry = 0; retry < 8; ++retry) {
          if (p.haystack == Haystack::kCorpus) {
            start = sentence_starts_[(start_index + retry) % sentence_starts_.size()];
          } else {
            static const size_t kNoiseStarts[] = {0, 4, 8, 12, 15};  // its sentence starts
            start = kNoiseStarts[retry % 5];
          }
          const int64_t n = search_units(0, max_n, budget_, false, f);
          if (p.haystack == Haystack::kCorpus && n == max_n)
            KVB_CHECK(f(n) >= budget_ - tol_, "task '", spec_.task, "': corpus '", corpus_->name,
                      "' has too few words for target_tokens ", spec_.target_tokens);
          const int64_t err = std::llabs(f(n) - budget_);
          if (err < best_err) best_err = err, best_n = n, best_start = start;
          if (best_err <= tol_) break;
        }
        start = best_start;
        configure(static_cast<size_t>(best_n));
      }
      const bool words_haystack = p.haystack != Haystack::kNeedles;
      place_target(
          l, depth,
          [&](size_t g) {
            if (!words_haystack || g == 0 || g == l.n) return true;
            return ends_sentence(l.unit(g - 1));
          },
          s, p.haystack == Haystack::kCorpus);
      // Each answer must occur once: a value that also occurs in the haystack (a number in a
      // book, a word key inside a longer key) would make the task ambiguous; draw again.
      bool ok = count_occurrences(s.context, target) == 1;
      for (const auto& a : s.answers) ok = ok && count_occurrences(s.context, a) == 1;
      if (ok) return s;
    }
    KVB_FAIL("task '", spec_.task, "': could not draw needles that occur once in the context");
  }

  // ---- passkey ----

  TaskSample passkey(std::optional<double> depth_in, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const std::string key = random_number(rng, passkey_digits_);
    const double depth = depth_in ? *depth_in : grid_depth(uniform_index(rng, kGridSize));
    TaskSample s = base_sample(seed, "string_match_all", kPasskeyMaxNewTokens);
    // Landmark Attention's run_test.py: "\n".join([task_description, garbage_prefix,
    // information_line, garbage_suffix, final_question]), the garbage being the noise sentences
    // (cut here at word boundaries, not characters).
    s.preamble = std::string(kPasskeyInstruction) + "\n";
    s.postamble = "\n";
    s.question = "What is the pass key?";
    s.answer_prefix = " The pass key is";
    s.answers = {key};
    Layout l;
    l.unit = [](size_t i) { return noise_words()[i % noise_words().size()]; };
    l.target = "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
    l.target_newline = true;
    const std::string rest = s.postamble + s.question + s.answer_prefix;
    auto f = [&](int64_t n) {
      l.n = static_cast<size_t>(n);
      l.target_gap = static_cast<size_t>(std::llround(depth * static_cast<double>(n)));
      return prompt_count(s.preamble, render(l), rest);
    };
    l.n = static_cast<size_t>(search_units(0, 1 << 26, budget_, false, f));
    place_target(
        l, depth, [&](size_t g) { return g == 0 || g == l.n || ends_sentence(l.unit(g - 1)); }, s);
    KVB_CHECK(count_occurrences(s.context, l.target) == 1 && count_occurrences(s.context, key) == 2,
              "task 'passkey': the key does not occur exactly twice");
    return s;
  }

  // ---- variable tracking ----

  struct VtExample {
    std::vector<std::vector<std::string>> vars;  // [chain][hop]
    std::vector<std::string> values;             // [chain]
    std::vector<uint64_t> fractions;             // [chain * (hops + 1)] in [0, 2^30)
  };

  VtExample vt_chains(std::mt19937_64& rng, Drawer& d, int chains, int hops, int name_len) {
    VtExample ex;
    for (int c = 0; c < chains; ++c) {
      ex.vars.emplace_back();
      for (int h = 0; h <= hops; ++h) {
        std::string v;
        do v = random_letters(rng, name_len, 'A');
        while (!d.use(v));
        ex.vars.back().push_back(v);
      }
      std::string value;
      // np.random.randint(10000, 99999): 10000..99998.
      do value = std::to_string(10000 + uniform_index(rng, 89999));
      while (!d.use(value));
      ex.values.push_back(value);
    }
    for (int i = 0; i < chains * (hops + 1); ++i)
      ex.fractions.push_back(uniform_index(rng, 1u << 30));
    return ex;
  }

  // RULER's few-shot example: three-letter names, at most 10 hops.
  VtExample vt_example(std::mt19937_64& rng, Drawer& d) {
    return vt_chains(rng, d, vt_chains_, std::min(10, vt_hops_), 3);
  }

  int64_t vt_example_budget() const { return std::min<int64_t>(500, spec_.target_tokens / 8); }

  // The context: n noise words with each chain's statements on their own lines at sentence
  // boundaries of the noise, in chain order (RULER inserts them between repetitions of the noise
  // paragraph; a word-level stream lets the length hit 1%).
  std::string vt_context(const VtExample& ex, size_t n) {
    std::vector<size_t> boundaries;
    const auto& nw = noise_words();
    for (size_t g = 0; g <= n; ++g)
      if (g == 0 || g == n || ends_sentence(nw[(g - 1) % nw.size()])) boundaries.push_back(g);
    Layout l;
    l.n = n;
    l.unit = [](size_t i) { return noise_words()[i % noise_words().size()]; };
    const size_t hops1 = ex.vars.front().size();
    for (size_t c = 0; c < ex.vars.size(); ++c) {
      // Distinct boundaries per chain (RULER: random.sample), kept in hop order.
      std::vector<size_t> idx;
      for (size_t h = 0; h < hops1; ++h)
        idx.push_back(static_cast<size_t>((ex.fractions[c * hops1 + h] * boundaries.size()) >> 30));
      std::sort(idx.begin(), idx.end());
      const size_t b = boundaries.size();
      if (b >= hops1) {
        // Strictly increasing, then pulled back from the end: both passes keep the order.
        for (size_t h = 1; h < hops1; ++h) idx[h] = std::max(idx[h], idx[h - 1] + 1);
        for (size_t h = 0; h < hops1; ++h) idx[h] = std::min(idx[h], b - (hops1 - h));
      } else {
        // Too short a context for distinct places (only while searching small sizes).
        for (size_t h = 0; h < hops1; ++h) idx[h] = std::min(idx[h], b - 1);
      }
      for (size_t h = 0; h < hops1; ++h) {
        const std::string stmt = h == 0 ? "VAR " + ex.vars[c][0] + " = " + ex.values[c]
                                        : "VAR " + ex.vars[c][h] + " = VAR " + ex.vars[c][h - 1];
        l.inserts.push_back({boundaries[idx[h]], stmt, true});
      }
    }
    std::stable_sort(l.inserts.begin(), l.inserts.end(),
                     [](const Insert& a, const Insert& b) { return a.gap < b.gap; });
    return render(l);
  }

  std::string vt_question(const std::string& value) const {
    return "Question: Find all variables that are assigned the value " + value +
           " in the text above.";
  }
  std::string vt_answer_prefix(size_t num_v, const std::string& value) const {
    return " Answer: According to the chain(s) of variable assignment in the text above, " +
           std::to_string(num_v) + " variables are assgined the value " + value + ", they are: ";
  }

  std::string vt_example_text(const VtExample& ex, size_t n) {
    std::string out = std::string(kVtInstruction) + vt_context(ex, n) + "\n" +
                      vt_question(ex.values[0]) + vt_answer_prefix(ex.vars[0].size(), ex.values[0]);
    out += join(ex.vars[0], " ");
    return out;
  }

  TaskSample vt(uint64_t seed) {
    std::mt19937_64 rng(seed);
    Drawer d;
    const VtExample main = vt_chains(rng, d, vt_chains_, vt_hops_, 5);
    TaskSample s = base_sample(seed, "string_match_all", kVtMaxNewTokens);
    if (vt_few_shot_) {
      const VtExample ex = vt_example(rng, d);
      const int64_t budget = vt_example_budget();
      auto fe = [&](int64_t n) {
        return counter_.count(vt_example_text(ex, static_cast<size_t>(n)));
      };
      const int64_t e = search_units(0, 1 << 20, budget, true, fe);
      s.preamble = vt_example_text(ex, static_cast<size_t>(e)) + "\n";
    }
    s.preamble += kVtInstruction;
    s.postamble = "\n";
    s.question = vt_question(main.values[0]);
    s.answer_prefix = vt_answer_prefix(main.vars[0].size(), main.values[0]);
    s.answers = main.vars[0];
    const std::string rest = s.postamble + s.question + s.answer_prefix;
    auto f = [&](int64_t n) {
      return prompt_count(s.preamble, vt_context(main, static_cast<size_t>(n)), rest);
    };
    const int64_t n = search_units(0, 1 << 26, budget_, false, f);
    s.context = vt_context(main, static_cast<size_t>(n));
    s.context_tokens = counter_.count(s.context);
    for (const auto& a : s.answers)
      KVB_CHECK(count_occurrences(s.context, "VAR " + a + " ") >= 1, "task 'vt': answer ", a,
                " missing from the context");
    return s;
  }

  // ---- common words extraction ----

  void setup_cwe(const json& p, const std::string& task) {
    // The vocabulary: the corpus's distinct lower-case alphabetic words of 3 to 12 letters, with
    // punctuation around them removed, sorted (RULER samples from wonderwords' noun, adjective and
    // verb lists; a corpus gives real words in the tens of thousands for long contexts).
    std::unordered_set<std::string_view> seen;
    for (std::string_view w : words_) {
      size_t a = 0, b = w.size();
      while (a < b && !(w[a] >= 'a' && w[a] <= 'z') && !(w[a] >= 'A' && w[a] <= 'Z')) ++a;
      while (b > a && !(w[b - 1] >= 'a' && w[b - 1] <= 'z') &&
             !(w[b - 1] >= 'A' && w[b - 1] <= 'Z'))
        --b;
      std::string_view core = w.substr(a, b - a);
      if (core.size() < 3 || core.size() > 12) continue;
      bool lower = true;
      for (char c : core) lower = lower && c >= 'a' && c <= 'z';
      if (lower) seen.insert(core);
    }
    cwe_vocab_.assign(seen.begin(), seen.end());
    std::sort(cwe_vocab_.begin(), cwe_vocab_.end());
    KVB_CHECK(cwe_vocab_.size() >= 100, "task 'cwe': corpus '", corpus_->name, "' has only ",
              cwe_vocab_.size(), " distinct lower-case words; it needs at least 100");

    const bool long_target = spec_.target_tokens >= 4096;
    // RULER: 30/3 with a (40 words, 10/3) example from 4096 tokens on, 6/1 with a (20, 3/1)
    // example below.
    CweParams ruler;
    if (!long_target) {
      ruler.freq_cw = 6, ruler.freq_ucw = 1;
      ruler.ex_words = 20, ruler.ex_freq_cw = 3, ruler.ex_freq_ucw = 1;
    }
    const bool any_set = p.contains("freq_cw") || p.contains("freq_ucw") || p.contains("num_cw") ||
                         p.contains("few_shot");
    if (any_set) {
      CweParams c = ruler;
      if (p.contains("freq_cw")) c.freq_cw = static_cast<int>(p.at("freq_cw").get<int64_t>());
      if (p.contains("freq_ucw")) c.freq_ucw = static_cast<int>(p.at("freq_ucw").get<int64_t>());
      if (p.contains("num_cw")) c.num_cw = static_cast<int>(p.at("num_cw").get<int64_t>());
      if (p.contains("few_shot")) {
        const json& fs = p.at("few_shot");
        c.few_shot = fs.is_boolean() ? fs.get<bool>() : cwe_fits(c);
      }
      KVB_CHECK(c.freq_cw > c.freq_ucw, "task '", task, "': freq_cw (", c.freq_cw,
                ") must exceed freq_ucw (", c.freq_ucw, ")");
      cwe_ = c;
    } else {
      // RULER's settings when they fit; shorter targets (RULER starts at 4k) drop the example,
      // then lower the common words' frequency, keeping 10 common words and at least as many
      // uncommon ones.
      std::vector<CweParams> tiers = {ruler};
      CweParams t = ruler;
      if (long_target) {
        t.freq_cw = 6, t.freq_ucw = 1, t.ex_words = 20, t.ex_freq_cw = 3, t.ex_freq_ucw = 1;
        tiers.push_back(t);
      }
      t.few_shot = false;
      tiers.push_back(t);
      t.freq_cw = 3;
      tiers.push_back(t);
      t.freq_cw = 2;
      tiers.push_back(t);
      bool found = false;
      for (const auto& c : tiers)
        if (cwe_fits(c)) {
          cwe_ = c;
          found = true;
          break;
        }
      KVB_CHECK(found, "task 'cwe': target_tokens ", spec_.target_tokens,
                " is too short for 10 common words even at frequency 2 with this tokenizer");
    }
    KVB_CHECK(static_cast<size_t>(cwe_.num_cw) * 2 + cwe_.ex_words <= cwe_vocab_.size(),
              "task 'cwe': num_cw ", cwe_.num_cw, " is too large for the vocabulary");
    effective_ = cwe_.to_json();
  }

  static std::string numbered(const std::vector<std::string_view>& words) {
    std::string out;
    for (size_t i = 0; i < words.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(i + 1);
      out += ". ";
      out.append(words[i].data(), words[i].size());
    }
    return out;
  }

  // The word list: common words repeated freq_cw times, the others freq_ucw times, shuffled.
  static std::string cwe_list(const std::vector<std::string_view>& words, int num_cw, int freq_cw,
                              int freq_ucw, uint64_t shuffle_seed) {
    std::vector<std::string_view> list;
    for (size_t i = 0; i < words.size(); ++i) {
      const int reps = static_cast<int>(i) < num_cw ? freq_cw : freq_ucw;
      for (int r = 0; r < reps; ++r) list.push_back(words[i]);
    }
    std::mt19937_64 rng(shuffle_seed);
    shuffle_in_place(list, rng);
    return numbered(list);
  }

  std::string cwe_question(int num_cw) const {
    return "Question: What are the " + std::to_string(num_cw) +
           " most common words in the above list?";
  }
  std::string cwe_answer_prefix(int num_cw) const {
    return " Answer: The top " + std::to_string(num_cw) +
           " words that appear most often in the list are:";
  }

  std::string cwe_example(const CweParams& c, const std::vector<std::string_view>& ex_words,
                          uint64_t shuffle_seed) const {
    const std::vector<std::string_view> common(ex_words.begin(), ex_words.begin() + c.num_cw);
    return std::string(kCweInstruction) +
           cwe_list(ex_words, c.num_cw, c.ex_freq_cw, c.ex_freq_ucw, shuffle_seed) + "\n" +
           cwe_question(c.num_cw) + cwe_answer_prefix(c.num_cw) + " " + numbered(common) + "\n";
  }

  // Whether settings `c` fit the target with as many uncommon words as common ones (the first
  // words of the sorted vocabulary stand in for a sample's random ones).
  bool cwe_fits(const CweParams& c) {
    std::vector<std::string_view> w(cwe_vocab_.begin(), cwe_vocab_.begin() + 2 * c.num_cw);
    std::string text;
    if (c.few_shot) {
      std::vector<std::string_view> ex(cwe_vocab_.end() - c.ex_words, cwe_vocab_.end());
      text = cwe_example(c, ex, 0);
    }
    text += std::string(kCweInstruction) + cwe_list(w, c.num_cw, c.freq_cw, c.freq_ucw, 0) + "\n" +
            cwe_question(c.num_cw) + cwe_answer_prefix(c.num_cw);
    return counter_.count(text) <= budget_ + tol_;
  }

  TaskSample cwe(uint64_t seed) {
    std::mt19937_64 rng(seed);
    const CweParams& c = cwe_;
    // Words come from one random permutation of the vocabulary, drawn lazily (a partial
    // Fisher-Yates), so that a sample with more words extends one with fewer.
    std::vector<uint32_t> perm(cwe_vocab_.size());
    std::iota(perm.begin(), perm.end(), 0u);
    size_t drawn = 0;
    std::mt19937_64 perm_rng(rng());
    auto draw_to = [&](size_t k) {
      for (; drawn < k; ++drawn)
        std::swap(perm[drawn], perm[drawn + uniform_index(perm_rng, perm.size() - drawn)]);
    };
    const uint64_t ex_shuffle = rng(), main_shuffle = rng();
    TaskSample s = base_sample(seed, "string_match_all", kCweMaxNewTokens);
    const size_t ex_n = c.few_shot ? static_cast<size_t>(c.ex_words) : 0;
    if (c.few_shot) {
      draw_to(ex_n);
      std::vector<std::string_view> ex;
      for (size_t i = 0; i < ex_n; ++i) ex.push_back(cwe_vocab_[perm[i]]);
      s.preamble = cwe_example(c, ex, ex_shuffle);
    }
    s.preamble += kCweInstruction;
    s.postamble = "\n";
    s.question = cwe_question(c.num_cw);
    s.answer_prefix = cwe_answer_prefix(c.num_cw);
    auto words_for = [&](size_t n) {
      draw_to(ex_n + n);
      std::vector<std::string_view> w;
      for (size_t i = 0; i < n; ++i) w.push_back(cwe_vocab_[perm[ex_n + i]]);
      return w;
    };
    const std::string rest = s.postamble + s.question + s.answer_prefix;
    auto f = [&](int64_t n) {
      return prompt_count(s.preamble,
                          cwe_list(words_for(static_cast<size_t>(n)), c.num_cw, c.freq_cw,
                                   c.freq_ucw, main_shuffle),
                          rest);
    };
    const int64_t max_n = static_cast<int64_t>(cwe_vocab_.size() - ex_n);
    const int64_t n = search_units(c.num_cw, max_n, budget_, false, f);
    if (n == max_n)
      KVB_CHECK(f(n) >= budget_ - tol_, "task 'cwe': corpus '", corpus_->name, "' has only ",
                cwe_vocab_.size(), " distinct words, too few for target_tokens ",
                spec_.target_tokens, " (try corpus gutenberg-long)");
    // One uncommon word adds freq_ucw numbered entries, up to ~10 tokens each with a small
    // vocabulary: try later words of the permutation in the last place for a closer length.
    if (n > c.num_cw) {
      constexpr size_t kTries = 16;
      const size_t last = ex_n + static_cast<size_t>(n) - 1;
      draw_to(std::min(perm.size(), last + 1 + kTries));
      int64_t best = std::llabs(f(n) - budget_);
      for (size_t k = 1; k <= kTries && best > 0 && last + k < drawn; ++k) {
        std::swap(perm[last], perm[last + k]);
        const int64_t err = std::llabs(f(n) - budget_);
        if (err < best)
          best = err;
        else
          std::swap(perm[last], perm[last + k]);
      }
    }
    const std::vector<std::string_view> w = words_for(static_cast<size_t>(n));
    s.context = cwe_list(w, c.num_cw, c.freq_cw, c.freq_ucw, main_shuffle);
    s.context_tokens = counter_.count(s.context);
    for (int i = 0; i < c.num_cw; ++i) s.answers.emplace_back(w[static_cast<size_t>(i)]);
    return s;
  }

  // ---- frequent words extraction ----

  // n words drawn by Zipf's law (RULER: count_k = floor(n k^-alpha / zeta(alpha))), plus
  // extra_dots more of the noise word.
  std::string fwe_text(const std::vector<std::string>& vocab, int64_t n, int64_t extra_dots,
                       uint64_t shuffle_seed, std::vector<int64_t>* counts_out = nullptr) const {
    std::vector<std::string_view> list;
    std::vector<int64_t> counts(vocab.size());
    for (size_t k = 0; k < vocab.size(); ++k) {
      counts[k] = static_cast<int64_t>(std::floor(static_cast<double>(n) * fwe_weights_[k]));
      if (k == 0) counts[k] += extra_dots;
      for (int64_t r = 0; r < counts[k]; ++r) list.push_back(vocab[k]);
    }
    if (counts_out) *counts_out = counts;
    std::mt19937_64 rng(shuffle_seed);
    shuffle_in_place(list, rng);
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (i) out += ' ';
      out.append(list[i].data(), list[i].size());
    }
    return out;
  }

  TaskSample fwe(uint64_t seed) {
    std::mt19937_64 rng(seed);
    Drawer d;
    std::vector<std::string> vocab;
    for (int k = 0; k < fwe_vocab_; ++k) {
      std::string w;
      do w = random_letters(rng, fwe_wordlen_, 'a');
      while (!d.use(w));
      vocab.push_back(w);
    }
    vocab[0] = "...";  // RULER: the top-ranked word is noise ("Please ignore the dots")
    const uint64_t shuffle = rng();
    TaskSample s = base_sample(seed, "string_match_all", kFweMaxNewTokens);
    s.preamble = kFweInstruction;
    s.postamble = "\n";
    s.question = kFweQuestion;
    s.answer_prefix = kFweAnswerPrefix;
    s.answers = {vocab[1], vocab[2], vocab[3]};
    const std::string rest = s.postamble + s.question + s.answer_prefix;
    auto f = [&](int64_t n) {
      return prompt_count(s.preamble, fwe_text(vocab, n, 0, shuffle), rest);
    };
    // One more word in n can add several words at once (their floors step together), tens of
    // tokens: so n stays at or under the target and the noise word "..." fills the rest.
    const int64_t n = search_units(1, 1 << 26, budget_, true, f);
    auto g = [&](int64_t dots) {
      return prompt_count(s.preamble, fwe_text(vocab, n, dots, shuffle), rest);
    };
    const int64_t dots = search_units(0, 1 << 26, budget_, false, g);
    std::vector<int64_t> counts;
    s.context = fwe_text(vocab, n, dots, shuffle, &counts);
    s.context_tokens = counter_.count(s.context);
    const int64_t fourth = counts.size() > 4 ? counts[4] : 0;
    KVB_CHECK(counts[1] > counts[2] && counts[2] > counts[3] && counts[3] > fourth,
              "task 'fwe': ", "target_tokens ", spec_.target_tokens,
              " is too short for three distinct top frequencies (counts ", counts[1], ", ",
              counts[2], ", ", counts[3], ", ", fourth, ")");
    return s;
  }

  // ---- copy: a long answer ----

  // The context is a list of nouns (no word twice in a row; each distinct while the noun list
  // lasts) that fills the target length, padded with dots to within a token; the answer is the
  // whole list, scored in order (ordered_word_recall), so the answer is about as long as the
  // context and a method that compresses while decoding is measured on what it keeps.
  TaskSample copy(uint64_t seed) {
    std::mt19937_64 rng(seed);
    const auto& nouns = key_nouns();
    std::vector<std::string> words;
    std::vector<size_t> order(nouns.size());
    auto draw = [&](size_t n) {
      while (words.size() < n) {
        std::iota(order.begin(), order.end(), size_t{0});
        for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[uniform_index(rng, i)]);
        for (size_t i : order) {
          if (words.size() >= n) break;
          if (!words.empty() && words.back() == nouns[i]) continue;
          words.push_back(nouns[i]);
        }
      }
    };
    auto list = [&](int64_t n, int64_t dots) {
      draw(static_cast<size_t>(n));
      std::string t;
      for (int64_t i = 0; i < n; ++i) t += (i ? " " : "") + words[static_cast<size_t>(i)];
      return t + "." + std::string(static_cast<size_t>(dots), '.');
    };
    TaskSample s = base_sample(seed, "ordered_word_recall", 0);
    s.preamble = kCopyInstruction;
    s.postamble = "\n";
    s.question = kCopyQuestion;
    s.answer_prefix = kCopyAnswerPrefix;
    const std::string rest = s.postamble + s.question + s.answer_prefix;
    const int64_t n = search_units(1, 1 << 24, budget_, true,
                                   [&](int64_t k) { return prompt_count(s.preamble, list(k, 0), rest); });
    const int64_t dots = search_units(0, 64, budget_, false,
                                      [&](int64_t d) { return prompt_count(s.preamble, list(n, d), rest); });
    s.context = list(n, dots);
    std::string answer;
    for (int64_t i = 0; i < n; ++i) answer += (i ? " " : "") + words[static_cast<size_t>(i)];
    s.answers = {answer};
    s.context_tokens = counter_.count(s.context);
    // Room for the whole list and its full stop, plus a little.
    s.max_new_tokens = counter_.count(" " + answer) + 16;
    s.multiline_answer = true;  // a model may put the list on the line after a lead-in
    return s;
  }

  TokenCounter counter_;
  const TaskSpec& spec_;
  const TaskDef& def_;
  std::shared_ptr<const Corpus> corpus_;
  std::vector<std::string_view> words_;
  std::vector<size_t> sentence_starts_;
  int64_t budget_ = 0, tol_ = 0;
  json effective_ = json::object();

  NiahParams niah_;
  int vt_chains_ = 1, vt_hops_ = 4;
  bool vt_few_shot_ = true;
  CweParams cwe_;
  std::vector<std::string_view> cwe_vocab_;
  double fwe_alpha_ = 2.0;
  int fwe_wordlen_ = 6, fwe_vocab_ = 0;
  std::vector<double> fwe_weights_;
  int passkey_digits_ = 5;
};

// ---------------------------------------------------------------------------------------------
// Hashing and JSON.

std::string sample_hash(const TaskSample& s) {
  json j = sample_to_json(s);
  j.erase("hash");
  return sha256_hex(j.dump());
}

std::string set_hash(const TaskSpec& resolved, const std::string& tokenizer_sha,
                     const std::string& corpus_sha) {
  const json j = {{"generator", kSyntheticGeneratorVersion},
                  {"spec", task_spec_to_json(resolved)},
                  {"tokenizer_sha256", tokenizer_sha},
                  {"corpus_sha256", corpus_sha}};
  return sha256_hex(j.dump());
}

std::string content_hash(const std::vector<TaskSample>& samples) {
  std::string all;
  for (const auto& s : samples) all += s.hash + "\n";
  return sha256_hex(all);
}

std::shared_ptr<const Corpus> corpus_for(const TaskSpec& resolved) {
  if (resolved.corpus.empty()) return nullptr;
  const std::string dir = resolved.data_dir.empty() ? resolve_data_dir("") : resolved.data_dir;
  return load_corpus(resolved.corpus, dir);
}

template <typename T>
T field(const json& j, const char* key, const std::string& source) {
  KVB_CHECK(j.is_object() && j.contains(key), source, ": missing field '", key, "'");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    KVB_FAIL(source, ": field '", key, "' has the wrong type: ", j.at(key).dump().substr(0, 80));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API.

const std::vector<std::string>& synthetic_task_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> v;
    for (const auto& d : task_defs()) v.emplace_back(d.name);
    return v;
  }();
  return kNames;
}

std::vector<std::string> task_param_names(const std::string& task) {
  std::vector<std::string> names;
  for (const auto& p : param_specs(find_task(task))) names.push_back(p.name);
  return names;
}

std::vector<ParamSpec> task_param_specs(const std::string& task) {
  return param_specs(find_task(task));
}

TaskSpec task_spec_from_json(const json& j) {
  KVB_CHECK(j.is_object(), "task spec must be a JSON object, got ", j.dump().substr(0, 80));
  static const std::vector<std::string> kKeys = {
      "task", "target_tokens", "num_samples", "seed", "depth", "corpus", "params", "data_dir"};
  for (const auto& [k, v] : j.items())
    KVB_CHECK(std::find(kKeys.begin(), kKeys.end(), k) != kKeys.end(), "task spec: unknown key '",
              k, "'", did_you_mean(k, kKeys), "; allowed: ", join(kKeys, ", "));
  TaskSpec s;
  const std::string src = "task spec";
  s.task = field<std::string>(j, "task", src);
  s.target_tokens = field<int64_t>(j, "target_tokens", src);
  if (j.contains("num_samples")) s.num_samples = field<int64_t>(j, "num_samples", src);
  if (j.contains("seed")) {
    const json& seed = j.at("seed");
    KVB_CHECK(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0),
              "task spec: 'seed' must be a non-negative integer, got ", seed.dump());
    s.seed = seed.get<uint64_t>();
  }
  if (j.contains("depth") && !j.at("depth").is_null()) {
    const json& d = j.at("depth");
    if (d.is_string()) {
      KVB_CHECK(d.get<std::string>() == "sweep", "task spec: 'depth' must be a number, a list of ",
                "numbers or \"sweep\", got ", d.dump());
      for (int i = 0; i <= 10; ++i) s.depths.push_back(i / 10.0);
    } else if (d.is_number()) {
      s.depths.push_back(d.get<double>());
    } else {
      KVB_CHECK(d.is_array(), "task spec: 'depth' must be a number, a list of numbers or ",
                "\"sweep\", got ", d.dump());
      for (const auto& x : d) {
        KVB_CHECK(x.is_number(), "task spec: 'depth' list holds a non-number: ", x.dump());
        s.depths.push_back(x.get<double>());
      }
    }
  }
  if (j.contains("corpus")) s.corpus = field<std::string>(j, "corpus", src);
  if (j.contains("data_dir")) s.data_dir = field<std::string>(j, "data_dir", src);
  if (j.contains("params")) {
    KVB_CHECK(j.at("params").is_object(), "task spec: 'params' must be an object, got ",
              j.at("params").dump());
    s.params = j.at("params");
  }
  return s;
}

TaskSpec resolve_task_spec(const TaskSpec& spec) {
  const TaskDef& def = find_task(spec.task);
  const std::string& t = spec.task;
  TaskSpec r = spec;
  KVB_CHECK(spec.target_tokens >= 64 && spec.target_tokens <= (int64_t{1} << 24), "task '", t,
            "': target_tokens ", spec.target_tokens, " is outside [64, 16777216]");
  KVB_CHECK(spec.num_samples >= 1 && spec.num_samples <= 1000000, "task '", t, "': num_samples ",
            spec.num_samples, " is outside [1, 1000000]");
  const bool needle_task = def.kind == Kind::kNiah || def.kind == Kind::kPasskey;
  KVB_CHECK(needle_task || spec.depths.empty(), "task '", t,
            "' has no needle, so it takes no depth (needle tasks: niah_*, passkey)");
  for (double d : spec.depths)
    KVB_CHECK(std::isfinite(d) && d >= 0 && d <= 1, "task '", t, "': depth ", d,
              " is outside [0, 1]");

  KVB_CHECK(spec.params.is_object(), "task '", t, "': params must be an object");
  json p = resolve_params(param_specs(def), spec.params, "task " + t);
  // RULER: num_needle_k = max(num_needle_k, num_needle_q).
  if (def.kind == Kind::kNiah)
    p["num_keys"] = std::max(p["num_keys"].get<int64_t>(), p["num_queries"].get<int64_t>());
  r.params = p;
  if (uses_corpus(def.kind, p)) {
    if (r.corpus.empty()) r.corpus = kDefaultTaskCorpus;
  } else {
    r.corpus.clear();  // a grid may set one corpus for every task; it means nothing here
  }
  return r;
}

json task_spec_to_json(const TaskSpec& r) {
  json depths = json::array();
  for (double d : r.depths) depths.push_back(d);
  return {{"task", r.task},
          {"target_tokens", r.target_tokens},
          {"num_samples", r.num_samples},
          {"seed", r.seed},
          {"depths", depths},
          {"corpus", r.corpus},
          {"params", r.params}};
}

std::string tokenizer_fingerprint(const Tokenizer& tokenizer) {
  if (file_exists(tokenizer.path())) return sha256_file_hex(tokenizer.path());
  Sha256 h;
  for (int64_t i = 0; i < tokenizer.vocab_size(); ++i) {
    h.update(tokenizer.piece(i));
    h.update(std::string_view("\0", 1));
  }
  h.update("|" + std::to_string(tokenizer.bos_id()) + "|" + std::to_string(tokenizer.eos_id()) +
           "|" + std::to_string(tokenizer.unk_id()));
  return "vocab:" + h.hex_digest();
}

std::string task_set_hash(const Tokenizer& tokenizer, const TaskSpec& spec) {
  const TaskSpec r = resolve_task_spec(spec);
  const auto corpus = corpus_for(r);
  return set_hash(r, tokenizer_fingerprint(tokenizer), corpus ? corpus->sha256 : "");
}

SampleSet generate_task(const Tokenizer& tokenizer, const TaskSpec& spec) {
  SampleSet set;
  set.spec = resolve_task_spec(spec);
  const auto corpus = corpus_for(set.spec);
  set.tokenizer_sha256 = tokenizer_fingerprint(tokenizer);
  set.corpus_sha256 = corpus ? corpus->sha256 : "";
  set.hash = set_hash(set.spec, set.tokenizer_sha256, set.corpus_sha256);

  Generator gen(tokenizer, set.spec, corpus);
  set.effective_params = gen.effective_params();
  std::vector<std::optional<double>> depths;
  for (double d : set.spec.depths) depths.emplace_back(d);
  if (depths.empty()) depths.emplace_back(std::nullopt);
  for (const auto& d : depths) {
    for (int64_t i = 0; i < set.spec.num_samples; ++i) {
      TaskSample s = gen.make(d, sample_seed(set.spec.seed, i));
      s.index = static_cast<int64_t>(set.samples.size());
      s.hash = sample_hash(s);
      set.samples.push_back(std::move(s));
    }
  }
  set.content_hash = content_hash(set.samples);
  return set;
}

json sample_to_json(const TaskSample& s) {
  json j = {{"index", s.index},
          {"task", s.task},
          {"seed", s.seed},
          {"preamble", s.preamble},
          {"context", s.context},
          {"postamble", s.postamble},
          {"question", s.question},
          {"answer_prefix", s.answer_prefix},
          {"answers", s.answers},
          {"metric", s.metric},
          {"max_new_tokens", s.max_new_tokens},
          {"depth", s.depth ? json(*s.depth) : json(nullptr)},
          {"needle", s.needle},
          {"needle_token_offset", s.needle_token_offset},
          {"needle_tokens", s.needle_tokens},
          {"context_tokens", s.context_tokens},
          {"target_tokens", s.target_tokens},
          {"actual_tokens", s.actual_tokens},
          {"hash", s.hash}};
  // Written only when set, so the samples of the single-line tasks keep their hashes.
  if (s.multiline_answer) j["multiline_answer"] = true;
  return j;
}

TaskSample sample_from_json(const json& j, const std::string& src) {
  TaskSample s;
  s.index = field<int64_t>(j, "index", src);
  s.task = field<std::string>(j, "task", src);
  s.seed = field<uint64_t>(j, "seed", src);
  s.preamble = field<std::string>(j, "preamble", src);
  s.context = field<std::string>(j, "context", src);
  s.postamble = field<std::string>(j, "postamble", src);
  s.question = field<std::string>(j, "question", src);
  s.answer_prefix = field<std::string>(j, "answer_prefix", src);
  s.answers = field<std::vector<std::string>>(j, "answers", src);
  s.metric = field<std::string>(j, "metric", src);
  s.max_new_tokens = field<int64_t>(j, "max_new_tokens", src);
  KVB_CHECK(j.contains("depth"), src, ": missing field 'depth'");
  if (!j.at("depth").is_null()) s.depth = field<double>(j, "depth", src);
  s.needle = field<std::string>(j, "needle", src);
  s.needle_token_offset = field<int64_t>(j, "needle_token_offset", src);
  s.needle_tokens = field<int64_t>(j, "needle_tokens", src);
  s.context_tokens = field<int64_t>(j, "context_tokens", src);
  s.target_tokens = field<int64_t>(j, "target_tokens", src);
  s.actual_tokens = field<int64_t>(j, "actual_tokens", src);
  s.hash = field<std::string>(j, "hash", src);
  s.multiline_answer = j.value("multiline_answer", false);
  return s;
}

json sample_set_to_json(const SampleSet& set) {
  json samples = json::array();
  for (const auto& s : set.samples) samples.push_back(sample_to_json(s));
  json spec = task_spec_to_json(set.spec);
  return {{"format", "kvbench-synthetic-set"},
          {"generator", kSyntheticGeneratorVersion},
          {"hash", set.hash},
          {"content_hash", set.content_hash},
          {"spec", spec},
          {"tokenizer_sha256", set.tokenizer_sha256},
          {"corpus_sha256", set.corpus_sha256},
          {"effective_params", set.effective_params},
          {"samples", samples}};
}

SampleSet sample_set_from_json(const json& j, const std::string& src) {
  KVB_CHECK(field<std::string>(j, "format", src) == "kvbench-synthetic-set", src,
            ": not a kvbench synthetic task set");
  SampleSet set;
  const json& spec = j.at("spec");
  set.spec.task = field<std::string>(spec, "task", src + " spec");
  set.spec.target_tokens = field<int64_t>(spec, "target_tokens", src + " spec");
  set.spec.num_samples = field<int64_t>(spec, "num_samples", src + " spec");
  set.spec.seed = field<uint64_t>(spec, "seed", src + " spec");
  set.spec.depths = field<std::vector<double>>(spec, "depths", src + " spec");
  set.spec.corpus = field<std::string>(spec, "corpus", src + " spec");
  set.spec.params = field<json>(spec, "params", src + " spec");
  set.hash = field<std::string>(j, "hash", src);
  set.content_hash = field<std::string>(j, "content_hash", src);
  set.tokenizer_sha256 = field<std::string>(j, "tokenizer_sha256", src);
  set.corpus_sha256 = field<std::string>(j, "corpus_sha256", src);
  set.effective_params = field<json>(j, "effective_params", src);
  const json& samples = j.at("samples");
  KVB_CHECK(samples.is_array(), src, ": 'samples' must be an array");
  for (size_t i = 0; i < samples.size(); ++i)
    set.samples.push_back(sample_from_json(samples[i], src + " sample " + std::to_string(i)));
  return set;
}

SampleSet generate_task_cached(const Tokenizer& tokenizer, const TaskSpec& spec,
                               const std::string& cache_dir) {
  KVB_CHECK(!cache_dir.empty(), "task cache directory is empty");
  const TaskSpec resolved = resolve_task_spec(spec);
  const std::string hash = task_set_hash(tokenizer, resolved);
  const std::string path = cache_dir + "/" + hash + ".json";
  if (file_exists(path)) {
    try {
      SampleSet set = sample_set_from_json(parse_json(read_text_file(path), path), path);
      bool ok = set.hash == hash && content_hash(set.samples) == set.content_hash;
      for (const auto& s : set.samples) ok = ok && sample_hash(s) == s.hash;
      if (ok) {
        set.spec.data_dir = resolved.data_dir;
        return set;
      }
    } catch (const std::exception&) {
      // A truncated or foreign file: regenerate below and replace it.
    }
  }
  SampleSet set = generate_task(tokenizer, resolved);
  if (!dir_exists(cache_dir)) {
    // mkdir -p, one level at a time.
    for (size_t pos = 1; pos <= cache_dir.size(); ++pos) {
      if (pos == cache_dir.size() || cache_dir[pos] == '/') {
        const std::string part = cache_dir.substr(0, pos);
        if (!dir_exists(part))
          KVB_CHECK(::mkdir(part.c_str(), 0755) == 0 || errno == EEXIST,
                    "cannot create task cache directory ", part, ": ", std::strerror(errno));
      }
    }
  }
  // Written whole or not at all: a killed run or a full disk never leaves a half-written cache
  // file.
  write_file_atomically(path, sample_set_to_json(set).dump());
  return set;
}

}  // namespace kvb
