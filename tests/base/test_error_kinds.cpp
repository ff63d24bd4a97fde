// The two kinds of failure (harness/common/error.h, internal_error.h) and how a program reports them
// (harness/common/exit_status.h): a user error exits 2 with "error:", a broken invariant exits 1 with
// "internal error in <component>", anything else exits 1 as an internal error too.

#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>
#include <string>

#include "harness/common/error.h"
#include "harness/common/exit_status.h"
#include "harness/common/internal_error.h"
#include "harness/common/text_escape.h"

namespace kvb {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Throws what `fn` throws and returns report_failure's status and line.
template <typename Fn>
std::pair<int, std::string> report(Fn&& fn) {
  std::ostringstream err;
  try {
    fn();
  } catch (...) {
    const int status = report_failure(std::current_exception(), "kvbench", err);
    return {status, err.str()};
  }
  ADD_FAILURE() << "nothing was thrown";
  return {0, ""};
}

int checked_layer(int layer) {
  KVB_ASSERT(layer >= 0 && layer < 4, "windowed_kv_cache", "layer ", layer, " out of range");
  return layer;
}

TEST(ErrorKinds, AssertThrowsAnInternalErrorNamingComponentConditionAndPlace) {
  EXPECT_EQ(checked_layer(2), 2);
  try {
    checked_layer(7);
    FAIL() << "KVB_ASSERT did not throw";
  } catch (const Error&) {
    FAIL() << "an internal error must not be a kvb::Error (user-error handlers would swallow it)";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.component(), "windowed_kv_cache");
    EXPECT_EQ(what.rfind("internal error in windowed_kv_cache: ", 0), 0u) << what;
    EXPECT_TRUE(contains(what, "layer >= 0 && layer < 4")) << what;  // the failed condition
    EXPECT_TRUE(contains(what, "layer 7 out of range")) << what;
    EXPECT_TRUE(contains(what, "test_error_kinds.cpp:")) << what;  // where it failed
  }
}

TEST(ErrorKinds, CheckAndFailStayUserErrors) {
  EXPECT_THROW(KVB_CHECK(1 + 1 == 3, "config key 'x': bad"), Error);
  EXPECT_NO_THROW(KVB_CHECK(1 + 1 == 2, "never built"));
  try {
    KVB_FAIL("--threads: ", -1, " is not a thread count");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--threads: -1 is not a thread count");
  }
  EXPECT_THROW(KVB_UNREACHABLE("engine", "no such state"), InternalError);
}

TEST(ExitStatus, UserErrorExitsTwoWithOneLineNamingTheInput) {
  auto [status, line] = report([] { KVB_CHECK(false, "config.json: unknown key 'windw'"); });
  EXPECT_EQ(status, 2);
  EXPECT_EQ(status, kExitUserError);
  EXPECT_EQ(line, "kvbench: error: config.json: unknown key 'windw'\n");
}

TEST(ExitStatus, InternalErrorExitsOneNamingTheComponent) {
  auto [status, line] = report([] { KVB_ASSERT(1 > 2, "results_db", "migrations out of order"); });
  EXPECT_EQ(status, 1);
  EXPECT_EQ(status, kExitInternalError);
  EXPECT_EQ(line.rfind("kvbench: internal error in results_db: ", 0), 0u) << line;
  EXPECT_TRUE(contains(line, "migrations out of order")) << line;
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;  // one line
}

TEST(ExitStatus, OtherExceptionsAreInternalErrors) {
  auto [status, line] = report([] { throw std::out_of_range("vector::at"); });
  EXPECT_EQ(status, 1);
  EXPECT_EQ(line, "kvbench: internal error: vector::at\n");
  auto [status2, line2] = report([] { throw 42; });
  EXPECT_EQ(status2, 1);
  EXPECT_TRUE(contains(line2, "internal error")) << line2;
}

TEST(ErrorMessages, InputsAreEscapedAndBoundedWhereverTheMessageIsBuilt) {
  // A NUL no longer ends the message, and control bytes (a terminal escape, a newline) are shown.
  const std::string name = std::string("run\0x", 5) + "\x1b[2J\nnext";
  auto [status, line] = report([&] { KVB_FAIL("unknown method '", name, "'"); });
  EXPECT_EQ(status, 2);
  EXPECT_EQ(line, "kvbench: error: unknown method 'run\\0x\\x1b[2J\\nnext'\n");
  // A 10 MB name is cut to its head and its length.
  const std::string huge(10 << 20, 'a');
  auto [status2, line2] = report([&] { KVB_CHECK(false, "file ", huge, ": not found"); });
  EXPECT_EQ(status2, 2);
  EXPECT_LT(line2.size(), 300u) << line2.size();
  EXPECT_TRUE(contains(
      line2, std::string(kShownInputHeadBytes, 'a') + "... (10485760 bytes in all): not found"))
      << line2.substr(0, 400);
  // Short inputs and the message's own words are kept as they are.
  EXPECT_STREQ(Error(std::string(kMaxShownInputBytes, 'b')).what(),
               std::string(kMaxShownInputBytes, 'b').c_str());
  // A message built without KVB_FAIL is bounded as a whole; other exceptions are printed escaped.
  EXPECT_LT(std::string(Error(huge).what()).size(), Error::kMaxMessageBytes + 100);
  auto [status3, line3] = report([] { throw std::runtime_error("bad\x1b]0;title\x07"); });
  EXPECT_EQ(status3, 1);
  EXPECT_EQ(line3, "kvbench: internal error: bad\\x1b]0;title\\x07\n");
}

TEST(TextEscape, TerminalAndMarkdownText) {
  EXPECT_EQ(terminal_text("a\tb\nc\x1b[31m\xc2\x9b"
                          "1m\x7f é"),
            "a\\tb\nc\\x1b[31m\\u009b1m\\x7f é");
  EXPECT_EQ(markdown_cell("<img src=x onerror=alert(1)> & a|b \\ c\nd\x1b"),
            "&lt;img src=x onerror=alert(1)&gt; &amp; a\\|b \\\\ c d\\x1b");
  // A cut never splits a UTF-8 character.
  EXPECT_EQ(bounded_text(std::string(199, 'x') + "é" + std::string(200, 'y')),
            std::string(199, 'x') + "... (401 bytes in all)");
}

}  // namespace
}  // namespace kvb
