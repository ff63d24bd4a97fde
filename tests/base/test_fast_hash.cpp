// FastHash against the reference XXH64's published digests, plus incremental updates split at every
// offset (the 32-byte stripe buffering is where an implementation usually goes wrong).

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "harness/common/error.h"
#include "harness/common/fast_hash.h"

namespace kvb {
namespace {

TEST(FastHash, ReferenceXxh64Digests) {
  EXPECT_EQ(fast_hash_hex(""), "ef46db3751d8e999");
  EXPECT_EQ(fast_hash_hex("a"), "d24ec4f1a98c6e5b");
  EXPECT_EQ(fast_hash_hex("abc"), "44bc2cf5ad770999");
  // 39 bytes: one whole stripe, then the tail.
  EXPECT_EQ(fast_hash_hex("Nobody inspects the spammish repetition"), "fbcea83c8a378bf1");
}

TEST(FastHash, SplitAtEveryOffsetMatchesOneShot) {
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>((i * 37 + 11) % 256));
  const uint64_t expected = fast_hash64(data.data(), data.size());
  for (size_t split = 0; split <= data.size(); ++split) {
    FastHash h;
    h.update(std::string_view(data).substr(0, split));
    h.update(std::string_view(data).substr(split));
    ASSERT_EQ(h.digest(), expected) << "split at " << split;
  }
  FastHash bytewise;
  for (char c : data) bytewise.update(&c, 1);
  EXPECT_EQ(bytewise.digest(), expected);
}

TEST(FastHash, NoticesOneFlippedBitAndFieldBoundaries) {
  std::string data(4096, '\0');
  const uint64_t zeros = fast_hash64(data.data(), data.size());
  data[2049] = 0x04;
  EXPECT_NE(fast_hash64(data.data(), data.size()), zeros);
  EXPECT_NE(fast_hash64(data.data(), data.size() - 1), fast_hash64(data.data(), data.size()));
  FastHash a, b;
  a.update_field("ab");
  a.update_field("c");
  b.update_field("a");
  b.update_field("bc");
  EXPECT_NE(a.digest(), b.digest());
}

TEST(FastHash, FileHashAndMissingFile) {
  char tmpl[] = "/tmp/kvb_fast_hash_XXXXXX";
  int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "abc", 3), 3);
  ::close(fd);
  EXPECT_EQ(fast_hash_file_hex(tmpl), "44bc2cf5ad770999");
  std::remove(tmpl);
  EXPECT_THROW(fast_hash_file_hex(tmpl), Error);
}

}  // namespace
}  // namespace kvb
