#include "harness/model/huge_page_weights.h"

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "harness/model/model.h"

namespace kvb {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 64;  // a cache line: what the kernels' vector loads like

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void place_weights_in_huge_pages(ModelWeights& w) {
  const bool tied = w.lm_head.defined() && w.embedding.defined() &&
                    w.lm_head.data_ptr() == w.embedding.data_ptr();
  std::vector<at::Tensor*> mats = {&w.embedding};
  if (!tied) mats.push_back(&w.lm_head);
  for (LayerWeights& L : w.layers)
    for (at::Tensor* t : {&L.wqkv, &L.wo, &L.w13, &L.w2}) mats.push_back(t);

  std::vector<at::Tensor*> moved;
  size_t total = 0;
  for (at::Tensor* t : mats)
    if (t->defined() && t->device().is_cpu() && t->is_contiguous() && t->numel() > 0) {
      moved.push_back(t);
      total = round_up(total, kAlign) + t->nbytes();
    }
  if (total < kHugePage) return;

  // Over-map by one huge page so that the arena can start on a 2 MiB boundary (the kernel backs
  // only aligned 2 MiB ranges with huge pages).
  const size_t bytes = round_up(total, kHugePage);
  const size_t mapped = bytes + kHugePage;
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return;
  std::shared_ptr<void> arena(base, [mapped](void* p) { ::munmap(p, mapped); });
  auto* start = reinterpret_cast<uint8_t*>(
      round_up(reinterpret_cast<uintptr_t>(base), kHugePage));
  (void)::madvise(start, bytes, MADV_HUGEPAGE);  // advice: without it the arena is plain memory

  size_t off = 0;
  for (at::Tensor* t : moved) {
    off = round_up(off, kAlign);
    uint8_t* dst = start + off;
    std::memcpy(dst, t->data_ptr(), t->nbytes());
    off += t->nbytes();
    // Each tensor holds the arena; the mapping goes when the last of them does.
    *t = at::from_blob(dst, t->sizes(), t->strides(), [arena](void*) {}, t->options());
  }
  if (tied) w.lm_head = w.embedding;
}

}  // namespace kvb
