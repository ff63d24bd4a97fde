#pragma once
// A recall task small models can do: "story recall". The context is a real story; each question
// repeats one of its sentences without the last word, and the answer is that word. A model that attends
// to the context copies it; a cache that lost that part of the context has to guess. stories260K (no
// long-range retrieval) manages it, so the `qa` protocol is checked end to end on it. Torch-free.

#include <cstdint>
#include <string>
#include <vector>

namespace kvb {

struct RecallQuestion {
  std::string question;  // the sentence up to (and without) its last word
  std::string answer;    // the last word
  int64_t sentence_index = 0;
};

struct RecallSample {
  int64_t index = 0;
  std::string context;  // the story, then "\n"
  std::vector<RecallQuestion> questions;
  std::string hash;     // sha256 of context and questions
};

// Stories are the corpus's blank-line-separated paragraphs with at least `min_sentences` sentences;
// each gets up to `questions_per_story` questions on its earliest eligible sentences (ending in an
// alphabetic word and a period, at least 5 words), so the needed span is far from the question.
// Deterministic: the same text and settings give the same samples.
std::vector<RecallSample> make_recall_samples(const std::string& corpus_text, int64_t num_samples,
                                              int64_t questions_per_story, int64_t min_sentences,
                                              int64_t skip_stories);

}  // namespace kvb
