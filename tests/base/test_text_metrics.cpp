// Text metrics against hand-computed values of the reference implementations (LongBench metrics.py,
// RULER evaluate.py, pltrdy/rouge 1.0.1, fuzzywuzzy + python-Levenshtein).

#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/metrics/metric_table.h"
#include "harness/metrics/text_metrics.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

using test::expect_error;

TEST(TextMetricsNormalize, SquadRules) {
  EXPECT_EQ(normalize_answer("The Cat!"), "cat");
  EXPECT_EQ(normalize_answer("  An apple, a banana and THE pear. "), "apple banana and pear");
  EXPECT_EQ(normalize_answer("theater"), "theater");  // no word boundary after "the"
  EXPECT_EQ(normalize_answer("A.N. Other"),
            "other");  // punctuation goes first, then "an" is an article
  EXPECT_EQ(normalize_answer("don't  stop\t\nme"), "dont stop me");
  EXPECT_EQ(normalize_answer("the_end"), "theend");  // '_' is in string.punctuation
  EXPECT_EQ(normalize_answer("a a a"), "");
  EXPECT_EQ(normalize_answer(""), "");
  // All 32 ASCII punctuation characters go; non-ASCII bytes are kept.
  EXPECT_EQ(normalize_answer("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~x"), "x");
  EXPECT_EQ(normalize_answer("caf\xC3\xA9 the"), "caf\xC3\xA9");
}

TEST(TextMetricsExactMatch, NormalizedEquality) {
  EXPECT_EQ(exact_match("The answer is 42.", "answer is 42"), 1.0);
  EXPECT_EQ(exact_match("42", "forty-two"), 0.0);
  EXPECT_EQ(exact_match("", "the"), 1.0);  // both normalize to ""
  EXPECT_EQ(exact_match("", "x"), 0.0);
  EXPECT_EQ(score_answer("exact_match", "Paris.", {"London", "paris"}), 1.0);
}

TEST(TextMetricsStringMatch, RulerAllAndPart) {
  std::vector<std::string> refs = {"123", "456", "789"};
  EXPECT_DOUBLE_EQ(string_match_all("The keys are 123 and 456", refs), 2.0 / 3.0);
  EXPECT_EQ(string_match_part("The keys are 123 and 456", refs), 1.0);
  EXPECT_EQ(string_match_part("none of them", refs), 0.0);
  EXPECT_EQ(string_match_all("", refs), 0.0);
  // Case-insensitive both ways; plain substring (no word boundaries, no punctuation stripping).
  EXPECT_EQ(string_match_all("the magic KEYS: Apple-Pie", {"keys", "apple-pie"}), 1.0);
  EXPECT_EQ(string_match_all("pineapple", {"apple"}), 1.0);
  EXPECT_EQ(string_match_all("apple pie", {"apple-pie"}), 0.0);
  expect_error([] { string_match_all("x", {}); }, {"no reference"});
  EXPECT_DOUBLE_EQ(score_answer("string_match_all", "a 1 2", {"1", "2", "3", "4"}), 0.5);
  EXPECT_EQ(score_answer("string_match_part", "a 1 2", {"9", "2"}), 1.0);
}

TEST(TextMetricsOrderedRecall, LongestCommonSubsequenceOfWords) {
  EXPECT_DOUBLE_EQ(ordered_word_recall("a list: bear, cat dog.", "bear cat dog"), 1.0);
  // Order counts: "dog cat" recovers one of the two in order.
  EXPECT_DOUBLE_EQ(ordered_word_recall("dog bear", "bear dog cat"), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(ordered_word_recall("bear x cat y dog", "bear cat dog fish"), 0.75);
  EXPECT_DOUBLE_EQ(ordered_word_recall("", "bear cat"), 0.0);
  EXPECT_DOUBLE_EQ(ordered_word_recall("bear bear bear", "bear cat bear"), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(score_answer("ordered_word_recall", "Cat Dog", {"cat dog", "dog"}), 1.0);
}

TEST(TextMetricsQaF1, TokenOverlap) {
  // pred "cat sat on mat" (4 tokens) vs ref "cat on mat" (3): overlap 3, P = 3/4, R = 1.
  EXPECT_NEAR(qa_f1("The cat sat on the mat.", "a cat on a mat"), 2 * 0.75 / 1.75, 1e-12);
  // Multiset overlap: "paris" counted once. P = 1/3, R = 1 -> F1 = 0.5.
  EXPECT_NEAR(qa_f1("Paris paris PARIS", "Paris"), 0.5, 1e-12);
  EXPECT_EQ(qa_f1("", "Paris"), 0.0);
  EXPECT_EQ(qa_f1("the", "a"), 0.0);  // both empty after normalization: LongBench gives 0
  EXPECT_EQ(qa_f1("London", "Paris"), 0.0);
  EXPECT_EQ(qa_f1("Paris!", "paris"), 1.0);
  // Max over references.
  EXPECT_EQ(score_answer("qa_f1", "paris", {"London", "Paris"}), 1.0);
  EXPECT_NEAR(score_answer("qa_f1", "big red ball", {"red", "small ball"}), 0.5, 1e-12);
}

TEST(TextMetricsRougeL, PackageVariant) {
  // One sentence each. Distinct words: ref {the,cat,is,on,mat} m = 5, pred {the,cat,sat,on,mat}
  // n = 5; LCS "the cat on the mat" has 4 distinct words -> R = P = 0.8. (Textbook token ROUGE-L
  // would give 5/6.)
  EXPECT_NEAR(rouge_l("the cat sat on the mat", "the cat is on the mat"), 0.8, 1e-7);
  // Sentences split at '.': union LCS {cat, ran, the, sat, dog} = 5, m = 6, n = 5 -> F = 10/11.
  EXPECT_NEAR(rouge_l("the cat sat. the dog ran", "a cat ran. the dog sat"), 10.0 / 11.0, 1e-7);
  // The package's backtracking picks "b" for ("a b", "b a"), so the union over both prediction
  // sentences is {b}: m = n = 2 -> F = 0.5 (another LCS choice would give 1).
  EXPECT_NEAR(rouge_l("b a. b", "a b"), 0.5, 1e-7);
  // A whitespace-only sentence is one empty word: n = |{a, ""}| = 2, overlap 1 -> P = 0.5, R = 1.
  EXPECT_NEAR(rouge_l("a. .", "a"), 2.0 / 3.0, 1e-7);
  EXPECT_NEAR(rouge_l("Hello world.", "Hello world"), 1.0, 1e-7);
  EXPECT_NEAR(rouge_l("a a a", "a"), 1.0, 1e-7);
  EXPECT_EQ(rouge_l("Hello", "hello"), 0.0);  // case-sensitive, as LongBench calls it
  EXPECT_EQ(rouge_l("", "a b"), 0.0);
  EXPECT_EQ(rouge_l("...", "a b"), 0.0);
  EXPECT_EQ(rouge_l("a b", ""), 0.0);
  EXPECT_NEAR(score_answer("rouge_l", "x y", {"q", "x y"}), 1.0, 1e-7);
}

TEST(TextMetricsClassification, LongBenchRule) {
  std::vector<std::string> classes = {"cat", "dog", "bird"};
  EXPECT_EQ(classification("It is a dog", "dog", classes), 1.0);
  EXPECT_EQ(classification("dog or cat", "dog", classes), 0.5);
  EXPECT_EQ(classification("bird", "dog", classes), 0.0);
  EXPECT_EQ(classification("", "dog", classes), 0.0);
  // A matched class that is a proper substring of the truth is dropped.
  EXPECT_EQ(classification("the capital city", "capital city", {"city", "capital city"}), 1.0);
  // ...but the reference loop skips the element after each removal: "big" is removed, "cat" is
  // never examined, so matches = [cat, big cat] and the score is 1/2.
  EXPECT_EQ(classification("big cat", "big cat", {"big", "cat", "big cat"}), 0.5);
  expect_error([] { classification("x", "y", {}); }, {"all_classes"});
  EXPECT_EQ(score_answer("classification", "It is a bird", {"bird"}, classes), 1.0);
}

TEST(TextMetricsRetrieval, ParagraphNumber) {
  EXPECT_EQ(retrieval("The answer is Paragraph 12", "Paragraph 12"), 1.0);
  EXPECT_EQ(retrieval("Paragraph 3 and Paragraph 12", "Paragraph 12"), 0.5);
  EXPECT_EQ(retrieval("I don't know", "Paragraph 12"), 0.0);
  EXPECT_EQ(retrieval("Paragraph 120", "Paragraph 12"), 0.0);
  EXPECT_EQ(retrieval("\xE6\xAE\xB5\xE8\x90\xBD"
                      "5",
                      "\xE6\xAE\xB5\xE8\x90\xBD"
                      "5"),
            1.0);
  expect_error([] { retrieval("1", "no number here"); }, {"Paragraph N", "no number here"});
}

TEST(TextMetricsCount, DigitRuns) {
  EXPECT_EQ(count("There are 7 unique paragraphs", "7"), 1.0);
  EXPECT_EQ(count("7 or 8", "7"), 0.5);
  EXPECT_EQ(count("07", "7"), 0.0);  // string comparison, as the reference
  EXPECT_EQ(count("", "7"), 0.0);
  EXPECT_EQ(count("12a7b7", "7"), 2.0 / 3.0);
}

TEST(TextMetricsCodeSim, FirstCodeLineFuzzRatio) {
  EXPECT_EQ(code_sim("```python\n# comment\nx = foo(1)\nmore", "x = foo(1)"), 1.0);
  // LCS 10 of 12 + 10 characters: 100 x 20/22 = 90.9 -> 91.
  EXPECT_DOUBLE_EQ(code_sim("\n\nreturn a + b", "return a+b"), 0.91);
  EXPECT_EQ(code_sim("// only\n# comments", "x"), 0.0);
  EXPECT_EQ(code_sim("", ""), 1.0);  // fuzz.ratio: equal strings are 100
  EXPECT_EQ(code_sim("", "x"), 0.0);
  // Python's round() is half-to-even: 100 x 2/16 = 12.5 -> 12; 100 x 6/16 = 37.5 -> 38.
  EXPECT_DOUBLE_EQ(code_sim("a", "abcdefghijklmno"), 0.12);
  EXPECT_DOUBLE_EQ(code_sim("abc", "abcdefghijklm"), 0.38);
}

TEST(TextMetricsCodeSim, IndelRatio) {
  EXPECT_NEAR(indel_ratio("kitten", "sitting"), 8.0 / 13.0, 1e-12);  // python-Levenshtein: 0.615
  EXPECT_EQ(indel_ratio("", ""), 1.0);
  EXPECT_EQ(indel_ratio("abc", ""), 0.0);
  EXPECT_NEAR(indel_ratio("caf\xC3\xA9", "cafe"), 0.75, 1e-12);  // code points, not bytes
  EXPECT_EQ(indel_ratio("\xFF", "\xFF"), 1.0);                   // invalid UTF-8 does not crash
}

TEST(TextMetricsFirstLine, LongBenchRule) {
  EXPECT_EQ(first_line("\n\nfoo\nbar"), "foo");
  EXPECT_EQ(first_line("foo"), "foo");
  EXPECT_EQ(first_line("\n\n"), "");
  EXPECT_EQ(first_line(" \nfoo"), " ");
}

TEST(TextMetricsRegistry, NamesAndErrors) {
  EXPECT_EQ(text_metric_names().size(), 10u);
  for (const auto& name : text_metric_names()) {
    EXPECT_TRUE(is_text_metric(name));
    // Every text metric is in the metric table as a higher-is-better fraction.
    EXPECT_EQ(metric_info(name).unit, "fraction") << name;
    EXPECT_EQ(metric_info(name).direction, "higher") << name;
  }
  EXPECT_FALSE(is_text_metric("qa_f2"));
  expect_error([] { score_answer("qa_f2", "x", {"x"}); }, {"qa_f2", "did you mean 'qa_f1'"});
  expect_error([] { score_answer("qa_f1", "x", {}); }, {"qa_f1", "no reference"});
}

}  // namespace
}  // namespace kvb
