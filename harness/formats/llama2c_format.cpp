#include "harness/formats/llama2c_format.h"

#include <cstring>

#include "harness/common/error.h"

namespace kvb {

Llama2cLayout parse_llama2c_header(const uint8_t* data, size_t file_bytes,
                                   const std::string& source) {
  constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
  KVB_CHECK(file_bytes >= kHeaderBytes, source, ": truncated llama2.c checkpoint (", file_bytes,
            " bytes; the 28-byte header is missing)");
  int32_t h[7];
  std::memcpy(h, data, kHeaderBytes);
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                          "seq_len"};
  // Bounds well beyond any real llama2.c model; they catch a file that is not a checkpoint at all.
  const int64_t limits[7] = {1 << 16, 1 << 18, 1024, 1024, 1024, 1 << 21, 1 << 22};
  for (int i = 0; i < 7; ++i) {
    int64_t v = i == 5 ? (h[i] < 0 ? -static_cast<int64_t>(h[i]) : h[i]) : h[i];
    KVB_CHECK(v > 0 && v <= limits[i], source, ": header field ", names[i], " = ", h[i],
              " is not plausible for a llama2.c checkpoint");
  }
  Llama2cLayout L;
  ModelConfig& c = L.config;
  c.format = "llama2c";
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  L.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -static_cast<int64_t>(h[5]);
  c.max_seq_len = h[6];
  KVB_CHECK(c.dim % c.n_heads == 0, source, ": dim ", c.dim, " is not a multiple of n_heads ",
            c.n_heads);
  c.head_dim = c.dim / c.n_heads;
  c.rope_theta = 10000.0;
  c.rope_style = RopeStyle::kInterleaved;
  c.norm_eps = 1e-5;
  c.tied_embeddings = L.shared_classifier;
  c.bos_id = 1;
  c.eos_ids = {2};
  c.weights_dtype = "F32";
  c.validate(source);

  const int64_t D = c.dim, F = c.hidden_dim, NL = c.n_layers, V = c.vocab_size;
  const int64_t KV = c.kv_dim(), Q = c.q_dim(), S = c.max_seq_len, HD = c.head_dim;
  size_t off = 0;
  auto add = [&](const char* name, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    L.arrays.push_back({name, std::move(shape), off});
    off += n;
  };
  add("token_embedding", {V, D});
  add("rms_att", {NL, D});
  add("wq", {NL, Q, D});
  add("wk", {NL, KV, D});
  add("wv", {NL, KV, D});
  add("wo", {NL, D, Q});
  add("rms_ffn", {NL, D});
  add("w1", {NL, F, D});
  add("w2", {NL, D, F});
  add("w3", {NL, F, D});
  add("rms_final", {D});
  add("freq_cis_real", {S, HD / 2});
  add("freq_cis_imag", {S, HD / 2});
  if (!L.shared_classifier) add("wcls", {V, D});
  L.expected_bytes = kHeaderBytes + off * sizeof(float);
  KVB_CHECK(file_bytes == L.expected_bytes, source, ": size ", file_bytes,
            " bytes does not match its header (", L.expected_bytes, " bytes expected for dim=",
            D, " layers=", NL, " vocab=", V, L.shared_classifier ? ", shared" : ", separate",
            " classifier)");
  return L;
}

}  // namespace kvb
