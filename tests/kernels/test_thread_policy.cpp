// The CPU thread policy (kvb/kernels/threads.h): one OpenMP pool, the BLAS held to one thread, and the
// engine's matmul giving the same bits whatever the thread count (its output channels are split over
// threads, each a single-threaded GEMM).

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "harness/engine/thread_policy.h"
#include "kvb/kernels/cpu_ops.h"
#include "kvb/kernels/threads.h"

namespace kvb::kernels {
namespace {

struct RestoreThreads {
  int saved = cpu_threads();
  ~RestoreThreads() { set_cpu_threads(saved); }
};

TEST(ThreadPolicy, OnePoolAndASingleThreadedBlas) {
  RestoreThreads restore;
  set_cpu_threads(3);
  EXPECT_EQ(cpu_threads(), 3);
  EXPECT_EQ(blas_threads(), 1);
  set_cpu_threads(0);  // clamped: never zero threads
  EXPECT_EQ(cpu_threads(), 1);
  kvb::apply_thread_policy(2);
  EXPECT_EQ(cpu_threads(), 2);
  EXPECT_EQ(blas_threads(), 1);
}

TEST(ThreadPolicy, LinearGivesTheSameBitsOnOneOrFourThreads) {
  RestoreThreads restore;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  // Decode-shaped (one row) and prefill-shaped, output widths that split into uneven 64-blocks.
  for (auto [rows, in, out] : {std::array<int64_t, 3>{1, 576, 1000}, {37, 256, 1536}, {1, 64, 70}}) {
    std::vector<float> x(rows * in), w(out * in), bias(out), y1(rows * out), y4(rows * out);
    for (auto* v : {&x, &w, &bias})
      for (auto& e : *v) e = nd(rng);
    for (bool acc : {false, true}) {
      for (size_t i = 0; i < y1.size(); ++i) y1[i] = y4[i] = static_cast<float>(i % 7);
      set_cpu_threads(1);
      linear_f32(x.data(), w.data(), bias.data(), y1.data(), rows, in, out, acc);
      set_cpu_threads(4);
      linear_f32(x.data(), w.data(), bias.data(), y4.data(), rows, in, out, acc);
      for (size_t i = 0; i < y1.size(); ++i)
        ASSERT_EQ(y1[i], y4[i]) << rows << "x" << in << "x" << out << " acc " << acc << " at " << i;
      // And the product itself is right (the split covers every channel once).
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; o += 17) {
          double want = acc ? static_cast<double>((r * out + o) % 7) : 0.0;
          for (int64_t i = 0; i < in; ++i) want += static_cast<double>(x[r * in + i]) * w[o * in + i];
          want += bias[o];
          ASSERT_NEAR(y4[r * out + o], want, 1e-3 * (1 + std::abs(want)));
        }
    }
  }
}

}  // namespace
}  // namespace kvb::kernels
