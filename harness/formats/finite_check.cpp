#include "harness/formats/finite_check.h"

#include <cstring>

namespace kvb {

namespace {

// Blocks of 256 elements are OR-reduced first (a branch-free loop the compiler vectorizes); only a
// block with a hit is rescanned for the index. `T` is the element's bit pattern type.
template <typename T>
int64_t scan(const unsigned char* p, int64_t n, T exp_mask) {
  constexpr int64_t kBlock = 256;
  T buf[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = n - start < kBlock ? n - start : kBlock;
    std::memcpy(buf, p + start * static_cast<int64_t>(sizeof(T)),
                static_cast<size_t>(len) * sizeof(T));
    bool hit = false;
    for (int64_t i = 0; i < len; ++i) hit |= (buf[i] & exp_mask) == exp_mask;
    if (!hit) continue;
    for (int64_t i = 0; i < len; ++i)
      if ((buf[i] & exp_mask) == exp_mask) return start + i;
  }
  return -1;
}

}  // namespace

int64_t first_nonfinite(const void* data, int64_t n, FloatBits bits) {
  const auto* p = static_cast<const unsigned char*>(data);
  switch (bits) {
    case FloatBits::kF32:
      return scan<uint32_t>(p, n, 0x7f800000u);
    case FloatBits::kF16:
      return scan<uint16_t>(p, n, static_cast<uint16_t>(0x7c00u));
    case FloatBits::kBF16:
      return scan<uint16_t>(p, n, static_cast<uint16_t>(0x7f80u));
  }
  return -1;
}

}  // namespace kvb
