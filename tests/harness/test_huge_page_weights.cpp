// The CPU weight arena: the matrices keep their values and shapes, sit in one 2 MiB-aligned
// mapping (each on a cache line), a tied lm_head stays the embedding's storage, and the forward pass
// computes the same bits as before the move.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "harness/engine/engine.h"
#include "harness/model/huge_page_weights.h"
#include "harness/model/model.h"

namespace kvb {
namespace {

bool equal_values(const ModelWeights& a, const ModelWeights& b) {
  bool same = at::equal(a.embedding, b.embedding) && at::equal(a.lm_head, b.lm_head);
  for (size_t l = 0; l < a.layers.size(); ++l)
    for (auto m : {&LayerWeights::wqkv, &LayerWeights::wo, &LayerWeights::w13, &LayerWeights::w2})
      same = same && at::equal(a.layers[l].*m, b.layers[l].*m);
  return same;
}

ModelWeights clone(const ModelWeights& w) {
  ModelWeights c = w;
  c.embedding = w.embedding.clone();
  c.lm_head = w.lm_head.data_ptr() == w.embedding.data_ptr() ? c.embedding : w.lm_head.clone();
  for (auto& L : c.layers)
    for (at::Tensor* t : {&L.wqkv, &L.wo, &L.w13, &L.w2}) *t = t->clone();
  return c;
}

TEST(HugePageWeights, MatricesMoveIntoOneAlignedArenaWithTheirValues) {
  ModelWeights w;
  at::manual_seed(7);
  w.embedding = at::randn({1000, 96});
  w.lm_head = at::randn({1000, 96});  // untied
  for (int l = 0; l < 3; ++l) {
    LayerWeights L;
    L.wqkv = at::randn({160, 96});
    L.wo = at::randn({96, 96});
    L.w13 = at::randn({2 * 1001, 96});  // an odd row count: the next tensor still starts on a line
    L.w2 = at::randn({96, 1001});
    w.layers.push_back(L);
  }
  const ModelWeights before = clone(w);
  place_weights_in_huge_pages(w);
  EXPECT_TRUE(equal_values(w, before));

  std::vector<const at::Tensor*> mats = {&w.embedding, &w.lm_head};
  for (auto& L : w.layers)
    for (const at::Tensor* t : {&L.wqkv, &L.wo, &L.w13, &L.w2}) mats.push_back(t);
  const auto start = reinterpret_cast<uintptr_t>(w.embedding.data_ptr());
  EXPECT_EQ(start % (uintptr_t{2} << 20), 0u) << "the arena starts on a 2 MiB boundary";
  uintptr_t end = start;
  for (const at::Tensor* t : mats) {
    const auto p = reinterpret_cast<uintptr_t>(t->data_ptr());
    EXPECT_EQ(p % 64, 0u);
    EXPECT_GE(p, end) << "tensors follow each other in the arena";
    end = p + t->nbytes();
  }
}

TEST(HugePageWeights, ATiedHeadStaysTheEmbeddingAndSmallModelsStayWhereTheyAre) {
  ModelWeights w;
  w.embedding = at::randn({4096, 160});  // 2.5 MiB
  w.lm_head = w.embedding;
  place_weights_in_huge_pages(w);
  EXPECT_EQ(w.lm_head.data_ptr(), w.embedding.data_ptr());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.embedding.data_ptr()) % (uintptr_t{2} << 20), 0u);

  ModelWeights small;
  small.embedding = at::randn({16, 8});
  small.lm_head = small.embedding;
  const void* where = small.embedding.data_ptr();
  place_weights_in_huge_pages(small);
  EXPECT_EQ(small.embedding.data_ptr(), where) << "below 2 MiB nothing moves";
}

// load_model moves a CPU model's weights; the logits equal those of the same weights in ordinary
// memory, bit for bit.
TEST(HugePageWeights, ALoadedModelScoresTheSameBitsFromTheArena) {
  auto model = load_model("synthetic:small");  // about 70 MB of fp32 weights
  const auto arena = reinterpret_cast<uintptr_t>(model->weights.embedding.data_ptr());
  EXPECT_EQ(arena % (uintptr_t{2} << 20), 0u) << "load_model placed the weights in the arena";
  auto copy = std::make_shared<Model>(*model);
  copy->weights = clone(model->weights);
  ASSERT_NE(copy->weights.layers[0].w13.data_ptr(), model->weights.layers[0].w13.data_ptr());
  std::vector<int64_t> ids(40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % 4096);
  Engine a(model, make_default_kv(*model)), b(copy, make_default_kv(*copy));
  EXPECT_EQ(a.score(ids).nll_sum, b.score(ids).nll_sum);
}

}  // namespace
}  // namespace kvb
