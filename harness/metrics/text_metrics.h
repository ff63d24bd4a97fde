#pragma once
// Task metrics of RULER and LongBench v1, re-implemented to give the scores their reference code
// gives, so that kvbench numbers can be set beside published ones. Every function returns a value
// in [0, 1] (the references print 100 x the mean over samples).
//
// Reference behaviour followed (the per-function comments say where we differ):
//  - LongBench v1 `metrics.py` + `eval.py` (THUDM/LongBench): qa_f1_score, rouge_score,
//  classification_
//    score, retrieval_score, count_score, code_sim_score, normalize_answer; a sample's score is the
//    max over its reference answers.
//  - RULER `evaluate.py` (NVIDIA/RULER): string_match_all / string_match_part.
//
// Text is treated as UTF-8 bytes. Lowercasing, punctuation, digits and whitespace are the ASCII
// sets; Python's str methods also act on non-ASCII letters, digits and spaces. For English tasks
// the two agree; for the Chinese LongBench tasks (which use jieba in the reference) the scores are
// not comparable.

#include <string>
#include <string_view>
#include <vector>

namespace kvb {

// SQuAD/LongBench normalize_answer: lowercase, drop ASCII punctuation (Python string.punctuation),
// replace the words a/an/the by a space, collapse whitespace runs to one space, trim.
std::string normalize_answer(std::string_view s);

// 1 when normalize_answer(prediction) == normalize_answer(reference), else 0.
double exact_match(std::string_view prediction, std::string_view reference);

// The longest common subsequence of the prediction's and the reference's words (both
// normalize_answer'd) over the reference's word count: how much of a list came back in order.
double ordered_word_recall(std::string_view prediction, std::string_view reference);

// RULER string_match_all: the fraction of references that occur, case-insensitively, as substrings
// of the prediction. RULER string_match_part: 1 when any reference occurs (the max). Empty
// references throw kvb::Error.
double string_match_all(std::string_view prediction, const std::vector<std::string>& references);
double string_match_part(std::string_view prediction, const std::vector<std::string>& references);

// LongBench qa_f1_score: token F1 between the normalize_answer'ed, whitespace-split prediction and
// reference (multiset overlap). 0 when there is no overlap, including when either side is empty.
double qa_f1(std::string_view prediction, std::string_view reference);

// LongBench rouge_score = the `rouge` PyPI package (pltrdy/rouge 1.0.1) `Rouge().get_scores(pred,
// ref)
// ["rouge-l"]["f"]`, with its defaults. That variant is *not* textbook ROUGE-L:
//  - both texts are split into "sentences" at every '.', empty pieces dropped, whitespace
//  collapsed,
//    and the words are the pieces split on ' ' (a whitespace-only sentence is one empty word);
//  - summary-level union-LCS with exclusive=True: the LCS of each (reference sentence, prediction
//    sentence) pair is reconstructed by the package's backtracking, and the overlap is the number
//    of *distinct* words in the union of those LCS; m and n are the numbers of *distinct* words of
//    the reference and of the prediction;
//  - R = overlap/m, P = overlap/n, F = 2PR/(P+R+1e-8) (beta = 1).
// No lowercasing and no punctuation stripping (LongBench passes raw text). An empty prediction or
// reference (no non-empty sentence) scores 0, as LongBench's try/except makes it.
double rouge_l(std::string_view prediction, std::string_view reference);

// LongBench classification_score: the class names of all_classes that occur as substrings of the
// prediction are the matches; a match that is a substring of the reference but not equal to it is
// removed (replicating the reference's remove-while-iterating loop, which skips the element after
// each removal); the score is 1/len(matches) when the reference is among the matches, else 0. An
// empty all_classes throws kvb::Error.
double classification(std::string_view prediction, std::string_view reference,
                      const std::vector<std::string>& all_classes);

// LongBench retrieval_score (and retrieval_zh_score): the paragraph number of the reference
// ("Paragraph N", or "段落N" for the Chinese set) against every run of ASCII digits in the
// prediction: the fraction of those runs equal to N (0 when the prediction has none). A reference
// with no paragraph number throws kvb::Error (the reference raises IndexError).
double retrieval(std::string_view prediction, std::string_view reference);

// LongBench count_score: the fraction of ASCII digit runs in the prediction that equal the
// reference string exactly (0 when there are none).
double count(std::string_view prediction, std::string_view reference);

// LongBench code_sim_score: the first line of the prediction (after leading '\n's) that contains
// none of '`', '#', "//" (or "" when none), compared with the reference by fuzzywuzzy's fuzz.ratio
// / 100. fuzz.ratio: 100 when the strings are equal, 0 when either is empty, else round(100 x indel
// ratio) with Python's round-half-to-even. We use python-Levenshtein's ratio (what fuzzywuzzy uses
// when python-Levenshtein is installed; rapidfuzz's too): see indel_ratio. Without
// python-Levenshtein, fuzzywuzzy falls back to difflib's SequenceMatcher, which can differ by a few
// points.
double code_sim(std::string_view prediction, std::string_view reference);

// Indel similarity over Unicode code points: 2 x LCS(a, b) / (len(a) + len(b)), i.e. 1 - the edit
// distance with insertions and deletions only (a substitution costs 2) over the summed lengths.
// 1 when both are empty. Bytes that are not valid UTF-8 count as one code point each.
double indel_ratio(std::string_view a, std::string_view b);

// LongBench eval.py keeps only the first line for trec, triviaqa, samsum and lsht before scoring:
// prediction.lstrip('\n').split('\n')[0].
std::string first_line(std::string_view prediction);

// The text metrics by name: "exact_match", "string_match_all", "string_match_part", "qa_f1",
// "rouge_l", "classification", "retrieval", "count", "code_sim". The sample score: for
// string_match_all / string_match_part the functions above over all references; for the others the
// max over references (LongBench's scorer). all_classes is used by "classification" only.
// An unknown name throws kvb::Error with a nearest-name hint; no references throws kvb::Error.
double score_answer(std::string_view metric_name, std::string_view prediction,
                    const std::vector<std::string>& references,
                    const std::vector<std::string>& all_classes = {});

const std::vector<std::string>& text_metric_names();
bool is_text_metric(std::string_view name);

}  // namespace kvb
