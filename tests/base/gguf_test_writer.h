#pragma once
// A small GGUF writer for the torch-free tests: valid by default (aligned data after the index), so
// that a test can break exactly one thing (a count, a type, an offset). Little-endian host.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kvb::ptest {

inline void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
inline void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
inline void put_str(std::string& s, const std::string& v) {
  put_u64(s, v.size());
  s += v;
}

struct GgTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  std::string data;          // the tensor's bytes
  int64_t offset = -1;       // -1: the next aligned offset after the previous tensor
};

struct GgBuild {
  uint32_t version = 3;
  uint32_t alignment = 32;   // used to lay out the data (the file says so only if a key is added)
  std::string kv;            // serialized metadata entries
  uint64_t n_kv = 0;
  std::vector<GgTensor> tensors;
  int64_t n_tensors_override = -1;
  int64_t n_kv_override = -1;

  // Metadata entries: key, value type, value bytes.
  void raw(const std::string& key, uint32_t type, const std::string& value) {
    put_str(kv, key);
    put_u32(kv, type);
    kv += value;
    ++n_kv;
  }
  void u32(const std::string& key, uint32_t v) {
    std::string b;
    put_u32(b, v);
    raw(key, 4, b);
  }
  void f32(const std::string& key, float v) {
    raw(key, 6, std::string(reinterpret_cast<const char*>(&v), 4));
  }
  void str(const std::string& key, const std::string& v) {
    std::string b;
    put_str(b, v);
    raw(key, 8, b);
  }
  void boolean(const std::string& key, bool v) { raw(key, 7, std::string(1, v ? '\1' : '\0')); }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    std::string b;
    put_u32(b, 8);
    put_u64(b, v.size());
    for (const auto& x : v) put_str(b, x);
    raw(key, 9, b);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    std::string b;
    put_u32(b, 5);
    put_u64(b, v.size());
    for (int32_t x : v) b.append(reinterpret_cast<const char*>(&x), 4);
    raw(key, 9, b);
  }
  void bools(const std::string& key, const std::vector<bool>& v) {
    std::string b;
    put_u32(b, 7);
    put_u64(b, v.size());
    for (bool x : v) b += x ? '\1' : '\0';
    raw(key, 9, b);
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    std::string b;
    put_u32(b, 6);
    put_u64(b, v.size());
    for (float x : v) b.append(reinterpret_cast<const char*>(&x), 4);
    raw(key, 9, b);
  }

  std::string bytes() const {
    std::string s = "GGUF";
    put_u32(s, version);
    put_u64(s, n_tensors_override >= 0 ? static_cast<uint64_t>(n_tensors_override) : tensors.size());
    put_u64(s, n_kv_override >= 0 ? static_cast<uint64_t>(n_kv_override) : n_kv);
    s += kv;
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors) {
      const uint64_t off = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : next;
      offsets.push_back(off);
      next = (off + t.data.size() + alignment - 1) / alignment * alignment;
      put_str(s, t.name);
      put_u32(s, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put_u64(s, d);
      put_u32(s, t.type);
      put_u64(s, off);
    }
    while (s.size() % alignment != 0) s += '\0';
    const size_t base = s.size();
    for (size_t k = 0; k < tensors.size(); ++k) {
      const size_t at = base + offsets[k];
      if (offsets[k] > (1u << 20)) continue;  // an absurd offset under test: nothing to write there
      if (s.size() < at + tensors[k].data.size()) s.resize(at + tensors[k].data.size(), '\0');
      std::memcpy(&s[at], tensors[k].data.data(), tensors[k].data.size());
    }
    return s;
  }
};

// n bytes of a pattern that differs per seed.
inline std::string pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((seed * 37 + i * 11) & 0xff);
  return s;
}

}  // namespace kvb::ptest
