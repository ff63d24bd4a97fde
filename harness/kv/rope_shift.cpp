#include "harness/kv/rope_shift.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "harness/engine/transformer.h"
#include "harness/model/model.h"

namespace kvb {

at::Tensor rope_shift(const at::Tensor& k, const ModelConfig& c, int64_t delta) {
  if (delta == 0) return k;
  const std::vector<double> freq = rope_inv_freq(c);
  const int64_t half = static_cast<int64_t>(freq.size());
  std::vector<float> cs(half), sn(half);
  for (int64_t i = 0; i < half; ++i) {
    // The angle reduced mod 2 pi in fp64 first: delta * freq can be large (128K positions).
    const double a = std::fmod(static_cast<double>(delta) * freq[i], 2.0 * M_PI);
    cs[i] = static_cast<float>(std::cos(a));
    sn[i] = static_cast<float>(std::sin(a));
  }
  const int64_t n = k.size(0);
  at::Tensor cos = at::tensor(cs, at::kFloat).to(k.device()).unsqueeze(0).expand({n, half});
  at::Tensor sin = at::tensor(sn, at::kFloat).to(k.device()).unsqueeze(0).expand({n, half});
  return apply_rope(k, cos, sin, c.rope_style);
}

}  // namespace kvb
