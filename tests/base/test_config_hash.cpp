// Canonical JSON and config hashes: equal meaning gives equal hash, different meaning a different
// one, and the exact text is pinned so that hashes stay stable across builds (a changed hash would
// make every stored run look new).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "harness/common/error.h"
#include "harness/common/sha256.h"
#include "harness/store/config_hash.h"

namespace kvb {
namespace {

using nlohmann::json;

TEST(StoreConfigHash, PinnedCanonicalTextAndHash) {
  // Keys given out of order, numbers given as floats where integral.
  json config = json::parse(R"({"text": "café", "seed": 0.0,
      "model": "stories260K", "method": {"params": {"ratio": 0.1, "bits": 2.0}, "name": "kivi"}})");
  const std::string expected_text =
      R"({"method":{"name":"kivi","params":{"bits":2,"ratio":0.1}},"model":"stories260K",)"
      R"("seed":0,"text":"café"})";
  EXPECT_EQ(canonical_json(config), expected_text);
  // Reference value from Python's hashlib over the same bytes.
  EXPECT_EQ(config_hash(config),
            "49220a6e6b834fc482d82499703c5e37b8e9078b0954d1e05788c84d43cb822b");
  EXPECT_EQ(config_hash(config), sha256_hex(expected_text));
}

TEST(StoreConfigHash, SameMeaningSameHash) {
  EXPECT_EQ(config_hash(json::parse(R"({"a": 1, "b": [1, 2]})")),
            config_hash(json::parse(R"({"b": [1.0, 2e0], "a": 1.0})")));
  // Unsigned and signed integers of equal value.
  json u = {{"n", 5u}};
  json s = {{"n", 5}};
  EXPECT_EQ(config_hash(u), config_hash(s));
  // -0.0 is zero.
  EXPECT_EQ(canonical_json(json{{"x", -0.0}}), R"({"x":0})");
}

TEST(StoreConfigHash, DifferentMeaningDifferentHash) {
  const std::string base = config_hash(json::parse(R"({"a": 1, "b": [1, 2]})"));
  EXPECT_NE(base, config_hash(json::parse(R"({"a": 1, "b": [2, 1]})")));  // array order matters
  EXPECT_NE(base, config_hash(json::parse(R"({"a": 1.5, "b": [1, 2]})")));
  EXPECT_NE(base, config_hash(json::parse(R"({"a": "1", "b": [1, 2]})")));
  EXPECT_EQ(base.size(), 64u);
}

TEST(StoreConfigHash, FloatsKeepShortestRoundTripForm) {
  EXPECT_EQ(canonical_json(json{{"r", 0.1}}), R"({"r":0.1})");
  EXPECT_EQ(canonical_json(json{{"r", 1e300}}), R"({"r":1e+300})");
  EXPECT_EQ(canonical_json(json{{"r", -2.5}}), R"({"r":-2.5})");
  // 2^53 and above stay floats: converting them could change the value's meaning.
  EXPECT_EQ(canonical_json(json{{"r", 9007199254740992.0}}), R"({"r":9.007199254740992e+15})");
  EXPECT_EQ(canonical_json(json{{"r", 9007199254740991.0}}), R"({"r":9007199254740991})");
}

TEST(StoreConfigHash, NonFiniteNumbersAreErrorsNamingThePointer) {
  json config = json::parse(R"({"method": {"params": [1, 2]}})");
  config["method"]["params"][1] = std::numeric_limits<double>::quiet_NaN();
  try {
    config_hash(config);
    FAIL() << "expected kvb::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/method/params/1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(canonical_json(json{{"x", std::numeric_limits<double>::infinity()}}), Error);
}

TEST(StoreConfigHash, InvalidUtf8IsAnError) {
  json config = {{"name", std::string("bad\xff")}};
  EXPECT_THROW(canonical_json(config), Error);
}

}  // namespace
}  // namespace kvb
