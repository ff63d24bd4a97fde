#include "harness/eval/attention_measures.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"

namespace kvb::attention_measures {

namespace {

int64_t newest_position(const at::Tensor& index) { return index.max().item<int64_t>(); }

void check_pair(const at::Tensor& p, const at::Tensor& index) {
  KVB_ASSERT(p.dim() == 1 && index.dim() == 1 && p.size(0) == index.size(0), "attention_measures",
             "p and index must be [n] each");
}

}  // namespace

double mass_within_age(const at::Tensor& p, const at::Tensor& index, int64_t max_age) {
  check_pair(p, index);
  if (p.numel() == 0) return 0;
  at::Tensor age = newest_position(index) - index;  // [n]
  return p.masked_select(age < max_age).sum().item<double>();
}

double sink_mass(const at::Tensor& p, const at::Tensor& index, int64_t n_sink) {
  check_pair(p, index);
  return p.masked_select(index < n_sink).sum().item<double>();
}

double entropy(const at::Tensor& p) {
  at::Tensor pos = p.masked_select(p > 0).to(at::kDouble);
  return -(pos * pos.log()).sum().item<double>();
}

int64_t support_count(const at::Tensor& p, double share) {
  if (p.numel() == 0) return 0;
  at::Tensor sorted = std::get<0>(p.to(at::kDouble).sort(0, /*descending=*/true));
  at::Tensor cum = sorted.cumsum(0);
  const double target = share * cum[-1].item<double>();
  // The first row at which the running mass reaches the target (a tiny slack for rounding).
  const int64_t below = (cum < target - 1e-12).sum().item<int64_t>();
  return std::min<int64_t>(below + 1, p.numel());
}

std::vector<int64_t> top_k_positions(const at::Tensor& p, const at::Tensor& index, int64_t k) {
  check_pair(p, index);
  const int64_t n = p.numel();
  k = std::min(k, n);
  std::vector<int64_t> rows(n);
  std::iota(rows.begin(), rows.end(), 0);
  at::Tensor pc = p.contiguous().to(at::kFloat);
  const float* pv = pc.data_ptr<float>();
  std::partial_sort(rows.begin(), rows.begin() + k, rows.end(), [&](int64_t a, int64_t b) {
    return pv[a] > pv[b] || (pv[a] == pv[b] && a < b);
  });
  at::Tensor ic = index.contiguous().to(at::kLong);
  const int64_t* iv = ic.data_ptr<int64_t>();
  std::vector<int64_t> out(k);
  for (int64_t i = 0; i < k; ++i) out[i] = iv[rows[i]];
  std::sort(out.begin(), out.end());
  return out;
}

double jaccard(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.empty() && b.empty()) return 1.0;
  std::vector<int64_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  const double uni = static_cast<double>(a.size() + b.size() - both.size());
  return static_cast<double>(both.size()) / uni;
}

double mass_at(const at::Tensor& p, const at::Tensor& index,
               const std::vector<int64_t>& positions) {
  check_pair(p, index);
  if (positions.empty() || p.numel() == 0) return 0;
  at::Tensor wanted = at::tensor(positions, at::kLong);
  return p.masked_select(at::isin(index.to(at::kLong), wanted)).sum().item<double>();
}

double window_mass(const at::Tensor& p, const at::Tensor& index, int64_t rows, int64_t n_sink) {
  check_pair(p, index);
  if (p.numel() == 0) return 0;
  const int64_t sink = std::min(n_sink, rows);
  const int64_t recent = rows - sink;
  at::Tensor age = newest_position(index) - index;
  return p.masked_select((index < sink).logical_or(age < recent)).sum().item<double>();
}

double top_k_mass_among(const at::Tensor& p, const at::Tensor& mask, int64_t k) {
  at::Tensor sel = p.masked_select(mask);
  if (sel.numel() == 0) return 0;
  k = std::min<int64_t>(k, sel.numel());
  return std::get<0>(sel.topk(k)).sum().item<double>();
}

TopKReuse::StepResult TopKReuse::observe(int64_t step, const std::vector<int64_t>& positions) {
  StepResult r;
  for (int64_t pos : positions) {
    auto it = last_step_.find(pos);
    if (it == last_step_.end()) {
      ++r.fresh;
      last_step_.emplace(pos, step);
    } else {
      r.distance_sum += static_cast<double>(step - it->second);
      ++r.reused;
      it->second = step;
    }
  }
  return r;
}

ClusteredKeyIndex::ClusteredKeyIndex(const at::Tensor& keys, const at::Tensor& positions,
                                     int64_t rows_per_cluster, int64_t iterations) {
  KVB_ASSERT(keys.dim() == 2 && positions.dim() == 1 && keys.size(0) == positions.size(0) &&
                 keys.size(0) > 0 && rows_per_cluster >= 1,
             "clustered_key_index", "keys [n, d] with n > 0 and a position per key");
  at::Tensor x = keys.to(at::kFloat).contiguous();  // [n, d]
  const int64_t n = x.size(0);
  const int64_t c = (n + rows_per_cluster - 1) / rows_per_cluster;
  // Evenly spaced rows as the first centroids: deterministic, and they cover the sequence's span.
  at::Tensor init =
      at::floor(at::arange(c, at::kDouble) * (static_cast<double>(n) / c)).to(at::kLong);
  centroids_ = x.index_select(0, init).clone();  // [c, d]
  at::Tensor assign;
  for (int64_t it = 0; it <= iterations; ++it) {
    // Squared distances up to the per-row constant ||x||^2: ||c||^2 - 2 x.c.
    at::Tensor d = centroids_.pow(2).sum(1).unsqueeze(0) - 2 * at::mm(x, centroids_.t());  // [n, c]
    assign = d.argmin(1);                                                                  // [n]
    if (it == iterations) break;
    at::Tensor sums = at::zeros_like(centroids_).index_add_(0, assign, x);
    at::Tensor counts = at::zeros({c}, at::kFloat).index_add_(0, assign, at::ones({n}, at::kFloat));
    at::Tensor nonempty = counts > 0;  // an empty cluster keeps its centroid
    at::Tensor mean = sums / counts.clamp_min(1).unsqueeze(1);
    centroids_ = at::where(nonempty.unsqueeze(1), mean, centroids_);
  }
  members_.assign(c, {});
  at::Tensor a = assign.contiguous();
  at::Tensor pos = positions.to(at::kLong).contiguous();
  const int64_t* av = a.data_ptr<int64_t>();
  const int64_t* pv = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    cluster_of_[pv[i]] = av[i];
    members_[av[i]].push_back(pv[i]);
  }
}

void ClusteredKeyIndex::add(const at::Tensor& key, int64_t position) {
  at::Tensor k = key.to(at::kFloat).reshape({1, -1});  // [1, d]
  const int64_t best =
      (centroids_.pow(2).sum(1) - 2 * at::mm(k, centroids_.t())[0]).argmin().item<int64_t>();
  cluster_of_[position] = best;
  members_[best].push_back(position);
}

std::vector<int64_t> ClusteredKeyIndex::scan(const at::Tensor& queries, double share) const {
  at::Tensor scores = at::mm(queries.to(at::kFloat), centroids_.t()).mean(0);  // [c]
  at::Tensor order = std::get<1>(scores.sort(0, /*descending=*/true)).contiguous();
  const int64_t* ov = order.data_ptr<int64_t>();
  const int64_t want = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(share * size())));
  std::vector<int64_t> out;
  for (int64_t i = 0; i < order.numel(); ++i) {
    const auto& m = members_[ov[i]];
    if (m.empty()) continue;
    out.insert(out.end(), m.begin(), m.end());
    if (static_cast<int64_t>(out.size()) >= want) break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

at::Tensor quantize_dequantize(const at::Tensor& x, int32_t bits, int64_t group,
                               kernels::QuantAxis axis) {
  KVB_ASSERT(x.dim() == 2, "quantize_dequantize", "x must be [n, d]");
  at::Tensor xc = x.to(at::kFloat).contiguous();
  kernels::GroupQuantShape s;
  s.bits = bits;
  s.rows = xc.size(0);
  s.cols = xc.size(1);
  s.group_size = group;
  s.axis = axis;
  const std::string bad = kernels::group_quant_check(s);
  KVB_ASSERT(bad.empty(), "quantize_dequantize", bad);
  std::vector<uint8_t> codes(kernels::group_quant_code_bytes(s));
  std::vector<uint16_t> scales(kernels::group_quant_num_groups(s)), mins(scales.size());
  kernels::GroupQuantizeParams qp;
  qp.shape = s;
  qp.x = xc.data_ptr<float>();
  qp.codes = codes.data();
  qp.scales = scales.data();
  qp.mins = mins.data();
  kernels::group_quantize_cpu(qp);
  at::Tensor out = at::empty_like(xc);
  kernels::GroupDequantizeParams dp;
  dp.shape = s;
  dp.codes = codes.data();
  dp.scales = scales.data();
  dp.mins = mins.data();
  dp.out = out.data_ptr<float>();
  kernels::group_dequantize_cpu(dp);
  return out;
}

at::Tensor attention_output(const at::Tensor& queries, const at::Tensor& keys,
                            const at::Tensor& values, double scale) {
  at::Tensor p = at::softmax(at::mm(queries, keys.t()) * scale, 1);  // [g, n]
  return at::mm(p, values);                                          // [g, d]
}

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double den = b.norm().item<double>();
  const double num = (a - b).norm().item<double>();
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return num / den;
}

}  // namespace kvb::attention_measures
