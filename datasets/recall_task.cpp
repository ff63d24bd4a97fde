#include "datasets/recall_task.h"

#include <cctype>

#include "harness/common/error.h"
#include "harness/common/sha256.h"

namespace kvb {

namespace {

std::vector<std::string> split_paragraphs(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  size_t i = 0;
  while (i < text.size()) {
    const size_t nl = text.find('\n', i);
    const std::string line = text.substr(i, nl == std::string::npos ? std::string::npos : nl - i);
    i = nl == std::string::npos ? text.size() : nl + 1;
    bool blank = line.find_first_not_of(" \t\r") == std::string::npos;
    if (blank) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      if (!cur.empty()) cur += ' ';
      cur += line;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Sentences ending in '.', '!' or '?' (quotes and all), trimmed.
std::vector<std::string> split_sentences(const std::string& p) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < p.size(); ++i) {
    cur += p[i];
    const bool end = p[i] == '.' || p[i] == '!' || p[i] == '?';
    if (end && (i + 1 == p.size() || p[i + 1] == ' ')) {
      const size_t a = cur.find_first_not_of(' ');
      if (a != std::string::npos) out.push_back(cur.substr(a));
      cur.clear();
    }
  }
  return out;
}

}  // namespace

std::vector<RecallSample> make_recall_samples(const std::string& corpus_text, int64_t num_samples,
                                              int64_t questions_per_story, int64_t min_sentences,
                                              int64_t skip_stories) {
  KVB_CHECK(num_samples >= 1 && questions_per_story >= 1 && min_sentences >= 2,
            "recall task: num_samples, questions_per_story >= 1 and min_sentences >= 2");
  std::vector<RecallSample> out;
  int64_t seen = 0;
  for (const auto& para : split_paragraphs(corpus_text)) {
    if (static_cast<int64_t>(out.size()) >= num_samples) break;
    const auto sents = split_sentences(para);
    if (static_cast<int64_t>(sents.size()) < min_sentences) continue;
    if (seen++ < skip_stories) continue;
    RecallSample s;
    s.index = static_cast<int64_t>(out.size());
    s.context = para + "\n";
    for (size_t k = 0; k < sents.size() && static_cast<int64_t>(s.questions.size()) < questions_per_story; ++k) {
      const std::string& t = sents[k];
      if (t.back() != '.') continue;
      const size_t sp = t.find_last_of(' ');
      if (sp == std::string::npos) continue;
      const std::string word = t.substr(sp + 1, t.size() - sp - 2);
      bool alpha = !word.empty();
      for (char c : word) alpha = alpha && std::isalpha(static_cast<unsigned char>(c));
      int64_t words = 1;
      for (char c : t) words += c == ' ';
      if (!alpha || words < 5) continue;
      s.questions.push_back({t.substr(0, sp), word, static_cast<int64_t>(k)});
    }
    if (s.questions.empty()) continue;
    std::string h = s.context;
    for (const auto& q : s.questions) h += "\x1f" + q.question + "\x1e" + q.answer;
    s.hash = sha256_hex(h);
    out.push_back(std::move(s));
  }
  KVB_CHECK(!out.empty(), "recall task: no story in the corpus has ", min_sentences,
            " sentences with an eligible question");
  return out;
}

}  // namespace kvb
