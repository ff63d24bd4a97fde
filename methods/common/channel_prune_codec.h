#pragma once
// Key channel pruning as a codec (SparK and its structured baseline ThinK). Keys of the prompt's
// kept tokens lose a fraction rho of their head_dim channels; values and decode-time keys are stored
// in full. The store hands the key streams the observation window's per-channel query energy n_c
// (CodecStream::set_query_energy) right before the prompt's kept rows arrive; only that append is
// pruned.
//
//   spark (unstructured, per token; Xnhyacinth/SparK spark_press.py, average recovery): saliency
//         s_tc = k_tc^2 * n_c; each token keeps its own top T = D - floor(rho D) channels; m_t = mean
//         of s over the pruned channels; a pruned entry reads back as sign_tc * sqrt(m_t / n_c)
//         (recovery "average"; 1 sign bit per pruned entry is stored and counted) or 0 ("zero").
//         Stored per pruned row: T values, a D-bit channel mask, m_t (fp16), the sign bits.
//   think (structured, per head; ThinK): score_c = mean_window(q_c^2) * mean_tokens(k_c^2) over the
//         prompt's kept tokens; the lowest floor(rho D) channels are dropped for all of them (zero
//         fill). Stored: T values per row, one D-bit mask per head.
// Kept values are stored at `dtype` (the model's on CPU fp32 runs). The query energy (D fp32) is
// kept per head as metadata (recovery needs it).
//
// Stacked on an inner codec (spec.inner, e.g. KIVI-2: channel pruning, then quantization of what it
// keeps): the pruned rows' kept values ([rows, T], T = D - floor(rho D)) go to one inner key stream of
// width T, the unpruned key rows (decode-time tokens) to an inner key stream of width D, values to the
// inner codec's value stream; masks, m_t and signs are stored as without it. Each inner stream has
// its own full-precision residual. The inner codec's key layout must take rows of T channels (plain
// and per-channel codecs do; a per-token codec's channel groups of head_dim do not). Torch-free.

#include <memory>
#include <string>

#include "methods/common/kv_codec.h"

namespace kvb {

enum class ChannelPruneMode { kSpark, kThink };
enum class ChannelRecovery { kAverage, kZero };

struct ChannelPruneSpec {
  ChannelPruneMode mode = ChannelPruneMode::kSpark;
  double ratio = 0.5;  // rho: fraction of a key's channels pruned
  ChannelRecovery recovery = ChannelRecovery::kAverage;  // spark only; think always zero-fills
  int64_t window = 32;                                   // observation-window queries
  QueryEnergy energy = QueryEnergy::kGroupMean;          // how a GQA group's queries combine
  RowDtype dtype = RowDtype::kF32;                       // storage of kept values (K and V)
  std::shared_ptr<const KvCodec> inner;  // null: kept values at `dtype`; else stored through it
};

// Keys pruned as above, values plain at spec.dtype.
std::shared_ptr<KvCodec> make_channel_prune_codec(const ChannelPruneSpec& spec);

// The channels one token keeps under SparK's rule: the top T = D - floor(rho D) of k_c^2 * n_c
// (ties to the lower channel), ascending. Exposed for tests.
std::vector<int64_t> spark_kept_channels(const float* k, const float* energy, int64_t D,
                                         double ratio);

}  // namespace kvb
