#include "datasets/token_counter.h"

#include "harness/formats/tokenizer.h"

namespace kvb {

int64_t TokenCounter::count(std::string_view text) {
  if (exact_mode_) return static_cast<int64_t>(tokenizer_.encode(std::string(text)).size());
  // Cut only at a single space between two non-space characters: Llama 2's model keeps runs of
  // spaces and leading/trailing spaces (remove_extra_whitespaces is off; "▁▁" pieces exist), so a
  // run stays inside one segment, and a segment's own dummy-prefix space stands for the space
  // cut before it.
  int64_t total = 0;
  const size_t n = text.size();
  size_t begin = 0;
  std::string key;
  auto flush = [&](size_t end) {
    if (end <= begin) return;
    key.assign(text.data() + begin, end - begin);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      const auto c = static_cast<int32_t>(tokenizer_.encode(key).size());
      it = cache_.emplace(key, c).first;
    }
    total += it->second;
  };
  for (size_t i = 1; i + 1 < n; ++i) {
    if (text[i] == ' ' && text[i - 1] != ' ' && text[i + 1] != ' ') {
      flush(i);
      begin = i + 1;
    }
  }
  flush(n);
  return total;
}

bool TokenCounter::verify(const std::string& text, int64_t* exact_count) {
  const auto exact = static_cast<int64_t>(tokenizer_.encode(text).size());
  if (exact_count) *exact_count = exact;
  if (exact_mode_) return true;
  if (count(text) == exact) return true;
  exact_mode_ = true;
  cache_.clear();
  return false;
}

}  // namespace kvb
