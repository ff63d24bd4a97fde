#pragma once
// KVTC (KV Cache Transform Coding, arXiv 2511.01815): the building blocks of the method, exposed for
// the tests (tests/methods/test_kvtc.cpp) and for tools. The cache itself (kvtc.cpp) registers as
// method `kvtc`.
//
//   calibration  collect pre-RoPE keys and values of calibration text (collect_kv), PCA by SVD per
//                group of coordinates (pca_fit; a group = all layers x heads, one layer or one head),
//                per-component uniform quantizers with the MSE at each bit width measured on the
//                calibration coefficients (fit_step), dynamic-programming bit allocation under a bit
//                budget per token (allocate_bits); the result is an Artifact, saved as safetensors
//                under a cache directory keyed by a content hash (calibrate()).
//   online       blocks of tokens leaving the recent window: project, quantize, bit-pack
//                (BitWriter), entropy-code (entropy_encode: zstd | deflate | none); decode is the
//                inverse (encode_block / decode_block).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/formats/model_config.h"
#include "harness/kv/kv_cache.h"

namespace kvb {
class Model;
}

namespace kvb::kvtc {

// ---- entropy coding ----
enum class Entropy { kNone = 0, kZstd = 1, kDeflate = 2 };
Entropy parse_entropy(const std::string& s);  // "none" | "zstd" | "deflate"; throws naming the value
const char* entropy_name(Entropy e);
// Compressed bytes of src (zstd frame without checksum/content size; raw DEFLATE, no zlib header).
// kNone returns a copy.
std::vector<uint8_t> entropy_encode(Entropy e, const uint8_t* src, size_t n, int level);
// Inverse: out must hold exactly raw_size bytes; throws kvb::Error when the data is corrupt or does
// not inflate to raw_size bytes.
void entropy_decode(Entropy e, const uint8_t* src, size_t n, uint8_t* out, size_t raw_size);

// ---- bit packing (LSB first, continuous across codes) ----
class BitWriter {
 public:
  void put(uint32_t code, int bits);  // bits in [0, 24]; code < 2^bits
  int64_t bit_count() const { return bits_; }
  std::vector<uint8_t> finish() const;  // ceil(bit_count / 8) bytes, padding bits 0
 private:
  std::vector<uint8_t> out_;
  uint64_t acc_ = 0;
  int nacc_ = 0;
  int64_t bits_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* data, size_t n) : data_(data), n_(n) {}
  uint32_t get(int bits);  // throws kvb::Error past the end
 private:
  const uint8_t* data_;
  size_t n_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  int nacc_ = 0;
};

// ---- scalar quantizer of one component (midrise, symmetric around the PCA mean) ----
// code = clamp(floor(y / step) + 2^(b-1), 0, 2^b - 1); value = (code - 2^(b-1) + 0.5) * step.
uint32_t quantize(float y, int bits, float step);
float dequantize(uint32_t code, int bits, float step);
// The step minimising the mean squared error over y[0], y[stride], ... (n values) at `bits`, by a
// grid over the loading factor (range = 2 * alpha * rms, alpha in [0.25, 6]); returns {step, mse}.
std::pair<float, double> fit_step(const float* y, int64_t n, int64_t stride, int bits);

// ---- bit allocation ----
// The widths a component may get (0 = dropped).
const std::vector<int>& allowed_widths();  // {0, 1, 2, 3, 4, 5, 6, 8}

struct Allocation {
  std::vector<int> bits;     // [items], one of the widths
  double distortion = 0;     // sum over items of distortion[i][width index]
  int64_t total_bits = 0;    // sum over items of size[i] * bits[i]
};
// Minimises sum_i distortion[i][w_i] subject to sum_i size[i] * widths[w_i] <= budget_bits, exactly,
// by dynamic programming over (item, bits used): O(items * budget * widths). distortion:
// [items][widths.size()]; size: [items] (components tied in a band share one width).
Allocation allocate_bits(const std::vector<std::vector<double>>& distortion,
                         const std::vector<int>& widths, const std::vector<int64_t>& size,
                         int64_t budget_bits);
// The baseline the DP is measured against: one width for every component it codes. The width is
// the largest allowed one <= budget_bits / sum(size) (at least the smallest nonzero width); items
// get it in order of decreasing variance (distortion[i][0], the error of dropping the item, per
// component) while the budget lasts, the rest are dropped. widths[0] must be 0. The total equals
// the budget whenever budget / sum(size) is an allowed width, or is below 1 with size 1 per item;
// otherwise the remainder is unspent (a uniform coder cannot spend it without becoming
// non-uniform).
Allocation allocate_bits_uniform(const std::vector<std::vector<double>>& distortion,
                                 const std::vector<int>& widths, const std::vector<int64_t>& size,
                                 int64_t budget_bits);
// The same by enumeration (tests; items^widths must be small).
Allocation allocate_bits_brute_force(const std::vector<std::vector<double>>& distortion,
                                     const std::vector<int>& widths,
                                     const std::vector<int64_t>& size, int64_t budget_bits);

// ---- PCA ----
struct Pca {
  at::Tensor mean;      // [d], fp64
  at::Tensor basis;     // [d, r], fp64, orthonormal columns, by decreasing variance
  at::Tensor variance;  // [r], fp64, variance along each column
  double total_variance = 0;  // trace of the covariance (all d directions)
};
// x: [n, d], any float dtype. SVD of the centred data (at::linalg_svd, fp64); rank r <= min(n, d)
// (rank <= 0: all). Column signs are fixed (largest |entry| positive) so that runs are reproducible.
Pca pca_fit(const at::Tensor& x, int64_t rank);
// Fraction of the total variance in the top k components.
double energy_fraction(const Pca& p, int64_t k);

// ---- calibration data ----
struct CalibOptions {
  std::string corpus = "tinystories-valid-sample";  // built-in name or .txt path
  std::string data_dir;                             // "" = resolve_data_dir()
  int64_t tokens = 16384;       // token positions collected (after the exclusions)
  int64_t skip_tokens = 32768;  // corpus tokens skipped first (keeps evaluation text out)
  int64_t window = 512;         // tokens per calibration sequence (BOS first)
  int64_t exclude_sinks = 4;    // first tokens of each sequence not collected
  int64_t exclude_recent = 128; // last tokens of each sequence not collected
};

struct CalibData {
  at::Tensor k_pre;   // [N, n_layers * n_kv_heads * head_dim] fp32, keys before RoPE
  at::Tensor k_post;  // [N, ...] fp32, keys after RoPE (for the energy-compaction comparison)
  at::Tensor v;       // [N, ...] fp32
  int64_t sequences = 0;
  std::string corpus_sha256;
};
// Runs calibration sequences of `opts.corpus` through `model` (the full cache) and collects K/V of
// the non-excluded positions; coordinates ordered (layer, kv head, dim).
CalibData collect_kv(const std::shared_ptr<Model>& model, const CalibOptions& opts);

// ---- the transform (calibration artifact) ----
enum class Scope { kModel, kLayer, kHead };
Scope parse_scope(const std::string& s);  // "model" | "layer" | "head"
const char* scope_name(Scope s);

// How the bit budget is spread over the PCA components: the DP (the paper), or one width for
// every coded component (the baseline the paper's DP is claimed to beat).
enum class BitAllocation { kDp, kUniform };
BitAllocation parse_bit_allocation(const std::string& s);  // "dp" | "uniform"
const char* bit_allocation_name(BitAllocation a);

struct TransformOptions {
  Scope scope = Scope::kModel;
  BitAllocation allocation = BitAllocation::kDp;
  int64_t rank = -1;             // per group; <= 0: the group's dimension
  double bits_per_element = 1.0; // code bits per K (or V) element of a compressed token
  int64_t band = 1;              // consecutive components tied to one width in the DP
  int64_t fit_samples = 4096;    // calibration samples used to fit the quantizers
};

struct Group {
  int64_t offset = 0, dim = 0;  // coordinates [offset, offset + dim) of the per-token vector
  at::Tensor mean;              // [dim] fp32
  at::Tensor basis;             // [dim, used] fp32: the components with > 0 bits, in order
  std::vector<int> bits;        // [used], > 0
  std::vector<float> step;      // [used]
  int64_t rank = 0;             // components considered (before dropping 0-bit ones)
};

struct KindTransform {
  std::vector<Group> groups;
  int64_t width = 0;            // coordinates per token (n_layers * kv_dim)
  int64_t code_bits_per_token = 0;
  int64_t components_used = 0;
  double expected_mse = 0;      // per token, summed over coordinates, on calibration data
  double total_variance = 0;    // per token, summed over coordinates
  double energy_top_used = 0;   // variance fraction of the kept components
};

struct Artifact {
  KindTransform k, v;
  nlohmann::json meta;     // what it was built from (model, corpus, options)
  std::string key;         // content hash of meta
  std::string path;        // the cache file ("" when not saved)
  int64_t file_bytes = 0;  // size of the saved file
  int64_t transform_bytes = 0;  // bytes of means + used basis columns + steps + widths at fp32
  bool from_cache = false;
  double seconds = 0;      // calibration time (0 when loaded)
  // The same transform built on the calibration keys AFTER RoPE (same scope, rank and budget),
  // kept only as a reference for the paper's reason to code keys before RoPE: its expected MSE /
  // total variance and the variance fraction of its kept components. Never used to code.
  double k_post_rope_rel_mse = 0;
  double k_post_rope_energy_top_used = 0;
};

KindTransform build_transform(const at::Tensor& x, int64_t n_layers, int64_t n_kv_heads,
                              int64_t head_dim, const TransformOptions& o);

// Everything that decides an artifact, as JSON (hashed into its key).
nlohmann::json artifact_meta(const Model& model, const CalibOptions& c, const TransformOptions& t);

// Loads the artifact for (model, c, t) from `cache_dir` (when present there) or calibrates and
// saves it; also memoised per process. cache_dir "" = no disk cache.
std::shared_ptr<const Artifact> calibrate(const std::shared_ptr<Model>& model,
                                          const CalibOptions& c, const TransformOptions& t,
                                          const std::string& cache_dir);
void save_artifact(const Artifact& a, const std::string& path);
std::shared_ptr<Artifact> load_artifact(const std::string& path);

// ---- blocks ----
// x: [n, width] fp32 (keys pre-RoPE, or values). Returns the packed codes (before entropy coding).
std::vector<uint8_t> pack_block(const KindTransform& t, const float* x, int64_t n);
int64_t packed_block_bytes(const KindTransform& t, int64_t n);
// Inverse of pack_block up to the coefficients: coef: [n, components_used] fp32 (dequantized).
void unpack_block(const KindTransform& t, const uint8_t* packed, size_t bytes, int64_t n,
                  float* coef);
// Reconstructs coordinates [begin, end) for n tokens from coefficients: out [n, end - begin] fp32.
void reconstruct(const KindTransform& t, const float* coef, int64_t n, int64_t begin, int64_t end,
                 float* out);

// For tests and tools: the stored bytes (header, positions, K payload, V payload) of every coded
// block of one sequence of a `kvtc` cache, oldest first. Throws when `kv` is not a kvtc cache.
std::vector<std::vector<uint8_t>> coded_blocks(const KvCache& kv, int64_t seq_id);
// The artifact a kvtc cache calibrated (null before its first block was coded).
std::shared_ptr<const Artifact> cache_artifact(const KvCache& kv);

}  // namespace kvb::kvtc
