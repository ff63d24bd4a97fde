#include "harness/common/fast_hash.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "harness/common/error.h"

namespace kvb {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

inline uint32_t read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

inline uint64_t round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  return rotl(acc, 31) * kP1;
}

inline uint64_t merge_round(uint64_t acc, uint64_t lane) {
  acc ^= round(0, lane);
  return acc * kP1 + kP4;
}

// Four independent lanes per 32-byte stripe: the multiplies of one stripe do not wait on each
// other.
inline void consume_stripe(std::array<uint64_t, 4>& lanes, const uint8_t* p) {
  for (int i = 0; i < 4; ++i) lanes[i] = round(lanes[i], read64(p + 8 * i));
}

}  // namespace

FastHash::FastHash(uint64_t seed)
    : lanes_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, seed_(seed) {}

void FastHash::update(const void* data, size_t size_bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_bytes_ += size_bytes;
  if (buffered_ > 0) {
    const size_t take = std::min(size_bytes, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    size_bytes -= take;
    if (buffered_ < buffer_.size()) return;
    consume_stripe(lanes_, buffer_.data());
    buffered_ = 0;
  }
  for (; size_bytes >= 32; p += 32, size_bytes -= 32) consume_stripe(lanes_, p);
  std::memcpy(buffer_.data(), p, size_bytes);
  buffered_ = size_bytes;
}

void FastHash::update_field(std::string_view data) {
  const uint64_t n = data.size();
  update(&n, sizeof(n));
  update(data);
}

uint64_t FastHash::digest() const {
  uint64_t h;
  if (total_bytes_ >= 32) {
    h = rotl(lanes_[0], 1) + rotl(lanes_[1], 7) + rotl(lanes_[2], 12) + rotl(lanes_[3], 18);
    for (uint64_t lane : lanes_) h = merge_round(h, lane);
  } else {
    h = seed_ + kP5;
  }
  h += total_bytes_;
  const uint8_t* p = buffer_.data();
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round(0, read64(p)), 27) * kP1 + kP4;
  if (n >= 4) {
    h = rotl(h ^ (static_cast<uint64_t>(read32(p)) * kP1), 23) * kP2 + kP3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = rotl(h ^ (*p * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string FastHash::hex_digest() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  const uint64_t d = digest();
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[i] = kDigits[(d >> (60 - 4 * i)) & 0xf];
  return out;
}

uint64_t fast_hash64(const void* data, size_t size_bytes, uint64_t seed) {
  FastHash h(seed);
  h.update(data, size_bytes);
  return h.digest();
}

std::string fast_hash_hex(std::string_view data) {
  FastHash h;
  h.update(data);
  return h.hex_digest();
}

std::string fast_hash_file_hex(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  KVB_CHECK(f != nullptr, path, ": cannot open for hashing: ", std::strerror(errno));
  FastHash h;
  std::vector<char> chunk(size_t{1} << 20);
  size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), f.get())) > 0) h.update(chunk.data(), n);
  KVB_CHECK(!std::ferror(f.get()), path, ": read error while hashing");
  return h.hex_digest();
}

}  // namespace kvb
