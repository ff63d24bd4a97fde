#pragma once
// llama2.c "legacy" (version 0) checkpoints: 7 little-endian int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len), then fp32 arrays. A negative vocab_size means the file
// carries a separate classifier (wcls) after the freq_cis tables. Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include "harness/formats/model_config.h"

namespace kvb {

struct Llama2cArray {
  std::string name;              // token_embedding, rms_att, wq, ... (as llama2.c names them)
  std::vector<int64_t> shape;    // row-major [out][in] for matrices, stacked over layers
  size_t offset_floats = 0;      // from the start of the data (after the 28-byte header)
};

struct Llama2cLayout {
  ModelConfig config;
  bool shared_classifier = true;
  std::vector<Llama2cArray> arrays;
  size_t expected_bytes = 0;     // header + all arrays
};

// Parses the header of a file of `file_bytes` bytes and computes where every array sits. Throws
// kvb::Error naming `source` when the header is implausible or the size does not match exactly.
Llama2cLayout parse_llama2c_header(const uint8_t* data, size_t file_bytes, const std::string& source);

}  // namespace kvb
