#pragma once
// A store's own forward pass over extra tokens on a fork of a sequence (KVzip's context
// reconstruction, oracle_evict's hindsight): the fork is prefilled without end_prefill and released
// afterwards, so nothing of it is kept; while it runs, `active` holds what the store's attend needs
// to recognise the fork's rows (a Pass with a `fork` member).

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "harness/engine/engine.h"
#include "harness/kv/kv_cache.h"

namespace kvb {

// make_pass(fork id) -> Pass. `active` is reset and the fork released whether the prefill returns or
// throws.
template <class Pass, class MakePass>
void run_on_fork(Engine& engine, int64_t seq, const std::vector<int64_t>& ids,
                 std::optional<Pass>* active, MakePass&& make_pass) {
  const int64_t fork = engine.fork(seq);
  *active = make_pass(fork);
  try {
    engine.prefill({fork}, {ids}, nullptr, /*call_end_prefill=*/false);
  } catch (...) {
    active->reset();
    engine.release(fork);
    throw;
  }
  active->reset();
  engine.release(fork);
}

// rows(first row, row count) for the active fork's rows in this layer call, if any.
template <class Pass, class Rows>
void for_fork_rows(const std::optional<Pass>& active, const LayerInput& in, Rows&& rows) {
  if (!active) return;
  const StepBatch& b = *in.batch;
  for (int64_t i = 0; i < b.batch_size(); ++i)
    if (b.seq_ids[i] == active->fork) rows(b.q_indptr[i], b.new_tokens(i));
}

// The softmax attention of KV head `head`'s query group, for this step's fork rows, over `held`
// keys and then, causally, the step's own keys: [group, rows, m + rows].
//   q [rows, Hq, D], k_new [rows, Hkv, D] (fp32, CPU), held [m, D].
at::Tensor fork_rows_attention(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& held,
                               int64_t head, int64_t group, double sm_scale);

}  // namespace kvb
