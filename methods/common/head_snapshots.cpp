#include "methods/common/head_snapshots.h"

#include <ATen/ATen.h>

namespace kvb {

std::vector<HeadSnapshot> dense_head_snapshots(const at::Tensor& k, const at::Tensor& v) {
  const int64_t n = k.size(0), n_kv_heads = k.size(1);
  at::Tensor idx = at::arange(n, at::TensorOptions().dtype(at::kLong).device(k.device()));
  std::vector<HeadSnapshot> out;
  for (int64_t h = 0; h < n_kv_heads; ++h)
    out.push_back({k.select(1, h).contiguous(), v.select(1, h).contiguous(), idx});
  return out;
}

}  // namespace kvb
