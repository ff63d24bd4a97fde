#pragma once
// Helpers for the torch-free format tests (tests/base cannot use tests/support, which links
// LibTorch).

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>

#include "harness/common/error.h"

namespace kvb::test {

// A fresh empty directory under $TMPDIR (or /tmp); left behind for inspection when a test fails.
inline std::string make_scratch_dir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvb_" + tag + "_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
  return pattern;
}

inline std::string write_file(const std::string& dir, const std::string& name,
                              const std::string& text) {
  std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out << text;
  return path;
}

// $KVBENCH_DATA (set by ctest), else ../shared/data beside the checkout.
inline std::string data_dir() {
  const char* env = std::getenv("KVBENCH_DATA");
  if (env && *env) return env;
  return KVB_TEST_DATA_DEFAULT;
}

// Runs `f`, expecting kvb::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected kvb::Error";
  } catch (const kvb::Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
    }
  }
}

}  // namespace kvb::test
