// The CUDA kernels (kernels/cuda) against their oracles (kernels/ref), on the sizes of DESIGN.md
// §9: lengths 1/54/97/2048, partial last pages (page sizes 16 and 7), GQA groups 1/2/4/5/8 (every
// compiled width and its idle-lane variants), head_dim 64/128, fp16 and bf16, split-K off / planned
// / forced (so the merge runs), fresh random inputs per case and NaN-poisoned outputs. Relative
// error
// ||out - ref|| / ||ref|| <= 1e-3 for fp16 I/O (bf16: 1e-2, its output rounding alone is ~4e-3).
// Appends are compared byte for byte. Without a CUDA device the device tests skip ("no CUDA
// device"); the CudaPlan / CudaSupport tests need no device and always run.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "decode_test_util.h"
#include "kvb/kernels/kv_append.h"
#include "kvb_cuda.cuh"

namespace kvb::kernels {
namespace {

namespace kc = kvb::kernels::cuda;
using testing::nan_bits;
using testing::rel_err;

bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

// A device copy of a host vector (at least one element, so that empty lists are non-null).
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)) !=
        cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc of " << n * sizeof(T) << " bytes failed";
      p_ = nullptr;
    }
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
    if (p_ && !h.empty())
      EXPECT_EQ(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
                cudaSuccess);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p_) cudaFree(p_);
  }
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (p_ && n_)
      EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
  }
};

const std::vector<int32_t> kLens = {1, 54, 97, 2048};
double tolerance(KvDtype d) { return d == KvDtype::kF16 ? 1e-3 : 1e-2; }

std::vector<uint16_t> host_decode_ref(const testing::PagedCache& c) {
  std::vector<uint16_t> o(c.out_elems(), nan_bits(c.dtype));
  const DecodeAttentionParams p = c.params(o.data());
  EXPECT_EQ(decode_attention_check(p), "");
  decode_attention_ref(p);
  return o;
}

// Runs the CUDA decode; splits: 0 = planned, >= 1 = forced. *used_splits gets the plan's count.
// plan_len >= 0 plans from that max_scan_len instead of the true one.
std::vector<uint16_t> cuda_decode(const testing::PagedCache& c, int32_t splits, int* used_splits,
                                  int32_t plan_len = -1,
                                  kc::DecodeKernel kernel = kc::DecodeKernel::kCudaCores) {
  Dev<uint16_t> q(c.q), k(c.k), v(c.v), o(std::vector<uint16_t>(c.out_elems(), nan_bits(c.dtype)));
  Dev<int32_t> pi(c.page_indptr), px(c.page_indices), lens(c.kv_lens), gp(c.gather_indptr),
      gx(c.gather_indices);
  DecodeAttentionParams p = c.params(nullptr);
  p.q = q.get();
  p.o = o.get();
  p.k_pages = k.get();
  p.v_pages = v.get();
  p.page_indptr = pi.get();
  p.page_indices = px.get();
  p.kv_lens = lens.get();
  if (p.gather != GatherMode::kNone) {
    p.gather_indptr = gp.get();
    p.gather_indices = gx.get();
  }
  std::string why;
  EXPECT_TRUE(kc::decode_attention_supported(p, &why)) << why;
  if (plan_len >= 0) p.max_scan_len = plan_len;
  const kc::DecodePlan plan = kc::decode_attention_plan(p, splits);
  *used_splits = plan.num_splits;
  Dev<uint8_t> ws(plan.workspace_bytes);
  EXPECT_EQ(kc::decode_attention_cuda(p, plan, ws.get(), nullptr, kernel), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return o.host();
}

// Both kernels (CUDA cores, tensor cores), unsplit, planned and forced splits.
void expect_close(const testing::PagedCache& c, const std::vector<uint16_t>& ref,
                  const std::string& what) {
  for (auto kernel : {kc::DecodeKernel::kCudaCores, kc::DecodeKernel::kTensorCores})
    for (int32_t splits : {1, 0, 5}) {
      const std::string run = what +
                              (kernel == kc::DecodeKernel::kTensorCores ? " tensor cores" : "") +
                              " splits " + std::to_string(splits);
      int used = 0;
      const auto out = cuda_decode(c, splits, &used, -1, kernel);
      if (splits == 5) EXPECT_GT(used, 1) << run << ": forced split did not split";
      EXPECT_TRUE(testing::all_finite(out, c.dtype)) << run << ": unwritten (NaN) outputs";
      const double err = rel_err(out, ref, c.dtype);
      EXPECT_LE(err, tolerance(c.dtype)) << run << " (used " << used << ")";
      // The tensor-core kernel splits q and the weights into head + tail: fp32-level agreement
      // (the emulator measured at most 4e-6 fp16 and 6e-5 bf16, outputs rounded to bf16 included).
      if (kernel == kc::DecodeKernel::kTensorCores)
        EXPECT_LE(err, c.dtype == KvDtype::kF16 ? 5e-5 : 2e-4) << run;
    }
}

TEST_F(CudaKernels, PagedDecodeMatchesOracle) {
  uint32_t seed = 1;
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16})
    for (int hd : {64, 128})
      for (int group : {1, 2, 4, 5, 8})
        for (int ps : {16, 7}) {
          std::mt19937 rng(seed++);
          auto c = testing::make_paged_cache(dt, kLens, 2, group, hd, ps, rng);
          expect_close(c, host_decode_ref(c),
                       std::string(kv_dtype_name(dt)) + " hd " + std::to_string(hd) + " group " +
                           std::to_string(group) + " page " + std::to_string(ps));
        }
}

TEST_F(CudaKernels, PagedDecodeEmptySequenceGivesZeros) {
  std::mt19937 rng(2);
  auto c = testing::make_paged_cache(KvDtype::kF16, {0, 300}, 2, 4, 128, 16, rng);
  const auto ref = host_decode_ref(c);
  expect_close(c, ref, "empty sequence");
  int used = 0;
  const auto out = cuda_decode(c, 3, &used);
  for (int i = 0; i < 8 * 128; ++i) ASSERT_EQ(testing::from_bits(out[i], KvDtype::kF16), 0.f) << i;
}

// A plan made from a bound below the longest sequence (a stale max_scan_len) is slower, never
// wrong: the last split runs to the end of every sequence.
TEST_F(CudaKernels, PlanFromATooSmallBoundStaysCorrect) {
  std::mt19937 rng(3);
  auto c = testing::make_paged_cache(KvDtype::kF16, kLens, 2, 4, 128, 16, rng);
  const auto ref = host_decode_ref(c);
  int used = 0;
  const auto out = cuda_decode(c, 4, &used, /*plan_len=*/256);
  EXPECT_GT(used, 1);
  EXPECT_LE(rel_err(out, ref, c.dtype), tolerance(c.dtype));
}

TEST_F(CudaKernels, GatheredTokensMatchOracle) {
  uint32_t seed = 100;
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16})
    for (int hd : {64, 128})
      for (int group : {1, 4, 8}) {
        std::mt19937 rng(seed++);
        auto c = testing::make_paged_cache(dt, kLens, 2, group, hd, 16, rng);
        testing::set_token_gather(c, 0.3, rng, group == 4 ? 2 : -1);
        expect_close(c, host_decode_ref(c),
                     std::string("tokens ") + kv_dtype_name(dt) + " hd " + std::to_string(hd) +
                         " g " + std::to_string(group));
      }
}

TEST_F(CudaKernels, GatheredPagesMatchOracle) {
  uint32_t seed = 200;
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16})
    for (int hd : {64, 128})
      for (int ps : {16, 7}) {
        std::mt19937 rng(seed++);
        auto c = testing::make_paged_cache(dt, kLens, 2, 4, hd, ps, rng);
        testing::set_page_gather(c, 0.4, rng, hd == 64 ? 1 : -1);
        expect_close(c, host_decode_ref(c),
                     std::string("pages ") + kv_dtype_name(dt) + " hd " + std::to_string(hd) +
                         " ps " + std::to_string(ps));
      }
}

TEST_F(CudaKernels, MergeMatchesOracle) {
  std::mt19937 rng(300);
  std::normal_distribution<float> nd(0.f, 2.f);
  const int rows = 37, S = 9, D = 128;
  std::vector<float> po(rows * S * D), pm(rows * S), pl(rows * S);
  for (auto& x : po) x = nd(rng);
  for (int i = 0; i < rows * S; ++i) {
    const bool empty = i % 5 == 0;
    pm[i] = empty ? -INFINITY : nd(rng);
    pl[i] = empty ? 0.f : 1.f + std::fabs(nd(rng)) * 10.f;
  }
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16, KvDtype::kF32}) {
    const size_t eb = kv_dtype_bytes(dt);
    std::vector<uint8_t> ref(rows * D * eb);
    std::vector<float> lse_ref(rows);
    AttentionMergeParams p{po.data(),      pm.data(), pl.data(), ref.data(), dt,
                           lse_ref.data(), rows,      S,         D};
    attention_merge_ref(p);
    Dev<float> dpo(po), dpm(pm), dpl(pl), dlse(rows);
    Dev<uint8_t> dout(std::vector<uint8_t>(rows * D * eb, 0xff));
    AttentionMergeParams dp{dpo.get(),  dpm.get(), dpl.get(), dout.get(), dt,
                            dlse.get(), rows,      S,         D};
    ASSERT_EQ(kc::attention_merge_cuda(dp, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto out = dout.host();
    const auto lse = dlse.host();
    double num = 0, den = 0;
    for (int i = 0; i < rows * D; ++i) {
      float a, b;
      if (dt == KvDtype::kF32) {
        std::memcpy(&a, out.data() + 4 * i, 4);
        std::memcpy(&b, ref.data() + 4 * i, 4);
      } else {
        uint16_t x, y;
        std::memcpy(&x, out.data() + 2 * i, 2);
        std::memcpy(&y, ref.data() + 2 * i, 2);
        a = testing::from_bits(x, dt);
        b = testing::from_bits(y, dt);
      }
      ASSERT_TRUE(std::isfinite(a)) << i;
      num += (a - b) * (a - b);
      den += b * b;
    }
    EXPECT_LE(std::sqrt(num / den), dt == KvDtype::kF32 ? 1e-5 : tolerance(dt))
        << kv_dtype_name(dt);
    for (int r = 0; r < rows; ++r) EXPECT_NEAR(lse[r], lse_ref[r], 1e-4f) << r;
  }
}

// ---- KIVI ----

struct KiviCase {
  int bits, hd, group, ps, R, vg;
};
const std::vector<KiviCase> kKiviCases = {{2, 128, 4, 32, 128, 32}, {4, 64, 1, 16, 0, 32},
                                          {8, 128, 8, 32, 64, 32},  {2, 64, 8, 16, 32, 8},
                                          {4, 128, 4, 16, 48, 16},  {8, 64, 4, 32, 0, 64},
                                          {2, 128, 1, 32, 128, 32}, {4, 64, 2, 32, 128, 32}};

KiviLayout layout_of(const KiviCase& k) {
  KiviLayout L;
  L.num_kv_heads = 2;
  L.head_dim = k.hd;
  L.page_size = k.ps;
  L.k_bits = L.v_bits = k.bits;
  L.v_group_size = k.vg;
  L.residual_length = k.R;
  return L;
}

// Device mirror of a host KIVI store.
struct DevKivi {
  Dev<uint8_t> kc, vc;
  Dev<uint16_t> ks, km, vs, vm, kr, vr, q;
  Dev<int32_t> pi, px, lens;
  explicit DevKivi(const testing::KiviStore& s)
      : kc(s.k_codes),
        vc(s.v_codes),
        ks(s.k_scales),
        km(s.k_mins),
        vs(s.v_scales),
        vm(s.v_mins),
        kr(s.k_res),
        vr(s.v_res),
        q(s.q),
        pi(s.page_indptr),
        px(s.page_indices),
        lens(s.kv_lens) {}
  void point(KiviDecodeParams& p) const {
    p.q = q.get();
    p.k_codes = kc.get();
    p.k_scales = ks.get();
    p.k_mins = km.get();
    p.v_codes = vc.get();
    p.v_scales = vs.get();
    p.v_mins = vm.get();
    p.k_residual = kr.get();
    p.v_residual = vr.get();
    p.page_indptr = pi.get();
    p.page_indices = px.get();
    p.kv_lens = lens.get();
  }
};

TEST_F(CudaKernels, KiviDecodeMatchesOracle) {
  uint32_t seed = 700;
  for (const KiviCase& k : kKiviCases)
    for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16}) {
      std::mt19937 rng(seed++);
      auto s = testing::make_kivi_store(dt, layout_of(k), k.group, 4, 2048, rng);
      testing::kivi_append_random(s, kLens, rng, kivi_append_cpu);
      s.q = testing::random_bits(s.out_elems(), dt, rng);
      std::vector<uint16_t> ref(s.out_elems(), nan_bits(dt));
      ASSERT_EQ(kivi_decode_check(s.decode_params(ref.data())), "");
      kivi_decode_ref(s.decode_params(ref.data()));
      DevKivi d(s);
      const std::string what = std::string(kv_dtype_name(dt)) + " bits " + std::to_string(k.bits) +
                               " hd " + std::to_string(k.hd) + " g " + std::to_string(k.group) +
                               " ps " + std::to_string(k.ps) + " R " + std::to_string(k.R) +
                               " vg " + std::to_string(k.vg);
      // Both kernels (the tensor-core one where the layout allows it); splits: 1, planned, forced
      // 3, and forced 3 planned from a too-small max_kv_len (-3).
      for (auto kernel : {kc::KiviDecodeKernel::kCudaCores, kc::KiviDecodeKernel::kTensorCores})
        for (int32_t splits : {1, 0, 3, -3}) {
          const std::string run =
              what + (kernel == kc::KiviDecodeKernel::kTensorCores ? " tensor cores" : "") +
              " splits " + std::to_string(splits);
          Dev<uint16_t> o(std::vector<uint16_t>(s.out_elems(), nan_bits(dt)));
          KiviDecodeParams p = s.decode_params(o.get());
          d.point(p);
          std::string why;
          ASSERT_TRUE(kc::kivi_decode_supported(p, &why)) << what << ": " << why;
          if (kernel == kc::KiviDecodeKernel::kTensorCores) {
            const bool tc = kc::kivi_decode_tc_supported(p, &why);
            ASSERT_EQ(tc, k.ps % 16 == 0 && k.vg % 16 == 0) << run << ": " << why;
            if (!tc) {
              EXPECT_EQ(
                  kc::kivi_decode_cuda(p, kc::kivi_decode_plan(p, 1), nullptr, nullptr, kernel),
                  cudaErrorInvalidValue);
              continue;
            }
          }
          if (splits < 0) p.max_kv_len = 3 * k.ps;
          const kc::DecodePlan plan = kc::kivi_decode_plan(p, std::abs(splits));
          if (splits != 1 && splits != 0) EXPECT_GT(plan.num_splits, 1) << run;
          Dev<uint8_t> ws(plan.workspace_bytes);
          ASSERT_EQ(kc::kivi_decode_cuda(p, plan, ws.get(), nullptr, kernel), cudaSuccess) << run;
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << run;
          const auto out = o.host();
          EXPECT_TRUE(testing::all_finite(out, dt)) << run;
          EXPECT_LE(rel_err(out, ref, dt), tolerance(dt)) << run;
          // The tensor-core kernel splits its fp16 operands into head + tail: fp32-level agreement
          // (fp16 operands alone measured 3e-5 to 3e-4 in the emulator, with the tails
          // below 3.1e-5).
          if (kernel == kc::KiviDecodeKernel::kTensorCores)
            EXPECT_LE(rel_err(out, ref, dt), dt == KvDtype::kF16 ? 5e-5 : 1e-4) << run;
        }
    }
}

// The device append writes the same bytes as the oracle (codes, scales, mins, rings), across
// prefill-sized chunks and decode steps that cross every chunk and page boundary.
TEST_F(CudaKernels, KiviAppendBitIdenticalToOracle) {
  uint32_t seed = 900;
  for (const KiviCase& k : kKiviCases)
    for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16}) {
      std::mt19937 rng(seed++);
      auto s = testing::make_kivi_store(dt, layout_of(k), k.group, 3, 600, rng);
      for (const std::vector<int32_t>& add :
           {std::vector<int32_t>{1, 54, 97}, {1, 1, 1}, {130, 2, 64}, {1, 0, 1}, {33, 77, 129}}) {
        std::vector<int32_t> indptr(1, 0);
        for (int32_t a : add) indptr.push_back(indptr.back() + a);
        const size_t n = static_cast<size_t>(indptr.back()) * s.L.num_kv_heads * s.L.head_dim;
        const auto k_new = testing::random_bits(n, dt, rng),
                   v_new = testing::random_bits(n, dt, rng);
        s.grow_pages(add);
        DevKivi d(s);
        Dev<uint16_t> dk(k_new), dv(v_new);
        Dev<int32_t> dind(indptr);
        KiviAppendParams p = s.append_params(k_new, v_new, indptr);
        ASSERT_EQ(kivi_append_check(p), "");
        p.k_new = dk.get();
        p.v_new = dv.get();
        p.new_indptr = dind.get();
        p.kv_lens = d.lens.get();
        p.k_codes = d.kc.get();
        p.k_scales = d.ks.get();
        p.k_mins = d.km.get();
        p.v_codes = d.vc.get();
        p.v_scales = d.vs.get();
        p.v_mins = d.vm.get();
        p.k_residual = d.kr.get();
        p.v_residual = d.vr.get();
        p.page_indptr = d.pi.get();
        p.page_indices = d.px.get();
        std::string why;
        ASSERT_TRUE(kc::kivi_append_supported(p, &why)) << why;
        ASSERT_EQ(kc::kivi_append_cuda(p, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        kivi_append_ref(
            s.append_params(k_new, v_new, indptr));  // the host store advances by the oracle
        for (int b = 0; b < s.batch(); ++b) s.kv_lens[b] += add[b];
        const std::string what = std::string(kv_dtype_name(dt)) + " bits " +
                                 std::to_string(k.bits) + " R " + std::to_string(k.R) +
                                 " after adding " + std::to_string(add[0]);
        ASSERT_EQ(d.kc.host(), s.k_codes) << what;
        ASSERT_EQ(d.vc.host(), s.v_codes) << what;
        ASSERT_EQ(d.ks.host(), s.k_scales) << what;
        ASSERT_EQ(d.km.host(), s.k_mins) << what;
        ASSERT_EQ(d.vs.host(), s.v_scales) << what;
        ASSERT_EQ(d.vm.host(), s.v_mins) << what;
        ASSERT_EQ(d.kr.host(), s.k_res) << what;
        ASSERT_EQ(d.vr.host(), s.v_res) << what;
      }
    }
}

TEST_F(CudaKernels, PagedAppendMatchesOracle) {
  std::mt19937 rng(1000);
  const int H = 8, D = 128, ps = 16;
  std::vector<int32_t> before = {0, 17, 2047}, add = {54, 1, 2}, indptr = {0}, pindptr = {0};
  int total = 0;
  for (int b = 0; b < 3; ++b) {
    indptr.push_back(indptr.back() + add[b]);
    total += (before[b] + add[b] + ps - 1) / ps;
    pindptr.push_back(total);
  }
  const auto pages = testing::shuffled_pages(total, 4, rng);
  const size_t n = static_cast<size_t>(indptr.back()) * H * D,
               pool = static_cast<size_t>(total + 4) * ps * H * D;
  for (KvDtype dt : {KvDtype::kF16, KvDtype::kBF16}) {
    const auto k_new = testing::random_bits(n, dt, rng), v_new = testing::random_bits(n, dt, rng);
    auto kp = testing::random_bits(pool, dt, rng), vp = testing::random_bits(pool, dt, rng);
    Dev<uint16_t> dk(k_new), dv(v_new), dkp(kp), dvp(vp);
    Dev<int32_t> dind(indptr), dbef(before), dpi(pindptr), dpx(pages);
    PagedAppendParams p{dt,
                        dt,
                        k_new.data(),
                        v_new.data(),
                        indptr.data(),
                        before.data(),
                        kp.data(),
                        vp.data(),
                        pindptr.data(),
                        pages.data(),
                        3,
                        H,
                        D,
                        ps};
    ASSERT_EQ(paged_append_check(p), "");
    paged_append_ref(p);
    PagedAppendParams dp{dt,         dt,        dk.get(),  dv.get(),  dind.get(),
                         dbef.get(), dkp.get(), dvp.get(), dpi.get(), dpx.get(),
                         3,          H,         D,         ps};
    ASSERT_EQ(kc::paged_append_cuda(dp, indptr.back(), nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(dkp.host(), kp);
    EXPECT_EQ(dvp.host(), vp);
  }
}

// ---- no device needed ----

TEST(CudaSupport, ReportsWhatIsNotCompiled) {
  std::mt19937 rng(1);
  auto c = testing::make_paged_cache(KvDtype::kF16, {10}, 2, 4, 64, 16, rng);
  std::vector<uint16_t> o(c.out_elems());
  DecodeAttentionParams p = c.params(o.data());
  std::string why;
  EXPECT_TRUE(kc::decode_attention_supported(p, &why)) << why;
  p.head_dim = 96;
  EXPECT_FALSE(kc::decode_attention_supported(p, &why));
  EXPECT_NE(why.find("head_dim 96"), std::string::npos) << why;
  EXPECT_EQ(kc::decode_attention_cuda(p, kc::DecodePlan{}, nullptr, nullptr),
            cudaErrorInvalidValue);
  p = c.params(o.data());
  p.num_qo_heads = 32;  // group 16
  EXPECT_FALSE(kc::decode_attention_supported(p, &why));
  EXPECT_NE(why.find("group 16"), std::string::npos) << why;
  p = c.params(o.data());
  p.dtype = KvDtype::kF32;
  EXPECT_FALSE(kc::decode_attention_supported(p, &why));
  p = c.params(o.data());
  p.k_pages = reinterpret_cast<const char*>(p.k_pages) + 2;
  EXPECT_FALSE(kc::decode_attention_supported(p, &why));
  EXPECT_NE(why.find("aligned"), std::string::npos) << why;

  KiviDecodeParams kp;
  kp.layout.num_kv_heads = 2;
  kp.layout.head_dim = 128;
  kp.layout.k_bits = 4;
  kp.layout.v_bits = 2;
  kp.num_qo_heads = 8;
  EXPECT_FALSE(kc::kivi_decode_supported(kp, &why));
  EXPECT_NE(why.find("k_bits 4 != v_bits 2"), std::string::npos) << why;
  kp.layout.k_bits = 3;
  EXPECT_FALSE(kc::kivi_decode_supported(kp, &why));
  EXPECT_NE(why.find("not supported"), std::string::npos) << why;
}

TEST(CudaPlan, SplitsFillTheChipAndCoverEveryPosition) {
  std::mt19937 rng(2);
  auto c = testing::make_paged_cache(KvDtype::kF16, {1, 2048}, 8, 4, 128, 16, rng);
  std::vector<uint16_t> o(c.out_elems());
  DecodeAttentionParams p = c.params(o.data());
  p.max_scan_len = 32768;
  const kc::DecodePlan plan = kc::decode_attention_plan(p, 0, 132);
  EXPECT_GE(static_cast<int64_t>(plan.num_splits) * p.batch_size * p.num_kv_heads, 132);
  EXPECT_GE(static_cast<int64_t>(plan.num_splits) * plan.chunk, 32768);
  EXPECT_EQ(plan.chunk % 64, 0);
  EXPECT_GE(plan.chunk, 256);
  EXPECT_GT(plan.workspace_bytes, 0u);
  p.max_scan_len = 100;  // short: no split
  EXPECT_EQ(kc::decode_attention_plan(p, 0, 132).num_splits, 1);
  EXPECT_EQ(kc::decode_attention_plan(p, 0, 132).workspace_bytes, 0u);
  EXPECT_EQ(kc::decode_attention_plan(p, 7, 132).num_splits,
            2);        // forced, clamped to 64-position chunks
  p.max_scan_len = 0;  // unknown
  EXPECT_EQ(kc::decode_attention_plan(p, 0, 132).num_splits, 1);

  KiviDecodeParams kp;
  kp.layout.num_kv_heads = 8;
  kp.layout.head_dim = 128;
  kp.layout.page_size = 32;
  kp.num_qo_heads = 32;
  kp.batch_size = 1;
  kp.max_kv_len = 65536;
  const kc::DecodePlan kplan = kc::kivi_decode_plan(kp, 0, 132);
  EXPECT_GT(kplan.num_splits, 1);
  EXPECT_EQ(kplan.chunk % 32, 0);
  EXPECT_GE(static_cast<int64_t>(kplan.num_splits) * kplan.chunk, 65536);
}

}  // namespace
}  // namespace kvb::kernels
