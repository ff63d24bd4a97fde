#include "methods/common/fork_pass.h"

#include <limits>

namespace kvb {

at::Tensor fork_rows_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& held,
                               int64_t head, int64_t group, double sm_scale) {
  const int64_t rows = q.size(0), m = held.size(0);
  const at::Tensor keys = at::cat({held, k_new.select(1, head)}, 0);  // [m + rows, D]
  at::Tensor logits = at::matmul(q.narrow(1, head * group, group).permute({1, 0, 2}), keys.t()) *
                      sm_scale;  // [group, rows, m + rows]
  const at::Tensor future = at::ones({rows, rows}, at::kBool).triu(1);
  logits.narrow(2, m, rows).masked_fill_(future, -std::numeric_limits<float>::infinity());
  return at::softmax(logits, -1);
}

}  // namespace kvb
