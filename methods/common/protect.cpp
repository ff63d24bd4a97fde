#include "methods/common/protect.h"

#include <algorithm>
#include <cmath>

namespace kvb {

HeadSplit split_head(const Protect& protect, const LayerView& layer, const HeadView& head,
                     int64_t budget) {
  const int64_t len = head.len;
  HeadSplit s;
  int64_t n_sinks = 0;  // storage is in token order: the sinks are the leading slots
  while (n_sinks < len && head.idx[n_sinks] < protect.sinks) ++n_sinks;
  const int64_t rest = std::max<int64_t>(0, budget - n_sinks);
  // The observation window is a suffix of the slots (token indices >= seen - window).
  int64_t win_from = len;
  if (protect.observation_window) {
    const int64_t first_window_idx = layer.seen - layer.window;
    while (win_from > n_sinks && head.idx[win_from - 1] >= first_window_idx) --win_from;
  }
  const int64_t keep_window = std::min(len - win_from, rest);
  const int64_t recent_share = std::max<int64_t>(
      0, static_cast<int64_t>(
             std::floor(protect.recent_fraction * static_cast<double>(budget) + 1e-9)));
  const int64_t recent = std::min(rest - keep_window, recent_share + protect.recent_tokens);
  const int64_t recent_from = std::max(n_sinks, win_from - recent);
  for (int64_t j = 0; j < n_sinks; ++j) s.kept.push_back(j);
  for (int64_t j = recent_from; j < win_from; ++j) s.kept.push_back(j);
  for (int64_t j = len - keep_window; j < len; ++j) s.kept.push_back(j);
  for (int64_t j = n_sinks; j < recent_from; ++j) s.candidates.push_back(j);
  s.room = std::max<int64_t>(0, rest - keep_window - (win_from - recent_from));
  return s;
}

}  // namespace kvb
