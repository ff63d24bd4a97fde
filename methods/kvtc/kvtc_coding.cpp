// KVTC building blocks without the model: entropy coding (zstd, DEFLATE), bit packing, the
// per-component quantizer, the DP bit allocation, PCA, the transform fit and block (de)coding.

#include <ATen/ATen.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "harness/common/enum_names.h"
#include "harness/common/error.h"
#include "methods/kvtc/kvtc.h"

namespace kvb::kvtc {

// ---------------------------------------------------------------- entropy coding

namespace {
const EnumName<Entropy> kEntropies[] = {
    {Entropy::kZstd, "zstd"}, {Entropy::kDeflate, "deflate"}, {Entropy::kNone, "none"}};
}  // namespace

Entropy parse_entropy(const std::string& s) {
  return parse_enum(kEntropies, s, "kvtc entropy coder");
}

const char* entropy_name(Entropy e) { return enum_name(kEntropies, e); }

std::vector<uint8_t> entropy_encode(Entropy e, const uint8_t* src, size_t n, int level) {
  if (e == Entropy::kNone) return std::vector<uint8_t>(src, src + n);
  if (e == Entropy::kZstd) {
    ZSTD_CCtx* cx = ZSTD_createCCtx();
    KVB_CHECK(cx != nullptr, "kvtc: ZSTD_createCCtx failed");
    // Small blocks: no checksum, no content size, no dictionary id in the frame header (the raw
    // size is known from the allocation and the block's token count).
    ZSTD_CCtx_setParameter(cx, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cx, ZSTD_c_checksumFlag, 0);
    ZSTD_CCtx_setParameter(cx, ZSTD_c_contentSizeFlag, 0);
    ZSTD_CCtx_setParameter(cx, ZSTD_c_dictIDFlag, 0);
    std::vector<uint8_t> out(ZSTD_compressBound(n));
    const size_t r = ZSTD_compress2(cx, out.data(), out.size(), src, n);
    ZSTD_freeCCtx(cx);
    KVB_CHECK(!ZSTD_isError(r), "kvtc: zstd compression failed: ", ZSTD_getErrorName(r));
    out.resize(r);
    return out;
  }
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  // windowBits -15: raw DEFLATE (no zlib header or adler32), the paper's nvCOMP DEFLATE stream.
  KVB_CHECK(deflateInit2(&zs, level, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY) == Z_OK,
            "kvtc: deflateInit2 failed");
  std::vector<uint8_t> out(deflateBound(&zs, static_cast<uLong>(n)) + 16);
  zs.next_in = const_cast<Bytef*>(src);
  zs.avail_in = static_cast<uInt>(n);
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  const int r = deflate(&zs, Z_FINISH);
  const size_t produced = out.size() - zs.avail_out;
  deflateEnd(&zs);
  KVB_CHECK(r == Z_STREAM_END, "kvtc: deflate failed (", r, ")");
  out.resize(produced);
  return out;
}

void entropy_decode(Entropy e, const uint8_t* src, size_t n, uint8_t* out, size_t raw_size) {
  if (e == Entropy::kNone) {
    KVB_CHECK(n == raw_size, "kvtc: stored block of ", n, " bytes, expected ", raw_size);
    if (n) std::memcpy(out, src, n);
    return;
  }
  if (e == Entropy::kZstd) {
    const size_t r = ZSTD_decompress(out, raw_size, src, n);
    KVB_CHECK(!ZSTD_isError(r), "kvtc: zstd block is corrupt: ", ZSTD_getErrorName(r));
    KVB_CHECK(r == raw_size, "kvtc: zstd block inflated to ", r, " bytes, expected ", raw_size);
    return;
  }
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  KVB_CHECK(inflateInit2(&zs, -15) == Z_OK, "kvtc: inflateInit2 failed");
  zs.next_in = const_cast<Bytef*>(src);
  zs.avail_in = static_cast<uInt>(n);
  zs.next_out = out;
  zs.avail_out = static_cast<uInt>(raw_size);
  const int r = inflate(&zs, Z_FINISH);
  const size_t produced = raw_size - zs.avail_out;
  inflateEnd(&zs);
  KVB_CHECK(r == Z_STREAM_END && produced == raw_size, "kvtc: DEFLATE block is corrupt (", r, ", ",
            produced, " of ", raw_size, " bytes)");
}

// ---------------------------------------------------------------- bit packing

void BitWriter::put(uint32_t code, int bits) {
  if (bits == 0) return;
  acc_ |= static_cast<uint64_t>(code & ((1u << bits) - 1u)) << nacc_;
  nacc_ += bits;
  bits_ += bits;
  while (nacc_ >= 8) {
    out_.push_back(static_cast<uint8_t>(acc_ & 0xff));
    acc_ >>= 8;
    nacc_ -= 8;
  }
}

std::vector<uint8_t> BitWriter::finish() const {
  std::vector<uint8_t> o = out_;
  if (nacc_ > 0) o.push_back(static_cast<uint8_t>(acc_ & 0xff));
  return o;
}

uint32_t BitReader::get(int bits) {
  if (bits == 0) return 0;
  while (nacc_ < bits) {
    KVB_CHECK(pos_ < n_, "kvtc: bit stream ends early (", n_, " bytes)");
    acc_ |= static_cast<uint64_t>(data_[pos_++]) << nacc_;
    nacc_ += 8;
  }
  const uint32_t v = static_cast<uint32_t>(acc_ & ((1ull << bits) - 1ull));
  acc_ >>= bits;
  nacc_ -= bits;
  return v;
}

// ---------------------------------------------------------------- quantizer

uint32_t quantize(float y, int bits, float step) {
  const int64_t half = int64_t{1} << (bits - 1), top = (int64_t{1} << bits) - 1;
  const double q = std::floor(static_cast<double>(y) / step) + static_cast<double>(half);
  return static_cast<uint32_t>(
      std::min<double>(std::max<double>(q, 0.0), static_cast<double>(top)));
}

float dequantize(uint32_t code, int bits, float step) {
  const int64_t half = int64_t{1} << (bits - 1);
  return static_cast<float>((static_cast<double>(code) - static_cast<double>(half) + 0.5) * step);
}

std::pair<float, double> fit_step(const float* y, int64_t n, int64_t stride, int bits) {
  KVB_CHECK(n > 0 && bits >= 1 && bits <= 16, "kvtc: fit_step needs samples and 1..16 bits");
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(y[i * stride]) * y[i * stride];
  const double rms = std::sqrt(ss / static_cast<double>(n));
  if (rms == 0.0) return {1.0f, 0.0};
  const int kGrid = 48;
  float best_step = 1.0f;
  double best = std::numeric_limits<double>::infinity();
  for (int g = 0; g < kGrid; ++g) {
    const double alpha = 0.25 * std::pow(24.0, static_cast<double>(g) / (kGrid - 1));  // 0.25..6
    const float step = static_cast<float>(2.0 * alpha * rms / static_cast<double>(1 << bits));
    double err = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float v = y[i * stride];
      const double d = static_cast<double>(v) - dequantize(quantize(v, bits, step), bits, step);
      err += d * d;
    }
    if (err < best) {
      best = err;
      best_step = step;
    }
  }
  return {best_step, best / static_cast<double>(n)};
}

// ---------------------------------------------------------------- bit allocation

const std::vector<int>& allowed_widths() {
  static const std::vector<int> w = {0, 1, 2, 3, 4, 5, 6, 8};
  return w;
}

Allocation allocate_bits(const std::vector<std::vector<double>>& distortion,
                         const std::vector<int>& widths, const std::vector<int64_t>& size,
                         int64_t budget_bits) {
  const size_t n = distortion.size(), nw = widths.size();
  KVB_CHECK(size.size() == n, "kvtc: allocate_bits: ", size.size(), " sizes for ", n, " items");
  KVB_CHECK(nw >= 1 && nw < 255 && budget_bits >= 0, "kvtc: allocate_bits: bad widths/budget");
  const int64_t B = budget_bits;
  const double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> dp(static_cast<size_t>(B + 1), kInf), nd(static_cast<size_t>(B + 1));
  dp[0] = 0;
  // choice[i][c]: width index item i took to reach cost c after items 0..i (255: unreachable).
  std::vector<std::vector<uint8_t>> choice(n,
                                           std::vector<uint8_t>(static_cast<size_t>(B + 1), 255));
  for (size_t i = 0; i < n; ++i) {
    KVB_CHECK(distortion[i].size() == nw, "kvtc: allocate_bits: item ", i, " has ",
              distortion[i].size(), " distortions for ", nw, " widths");
    std::fill(nd.begin(), nd.end(), kInf);
    for (int64_t c = 0; c <= B; ++c) {
      if (dp[c] == kInf) continue;
      for (size_t w = 0; w < nw; ++w) {
        const int64_t c2 = c + size[i] * widths[w];
        if (c2 > B) continue;
        const double d = dp[c] + distortion[i][w];
        if (d < nd[c2]) {
          nd[c2] = d;
          choice[i][c2] = static_cast<uint8_t>(w);
        }
      }
    }
    dp.swap(nd);
  }
  int64_t best_c = -1;
  for (int64_t c = 0; c <= B; ++c)
    if (dp[c] < kInf && (best_c < 0 || dp[c] < dp[best_c])) best_c = c;
  KVB_CHECK(best_c >= 0, "kvtc: allocate_bits: no feasible allocation (a zero width is needed)");
  Allocation a;
  a.bits.assign(n, 0);
  a.distortion = dp[best_c];
  a.total_bits = best_c;
  int64_t c = best_c;
  for (size_t i = n; i-- > 0;) {
    const uint8_t w = choice[i][c];
    a.bits[i] = widths[w];
    c -= size[i] * widths[w];
  }
  return a;
}

Allocation allocate_bits_uniform(const std::vector<std::vector<double>>& distortion,
                                 const std::vector<int>& widths, const std::vector<int64_t>& size,
                                 int64_t budget_bits) {
  const size_t n = distortion.size();
  KVB_CHECK(size.size() == n, "kvtc: allocate_bits_uniform: ", size.size(), " sizes for ", n,
            " items");
  KVB_CHECK(widths.size() >= 2 && widths[0] == 0 && budget_bits >= 0,
            "kvtc: allocate_bits_uniform: widths must start with 0 and hold a nonzero width");
  int64_t components = 0;
  for (size_t i = 0; i < n; ++i) {
    KVB_CHECK(size[i] >= 1 && distortion[i].size() == widths.size(),
              "kvtc: allocate_bits_uniform: item ", i, " has size ", size[i], " and ",
              distortion[i].size(), " distortions for ", widths.size(), " widths");
    components += size[i];
  }
  // The largest allowed width the budget pays for on every component; the smallest nonzero one
  // when it pays for less than a bit each (then only the leading components are coded).
  size_t w = 1;
  for (size_t j = 1; j < widths.size(); ++j)
    if (components > 0 && widths[j] * components <= budget_bits && widths[j] > widths[w]) w = j;
  // Leading components first: by variance per component, ties by index (stable).
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return distortion[a][0] / static_cast<double>(size[a]) >
           distortion[b][0] / static_cast<double>(size[b]);
  });
  Allocation a;
  a.bits.assign(n, 0);
  for (size_t i : order) {
    const int64_t cost = size[i] * widths[w];
    if (a.total_bits + cost > budget_bits) continue;
    a.bits[i] = widths[w];
    a.total_bits += cost;
  }
  for (size_t i = 0; i < n; ++i) a.distortion += distortion[i][a.bits[i] == 0 ? 0 : w];
  return a;
}

Allocation allocate_bits_brute_force(const std::vector<std::vector<double>>& distortion,
                                     const std::vector<int>& widths,
                                     const std::vector<int64_t>& size, int64_t budget_bits) {
  const size_t n = distortion.size(), nw = widths.size();
  std::vector<size_t> idx(n, 0);
  Allocation best;
  best.distortion = std::numeric_limits<double>::infinity();
  while (true) {
    int64_t cost = 0;
    double d = 0;
    for (size_t i = 0; i < n; ++i) {
      cost += size[i] * widths[idx[i]];
      d += distortion[i][idx[i]];
    }
    if (cost <= budget_bits && d < best.distortion) {
      best.distortion = d;
      best.total_bits = cost;
      best.bits.resize(n);
      for (size_t i = 0; i < n; ++i) best.bits[i] = widths[idx[i]];
    }
    size_t k = 0;
    while (k < n && ++idx[k] == nw) idx[k++] = 0;
    if (k == n) break;
  }
  return best;
}

// ---------------------------------------------------------------- PCA

Pca pca_fit(const at::Tensor& x, int64_t rank) {
  KVB_CHECK(x.dim() == 2 && x.size(0) >= 2, "kvtc: PCA needs [n >= 2, d] samples");
  at::Tensor xd = x.to(at::kDouble);
  Pca p;
  p.mean = xd.mean(0);
  at::Tensor xc = xd - p.mean;
  auto svd = at::linalg_svd(xc, /*full_matrices=*/false);
  at::Tensor S = std::get<1>(svd), Vh = std::get<2>(svd);
  const double denom = static_cast<double>(x.size(0) - 1);
  at::Tensor var = S * S / denom;
  p.total_variance = var.sum().item<double>();
  const int64_t r_max = S.size(0);
  const int64_t r = rank <= 0 ? r_max : std::min(rank, r_max);
  at::Tensor basis = Vh.narrow(0, 0, r).t().contiguous();  // [d, r]
  // Fix signs: the largest |entry| of each column positive.
  at::Tensor amax = basis.abs().argmax(0);
  at::Tensor sgn = basis.gather(0, amax.unsqueeze(0)).sign().squeeze(0);
  sgn = at::where(sgn == 0, at::ones_like(sgn), sgn);
  p.basis = (basis * sgn.unsqueeze(0)).contiguous();
  p.variance = var.narrow(0, 0, r).contiguous();
  return p;
}

double energy_fraction(const Pca& p, int64_t k) {
  if (p.total_variance <= 0) return 1.0;
  k = std::min<int64_t>(k, p.variance.size(0));
  return p.variance.narrow(0, 0, k).sum().item<double>() / p.total_variance;
}

// ---------------------------------------------------------------- transform

namespace {
const EnumName<Scope> kScopes[] = {
    {Scope::kModel, "model"}, {Scope::kLayer, "layer"}, {Scope::kHead, "head"}};
}  // namespace

Scope parse_scope(const std::string& s) { return parse_enum(kScopes, s, "kvtc pca_scope"); }

const char* scope_name(Scope s) { return enum_name(kScopes, s); }

namespace {
const EnumName<BitAllocation> kBitAllocations[] = {{BitAllocation::kDp, "dp"},
                                                   {BitAllocation::kUniform, "uniform"}};
}  // namespace

BitAllocation parse_bit_allocation(const std::string& s) {
  return parse_enum(kBitAllocations, s, "kvtc allocation");
}

const char* bit_allocation_name(BitAllocation a) { return enum_name(kBitAllocations, a); }

KindTransform build_transform(const at::Tensor& x, int64_t n_layers, int64_t n_kv_heads,
                              int64_t head_dim, const TransformOptions& o) {
  const int64_t width = n_layers * n_kv_heads * head_dim;
  KVB_CHECK(x.dim() == 2 && x.size(1) == width, "kvtc: calibration data of shape ", x.sizes(),
            " for a model of width ", width);
  KVB_CHECK(o.band >= 1, "kvtc: band must be >= 1");
  const int64_t gdim = o.scope == Scope::kModel   ? width
                       : o.scope == Scope::kLayer ? n_kv_heads * head_dim
                                                  : head_dim;
  const int64_t N = x.size(0);
  const int64_t fit_stride = std::max<int64_t>(1, N / std::max<int64_t>(1, o.fit_samples));
  const std::vector<int>& widths = allowed_widths();

  struct Fit {
    Pca pca;
    at::Tensor coef;                       // [n_fit, r] fp32
    std::vector<std::vector<float>> step;  // [r][widths]
    std::vector<std::vector<double>> mse;  // [r][widths]
  };
  std::vector<Fit> fits;
  KindTransform t;
  t.width = width;
  std::vector<std::vector<double>> item_dist;
  std::vector<int64_t> item_size;
  std::vector<std::pair<size_t, int64_t>> item_at;  // (group, first component)
  double dropped_by_rank = 0;
  for (int64_t off = 0; off < width; off += gdim) {
    Fit f;
    at::Tensor xg = x.narrow(1, off, gdim);
    f.pca = pca_fit(xg, o.rank);
    t.total_variance += f.pca.total_variance;
    dropped_by_rank += f.pca.total_variance - f.pca.variance.sum().item<double>();
    at::Tensor sub =
        xg.index_select(0, at::arange(0, N, fit_stride, at::TensorOptions().dtype(at::kLong)));
    f.coef = at::mm(sub.to(at::kDouble) - f.pca.mean, f.pca.basis).to(at::kFloat).contiguous();
    const int64_t r = f.pca.basis.size(1), nf = f.coef.size(0);
    const float* c = f.coef.data_ptr<float>();
    f.step.assign(static_cast<size_t>(r), std::vector<float>(widths.size(), 0.f));
    f.mse.assign(static_cast<size_t>(r), std::vector<double>(widths.size(), 0.0));
    for (int64_t i = 0; i < r; ++i) {
      for (size_t w = 0; w < widths.size(); ++w) {
        if (widths[w] == 0) {
          double ss = 0;
          for (int64_t s = 0; s < nf; ++s) ss += static_cast<double>(c[s * r + i]) * c[s * r + i];
          f.mse[i][w] = ss / static_cast<double>(nf);
          continue;
        }
        auto [st, m] = fit_step(c + i, nf, r, widths[w]);
        f.step[i][w] = st;
        f.mse[i][w] = m;
      }
    }
    for (int64_t i0 = 0; i0 < r; i0 += o.band) {
      const int64_t m = std::min(o.band, r - i0);
      std::vector<double> d(widths.size(), 0.0);
      for (int64_t i = i0; i < i0 + m; ++i)
        for (size_t w = 0; w < widths.size(); ++w) d[w] += f.mse[i][w];
      item_dist.push_back(d);
      item_size.push_back(m);
      item_at.emplace_back(fits.size(), i0);
    }
    fits.push_back(std::move(f));
  }
  const int64_t budget = static_cast<int64_t>(std::floor(o.bits_per_element * width + 1e-9));
  const Allocation a = o.allocation == BitAllocation::kUniform
                           ? allocate_bits_uniform(item_dist, widths, item_size, budget)
                           : allocate_bits(item_dist, widths, item_size, budget);
  t.expected_mse = a.distortion + dropped_by_rank;
  t.code_bits_per_token = a.total_bits;
  // Per group: the used components (bits > 0).
  std::vector<std::vector<int>> comp_bits(fits.size());
  for (size_t g = 0; g < fits.size(); ++g)
    comp_bits[g].assign(static_cast<size_t>(fits[g].pca.basis.size(1)), 0);
  for (size_t it = 0; it < item_at.size(); ++it)
    for (int64_t i = 0; i < item_size[it]; ++i)
      comp_bits[item_at[it].first][item_at[it].second + i] = a.bits[it];
  double kept_var = 0;
  for (size_t g = 0; g < fits.size(); ++g) {
    const Fit& f = fits[g];
    Group G;
    G.offset = static_cast<int64_t>(g) * gdim;
    G.dim = gdim;
    G.rank = f.pca.basis.size(1);
    G.mean = f.pca.mean.to(at::kFloat).contiguous();
    std::vector<int64_t> used;
    for (int64_t i = 0; i < G.rank; ++i) {
      const int b = comp_bits[g][i];
      if (b == 0) continue;
      used.push_back(i);
      G.bits.push_back(b);
      const size_t w =
          static_cast<size_t>(std::find(widths.begin(), widths.end(), b) - widths.begin());
      G.step.push_back(f.step[i][w]);
      kept_var += f.pca.variance[i].item<double>();
    }
    at::Tensor idx = at::tensor(used, at::TensorOptions().dtype(at::kLong));
    G.basis = used.empty() ? at::zeros({gdim, 0}, at::kFloat)
                           : f.pca.basis.index_select(1, idx).to(at::kFloat).contiguous();
    t.components_used += static_cast<int64_t>(used.size());
    t.groups.push_back(std::move(G));
  }
  t.energy_top_used = t.total_variance > 0 ? kept_var / t.total_variance : 1.0;
  return t;
}

// ---------------------------------------------------------------- blocks

int64_t packed_block_bytes(const KindTransform& t, int64_t n) {
  return (t.code_bits_per_token * n + 7) / 8;
}

std::vector<uint8_t> pack_block(const KindTransform& t, const float* x, int64_t n) {
  BitWriter bw;
  at::Tensor X = at::from_blob(const_cast<float*>(x), {n, t.width}, at::kFloat);
  for (const Group& g : t.groups) {
    const int64_t used = g.basis.size(1);
    if (used == 0) continue;
    at::Tensor Y =
        at::mm(X.narrow(1, g.offset, g.dim) - g.mean, g.basis).contiguous();  // [n, used]
    const float* y = Y.data_ptr<float>();
    // Component-major: a component's codes are adjacent (similar statistics for the entropy coder).
    for (int64_t i = 0; i < used; ++i)
      for (int64_t s = 0; s < n; ++s)
        bw.put(quantize(y[s * used + i], g.bits[i], g.step[i]), g.bits[i]);
  }
  KVB_CHECK(bw.bit_count() == t.code_bits_per_token * n, "kvtc: packed ", bw.bit_count(),
            " bits, the allocation says ", t.code_bits_per_token * n);
  return bw.finish();
}

void unpack_block(const KindTransform& t, const uint8_t* packed, size_t bytes, int64_t n,
                  float* coef) {
  KVB_CHECK(static_cast<int64_t>(bytes) == packed_block_bytes(t, n), "kvtc: block of ", bytes,
            " packed bytes for ", n, " tokens (expected ", packed_block_bytes(t, n), ")");
  BitReader br(packed, bytes);
  const int64_t C = t.components_used;
  int64_t c0 = 0;
  for (const Group& g : t.groups) {
    const int64_t used = g.basis.size(1);
    for (int64_t i = 0; i < used; ++i)
      for (int64_t s = 0; s < n; ++s)
        coef[s * C + c0 + i] = dequantize(br.get(g.bits[i]), g.bits[i], g.step[i]);
    c0 += used;
  }
}

void reconstruct(const KindTransform& t, const float* coef, int64_t n, int64_t begin, int64_t end,
                 float* out) {
  at::Tensor Y = at::from_blob(const_cast<float*>(coef), {n, t.components_used}, at::kFloat);
  at::Tensor O = at::from_blob(out, {n, end - begin}, at::kFloat);
  int64_t c0 = 0;
  for (const Group& g : t.groups) {
    const int64_t used = g.basis.size(1);
    const int64_t a = std::max(begin, g.offset), b = std::min(end, g.offset + g.dim);
    if (a < b) {
      at::Tensor dst = O.narrow(1, a - begin, b - a);
      at::Tensor mean = g.mean.narrow(0, a - g.offset, b - a);
      if (used == 0) {
        dst.copy_(mean.unsqueeze(0).expand({n, b - a}));
      } else {
        at::Tensor Vg = g.basis.narrow(0, a - g.offset, b - a);  // [b - a, used]
        dst.copy_(at::addmm(mean.unsqueeze(0), Y.narrow(1, c0, used), Vg.t()));
      }
    }
    c0 += used;
  }
}

}  // namespace kvb::kvtc
