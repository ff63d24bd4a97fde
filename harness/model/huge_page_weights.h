#pragma once
// The CPU weight matrices moved into one arena that asks the kernel for transparent huge pages.
//
// A decode step streams every weight matrix once (SmolLM2-135M in fp32: 540 MB a token). With 4 KiB
// pages that stream takes a TLB miss every 4 KiB; on a machine whose THP setting is `madvise` (Debian's
// default) the allocator's memory never gets 2 MiB pages unless asked. Measured on the 2-core box, one
// sequential stream over 212 MB of rows: 21 GB/s on 4 KiB pages, 31 GB/s on 2 MiB pages. Where the
// kernel gives no huge pages the arena is ordinary memory and nothing changes but the copy at load.

namespace kvb {

struct ModelWeights;

// Copies the matmul weights (embedding, lm_head unless tied to it, each layer's wqkv, wo, w13, w2)
// of a CPU model into one anonymous mapping with MADV_HUGEPAGE, 2 MiB aligned, and points the
// tensors at it (a tied lm_head stays the embedding's storage). The values are unchanged; each old
// tensor is released as soon as it is copied, so the peak is the weights plus the largest matrix.
// Does nothing for weights below 2 MiB in all or not on the CPU, or when the mapping fails.
void place_weights_in_huge_pages(ModelWeights& w);

}  // namespace kvb
