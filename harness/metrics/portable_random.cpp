#include "harness/metrics/portable_random.h"

#include <cmath>

#include "harness/common/error.h"

namespace kvb {

uint64_t uniform_index(std::mt19937_64& rng, uint64_t n) {
  KVB_CHECK(n > 0, "uniform_index: empty range");
  const uint64_t threshold = (0 - n) % n;  // == 2^64 mod n
  uint64_t x = rng();
  while (x < threshold) x = rng();
  return x % n;
}

double uniform_unit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

double exponential(std::mt19937_64& rng, double rate) {
  return -std::log1p(-uniform_unit(rng)) / rate;
}

double standard_normal(std::mt19937_64& rng) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  double u1 = uniform_unit(rng);
  double u2 = uniform_unit(rng);
  return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(kTwoPi * u2);
}

}  // namespace kvb
