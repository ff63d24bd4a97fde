#pragma once
// KV Packet's trained soft tokens (Chen et al., arXiv 2604.13226): a header
// H [h, dim] and a trailer T [t, dim] in input-embedding space, shared by every document. A document
// is prefilled alone as [H, emb(doc), T] from position 0 -- its "packet" -- and packets are placed one
// after another at query time with their keys re-rotated, without recomputing a token. Only H and T
// are trained (packet_train.h); the model stays frozen.
//
// File: safetensors with `header` [h, dim] and `trailer` [t, dim] (fp32) and metadata
// {"kind": "kv-packet-adapter", "model", "dim", "header_rows", "trailer_rows", "trained_steps", ...}.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

#include "harness/formats/model_config.h"

namespace kvb::kv_packet {

struct Adapter {
  at::Tensor header;   // [h, dim] fp32
  at::Tensor trailer;  // [t, dim] fp32
  std::map<std::string, std::string> info;  // the file's metadata

  // N(0, std) rows from a seeded CPU generator (the paper's code: std 0.02).
  static Adapter fresh(const ModelConfig& c, int64_t header_rows, int64_t trailer_rows, double std,
                       uint64_t seed);
  // Throws kvb::Error naming the file and what does not fit `c`.
  static Adapter load(const std::string& path, const ModelConfig& c);
  void save(const std::string& path, const std::map<std::string, std::string>& extra = {}) const;
};

}  // namespace kvb::kv_packet
