// The KIVI kernel store end to end on the CUDA kernels, run by the emulator: the shipped
// kvb-testbed (head_dim 64, GQA 2:1) prefills two sequences and decodes them with its KV in the
// KIVI layout. With emulated_cuda_on_cpu() on, every step's quantize-and-append and every decode
// step's attention go through the adapters' CUDA branch to the CUDA kernels (either decode kernel),
// as on a GPU: the store's own GPU-side work (step tables uploaded per step, rings and pools, the
// split plan) is what this adds over the kernel tests. Logits and greedy tokens must match the
// store on the CPU kernels. The same for the paged store in bf16 on either paged decode kernel.
// (This binary links the adapters compiled for the emulator ahead of
// kvb_harness, whose own adapters are then never pulled in.)

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/paged_kv_cache.h"
#include "harness/model/model.h"
#include "kernels/torch/adapter_util.h"
#include "methods/kivi/kivi_kernel_kv_cache.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

std::shared_ptr<Model> testbed() {
  static std::shared_ptr<Model> m =
      load_model((std::filesystem::path(test::fixtures_dir()).parent_path().parent_path() /
                  "models" / "kvb-testbed")
                     .string());
  return m;
}

struct DecodeRun {
  at::Tensor logits;  // [steps * batch, vocab]
  std::map<std::string, double> counters;
};

DecodeRun decode_run(bool emulate, kernels::KiviCudaKernel kernel, int bits) {
  auto m = testbed();
  kernels::emulated_cuda_on_cpu() = emulate;
  kernels::KiviLayout L;
  L.num_kv_heads = static_cast<int32_t>(m->config.n_kv_heads);
  L.head_dim = static_cast<int32_t>(m->config.head_dim);
  L.page_size = 32;
  L.k_bits = L.v_bits = bits;
  L.v_group_size = 32;
  L.residual_length = 64;
  CacheContext ctx{m->config, m->device, m->dtype};
  Engine e(m, std::make_unique<KiviKernelKvCache>(ctx, L, at::kHalf, "kivi",
                                                  std::map<std::string, double>{}, kernel));
  std::vector<int64_t> ids = {e.new_sequence(), e.new_sequence()};
  std::vector<std::vector<int64_t>> prompts(2);
  for (int i = 0; i < 2; ++i) {
    prompts[i].push_back(m->config.bos_id);
    for (int j = 1; j < 230 + 70 * i; ++j) prompts[i].push_back(3 + (j * 37 + i * 11) % 2000);
  }
  e.prefill(ids, prompts);
  std::vector<at::Tensor> rows;
  for (int step = 0; step < 24; ++step)
    rows.push_back(e.decode(ids, {300 + step % 50, 200 + (step * 7) % 90}));
  DecodeRun r{at::cat(rows), e.kv().counters()};
  kernels::emulated_cuda_on_cpu() = false;
  return r;
}

TEST(EngineEmu, KiviKernelStoreDecodesOnTheCudaKernelsAsOnTheCpu) {
  if (!std::filesystem::exists(
          std::filesystem::path(test::fixtures_dir()).parent_path().parent_path() / "models" /
          "kvb-testbed" / "model.safetensors"))
    GTEST_SKIP() << "models/kvb-testbed is not in this checkout";
  for (int bits : {2, 4}) {
    const DecodeRun cpu = decode_run(false, kernels::KiviCudaKernel::kCudaCores, bits);
    const double scale = cpu.logits.abs().max().item<double>();
    for (auto kernel :
         {kernels::KiviCudaKernel::kCudaCores, kernels::KiviCudaKernel::kTensorCores}) {
      const DecodeRun gpu = decode_run(true, kernel, bits);
      const std::string what =
          std::to_string(bits) + " bits, " +
          (kernel == kernels::KiviCudaKernel::kTensorCores ? "tensor cores" : "CUDA cores");
      EXPECT_EQ(gpu.counters.at("decode_kernel_steps"), 24) << what;
      // The same stored bytes (the append is bit-exact); attention differs by summation order.
      EXPECT_LT((gpu.logits - cpu.logits).abs().max().item<double>(), 1e-3 * scale) << what;
      EXPECT_TRUE(gpu.logits.argmax(-1).equal(cpu.logits.argmax(-1))) << what;
    }
  }
}

// The paged store in bf16: its decode steps go to the paged decode kernel (the host one, or with
// the emulator the CUDA one through the adapter, with the block tables uploaded per step).
TEST(EngineEmu, PagedStoreDecodesOnTheCudaKernelAsOnTheCpu) {
  const auto dir = std::filesystem::path(test::fixtures_dir()).parent_path().parent_path() /
                   "models" / "kvb-testbed";
  if (!std::filesystem::exists(dir / "model.safetensors"))
    GTEST_SKIP() << "models/kvb-testbed is not in this checkout";
  LoadOptions lo;
  lo.dtype = "bf16";
  auto m = load_model(dir.string(), lo);
  auto run = [&](bool emulate, kernels::PagedCudaKernel kernel) {
    kernels::emulated_cuda_on_cpu() = emulate;
    PagedKvCache::Options o;
    o.block_size = 16;
    o.cuda_kernel = kernel;
    Engine e(m, std::make_unique<PagedKvCache>(m->config, m->device, m->dtype, o));
    std::vector<int64_t> ids = {e.new_sequence(), e.new_sequence()};
    std::vector<std::vector<int64_t>> prompts(2);
    for (int i = 0; i < 2; ++i) {
      prompts[i].push_back(m->config.bos_id);
      for (int j = 1; j < 97 + 54 * i; ++j) prompts[i].push_back(3 + (j * 53 + i * 7) % 2000);
    }
    e.prefill(ids, prompts);
    std::vector<at::Tensor> rows;
    for (int step = 0; step < 12; ++step)
      rows.push_back(e.decode(ids, {400 + step, 500 + step}).to(at::kFloat));
    kernels::emulated_cuda_on_cpu() = false;
    return at::cat(rows);
  };
  const at::Tensor cpu = run(false, kernels::PagedCudaKernel::kCudaCores);
  const double scale = cpu.abs().max().item<double>();
  for (auto kernel :
       {kernels::PagedCudaKernel::kCudaCores, kernels::PagedCudaKernel::kTensorCores}) {
    const at::Tensor gpu = run(true, kernel);
    // bf16 activations: the kernels' summation orders round differently, a step's error carries
    // into the next.
    EXPECT_LT((gpu - cpu).abs().max().item<double>(), 3e-2 * scale);
    EXPECT_GT(gpu.argmax(-1).eq(cpu.argmax(-1)).to(at::kFloat).mean().item<double>(), 0.9);
  }
  // The CUDA kernel is a CUDA choice: the method refuses it on the CPU.
  CacheContext ctx{m->config, m->device, m->dtype};
  EXPECT_THROW(MethodRegistry::instance().create("paged", ctx, {{"cuda_decode", "tensor_cores"}}),
               Error);
}

}  // namespace
}  // namespace kvb
