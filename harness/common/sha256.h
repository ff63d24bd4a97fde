#pragma once
// SHA-256 (FIPS 180-4), torch-free. Content hashes identify configs, baseline caches and artifacts,
// so they must be stable across compilers and platforms: hence our own small implementation rather
// than a dependency that may or may not be installed.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvb {

// Incremental hasher: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size_bytes);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // Finishes the hash; the object must not be updated afterwards (a second call returns the same
  // value).
  std::array<uint8_t, 32> digest();
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);  // block: [64] bytes

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;
  size_t buffered_ = 0;       // bytes waiting in buffer_
  uint64_t total_bytes_ = 0;  // message length so far
  bool finished_ = false;
  std::array<uint8_t, 32> result_{};
};

// Lower-case hex SHA-256 of `data` (64 characters).
std::string sha256_hex(std::string_view data);

// Lower-case hex SHA-256 of a file's bytes, read in chunks. Throws kvb::Error naming the path.
std::string sha256_file_hex(const std::string& path);

}  // namespace kvb
