// SHA-256 against the FIPS 180-4 / NIST test vectors, plus incremental updates split at every
// offset (the buffering logic is where an implementation usually goes wrong).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "harness/common/error.h"
#include "harness/common/sha256.h"

namespace kvb {
namespace {

TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // The 448-bit message: its padding needs a second block.
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // The 896-bit message.
  EXPECT_EQ(
      sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
                 "klmnopqrlmnopqrsmnopqrstnopqrstu"),
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256, MillionAInOddChunks) {
  Sha256 h;
  const std::string chunk(997, 'a');  // prime length: chunks straddle block boundaries
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // digest() is idempotent once finished.
  EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, SplitAtEveryOffsetMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 768; ++i) data.push_back(static_cast<char>(i % 256));
  const std::string expected = "f3a25aa93aa2fbba28d79260535bbd6a5eb0fc1c24a8b0f04e12b484c1dfe363";
  ASSERT_EQ(sha256_hex(data), expected);
  for (size_t split = 0; split <= 130; ++split) {
    Sha256 h;
    h.update(std::string_view(data).substr(0, split));
    h.update(std::string_view(data).substr(split));
    ASSERT_EQ(h.hex_digest(), expected) << "split at " << split;
  }
}

TEST(Sha256, PaddingBoundaryLengths) {
  // Lengths 55, 56, 63, 64 switch between one and two padding blocks; compare with a byte-at-a-time
  // feed so both code paths (buffered and whole-block) must agree.
  for (size_t len : {55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u}) {
    std::string data(len, 'x');
    Sha256 h;
    for (char c : data) h.update(&c, 1);
    EXPECT_EQ(h.hex_digest(), sha256_hex(data)) << "length " << len;
  }
  EXPECT_EQ(sha256_hex(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, FileHashAndMissingFile) {
  char tmpl[] = "/tmp/kvb_sha256_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "abc", 3), 3);
  ::close(fd);
  EXPECT_EQ(sha256_file_hex(tmpl),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::remove(tmpl);
  try {
    sha256_file_hex(tmpl);
    FAIL() << "expected kvb::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmpl), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvb
