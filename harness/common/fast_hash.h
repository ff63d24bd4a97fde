#pragma once
// A fast 64-bit content hash (XXH64), torch-free. Cache keys and cache checksums hash whole models
// and logit tables, hundreds of megabytes, on every run: SHA-256 would cost seconds there, and
// these hashes only have to notice accidental change (a replaced checkpoint, a truncated or zeroed
// file), not an adversary. The digest is the reference XXH64's, so it is stable across compilers
// and platforms (words are read little-endian).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvb {

// Incremental hasher: update() any number of times; digest() does not end it (more updates may
// follow and extend the message).
class FastHash {
 public:
  explicit FastHash(uint64_t seed = 0);
  void update(const void* data, size_t size_bytes);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // Length-prefixed, so that ("ab", "c") and ("a", "bc") hash differently.
  void update_field(std::string_view data);
  uint64_t digest() const;
  std::string hex_digest() const;  // 16 lower-case hex digits

 private:
  std::array<uint64_t, 4> lanes_;
  std::array<uint8_t, 32> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  uint64_t seed_;
};

uint64_t fast_hash64(const void* data, size_t size_bytes, uint64_t seed = 0);
std::string fast_hash_hex(std::string_view data);

// The hex FastHash of a file's bytes, read in chunks. Throws kvb::Error naming the path.
std::string fast_hash_file_hex(const std::string& path);

}  // namespace kvb
