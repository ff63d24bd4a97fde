#pragma once
// Next-token choice on the host: greedy argmax, or temperature + nucleus (top-p) sampling from a
// per-sequence mt19937_64 stream, so a seed gives the same tokens on every device.

#include <cstdint>
#include <random>
#include <vector>

namespace kvb {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
};

class Sampler {
 public:
  Sampler(SamplingOptions opts, int64_t stream);  // stream: the sequence's index in its batch
  // logits: [vocab] fp32, host.
  int64_t next(const float* logits, int64_t vocab);

 private:
  SamplingOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int64_t>> buf_;
};

}  // namespace kvb
