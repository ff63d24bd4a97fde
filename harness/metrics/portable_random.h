#pragma once
// Random draws that are the same on every machine and standard library. std::mt19937_64's output is
// fixed by the C++ standard, but std::uniform_int_distribution, std::normal_distribution and
// friends are implementation-defined, so a result seeded with them would differ between libstdc++
// and libc++. Everything here is derived from the raw 64-bit engine output by the rules written
// next to it. (The continuous draws go through std::log/std::cos/std::sqrt; libm may differ in the
// last ulp between platforms, which can move a rounded integer derived from them in rare cases.)

#include <cstdint>
#include <random>

namespace kvb {

// Unbiased integer in [0, n) (n == 0 throws kvb::Error), by rejection: threshold = 2^64 mod n
// (computed as (-n) % n in uint64 arithmetic); draw x = rng() until x >= threshold; return x % n.
// The accepted range holds a multiple of n values, so every residue is equally likely. Consumes one
// draw except with probability threshold / 2^64 (< n / 2^64).
uint64_t uniform_index(std::mt19937_64& rng, uint64_t n);

// Uniform double in [0, 1): the top 53 bits of one draw, times 2^-53.
double uniform_unit(std::mt19937_64& rng);

// Exponential with the given rate (> 0): -log1p(-u) / rate, u = uniform_unit (one draw).
double exponential(std::mt19937_64& rng, double rate);

// Standard normal by Box-Muller's cosine branch: sqrt(-2 log1p(-u1)) * cos(2 pi u2) with u1 then u2
// from uniform_unit (two draws per call; the sine branch is discarded so that a call is stateless).
double standard_normal(std::mt19937_64& rng);

}  // namespace kvb
