#pragma once
// Helpers for the torch-free parser tests (safetensors, model config, llama2.c, tokenizer): scratch
// directories, byte-exact file writing, the real model/data locations, a builder of valid
// safetensors byte strings (so that a test can corrupt exactly one thing), and an
// exact-error-message matcher. tests/base cannot use tests/support, which links LibTorch.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/error.h"

namespace kvb::ptest {

// A fresh empty directory under $TMPDIR (or /tmp); left behind for inspection when a test fails.
inline std::string scratch_dir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvb_" + tag + "_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
  return pattern;
}

// Writes `bytes` exactly (binary) to dir/name and returns the path.
inline std::string write_bytes(const std::string& dir, const std::string& name,
                               const std::string& bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) ADD_FAILURE() << "cannot write " << path;
  return path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) ADD_FAILURE() << "cannot read " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// $KVBENCH_MODELS / $KVBENCH_DATA (set by ctest), else the shared checkout used when run by hand.
inline std::string models_dir() {
  const char* env = std::getenv("KVBENCH_MODELS");
  return env && *env ? env : KVB_TEST_MODELS_DEFAULT;
}
inline std::string data_dir() {
  const char* env = std::getenv("KVBENCH_DATA");
  return env && *env ? env : KVB_TEST_DATA_DEFAULT;
}

// Runs `f`, expecting a kvb::Error whose message is one line and contains every one of `parts`.
// Returns the message (empty when nothing or something else was thrown).
template <typename F>
std::string expect_kvb_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const kvb::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: '" << msg << "'";
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message '" << msg << "' lacks '" << p << "'";
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected kvb::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected kvb::Error, nothing was thrown";
  return "";
}

// ---- safetensors builder ----

struct StSpec {
  std::string name;
  std::string dtype;  // F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL (or anything, for errors)
  std::vector<int64_t> shape;
};

inline size_t st_test_dtype_bytes(const std::string& dt) {
  if (dt == "F64" || dt == "I64") return 8;
  if (dt == "F32" || dt == "I32") return 4;
  if (dt == "F16" || dt == "BF16" || dt == "I16") return 2;
  return 1;
}

// The value element `i` of the k-th tensor (in spec order) holds: F32 tensors get 100*k + i + 0.25,
// every other dtype gets the byte pattern (31*k + i) & 0xff in each byte.
inline float st_test_f32_value(size_t k, size_t i) { return 100.f * k + i + 0.25f; }
inline uint8_t st_test_byte_value(size_t k, size_t i) { return static_cast<uint8_t>(31 * k + i); }

// A header (JSON object) plus data section, laid out back to back in spec order.
struct StBuild {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
};

inline StBuild st_build(const std::vector<StSpec>& specs,
                        const std::map<std::string, std::string>& metadata = {}) {
  StBuild b;
  for (size_t k = 0; k < specs.size(); ++k) {
    const StSpec& s = specs[k];
    uint64_t numel = 1;
    for (int64_t d : s.shape) numel *= static_cast<uint64_t>(d);
    const size_t esize = st_test_dtype_bytes(s.dtype);
    const uint64_t begin = b.data.size();
    for (uint64_t i = 0; i < numel; ++i) {
      if (s.dtype == "F32") {
        const float v = st_test_f32_value(k, i);
        char raw[4];
        std::memcpy(raw, &v, 4);  // little-endian host
        b.data.append(raw, 4);
      } else {
        b.data.append(esize, static_cast<char>(st_test_byte_value(k, i)));
      }
    }
    b.header[s.name] = {{"dtype", s.dtype},
                        {"shape", s.shape},
                        {"data_offsets", {begin, static_cast<uint64_t>(b.data.size())}}};
  }
  if (!metadata.empty()) b.header["__metadata__"] = metadata;
  return b;
}

// 8-byte little-endian header length, the header text (padded with spaces to a multiple of 8, as
// the reference writer does), then the data.
inline std::string st_serialize_raw(std::string header_text, const std::string& data) {
  while ((8 + header_text.size()) % 8 != 0) header_text += ' ';
  std::string out(8, '\0');
  uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header_text + data;
}
inline std::string st_serialize(const StBuild& b) {
  return st_serialize_raw(b.header.dump(), b.data);
}
inline std::string st_bytes(const std::vector<StSpec>& specs,
                            const std::map<std::string, std::string>& metadata = {}) {
  return st_serialize(st_build(specs, metadata));
}

}  // namespace kvb::ptest
