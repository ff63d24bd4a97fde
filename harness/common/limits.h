#pragma once
// Upper bounds on user-given sizes that would otherwise turn a typo into a hang or a huge
// allocation. Each is checked where the value enters (CLI flag, config key, model file), naming it.
// Torch-free.

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvb {

// CPU threads for LibTorch/OpenMP (--threads, --threads-list, config `threads`). A fixed bound, not
// a multiple of this machine's cores, so that a config valid on one host is valid on every host
// (grids are shared across machines); 1024 is above any single node today (2 x 192 cores x SMT 2 =
// 768) and far below the ~30k threads at which thread creation itself fails or stalls the machine.
constexpr int64_t kMaxThreads = 1024;

// The longest context a model config may declare (max_position_embeddings, llama2.c seq_len, GGUF
// context_length): 2^24 = 16.7M tokens covers every released model (the longest, Llama 4 Scout,
// declares 10M) while keeping per-position tables and int arithmetic far from overflow. RoPE tables
// are not allocated to this length up front; they grow with the positions actually used.
constexpr int64_t kMaxContextTokens = int64_t{1} << 24;

// Components of a dotted config key (--set a.b.c=v, a grid axis or exclude key): each one is a
// level of nesting, so the bound is JSON's (json_parse.h kMaxJsonDepth). A longer path would build
// a config nested deeper than any file may be, and overflow the stack when it is printed or freed.
constexpr size_t kMaxKeyPathComponents = 128;

// Bootstrap resamples of leaderboard and compare (--resamples): each resample is a pass over a
// run's samples, so 10^7 already means minutes on a large run; 10^4 (the default) gives stable 95%
// intervals.
constexpr int64_t kMaxBootstrapResamples = 10000000;

// Throws kvb::Error naming `what` unless 0 <= n <= kMaxThreads (0: LibTorch's default) — or
// 1 <= n when `allow_default` is false.
void check_thread_count(int64_t n, const std::string& what, bool allow_default = true);

}  // namespace kvb
