#pragma once
// Codecs: how the rows (tokens) of one K or V tensor are physically stored. A codec is independent
// of any store or policy. A store (codec_kv_cache.h keeps all tokens; an eviction store can do the
// same) asks the codec for one CodecStream per (sequence, layer, K|V) — or per (sequence, layer,
// head, K|V) when a policy needs heads apart — appends every step's rows to it, decodes it for
// attention, and sums its bytes into the ledger. Torch-free: rows are fp32 on the host.
//
// Codecs here:
//   plain        rows at fp32 / bf16 / fp16 (make_plain_codec)
//   quantized    asymmetric b-bit groups with fp16 scale and min (QuantCodec):
//     per-token    groups of G channels within a row (kernels::QuantAxis::kRow); an optional
//                  sliding window of the R newest rows stays at full precision; a row is encoded
//                  when it leaves the window (R = 0: on arrival). Values, per-token keys.
//     per-channel  groups of G consecutive rows (tokens) of one channel (QuantAxis::kColumn); rows
//                  collect at full precision until U = (R > 0 ? R : G) are due, then all U are
//                  encoded as U/G blocks and the residual empties (R % G == 0). KIVI keys.
//   KIVI = per-channel keys + per-token values with the same R (QuantCodec::kivi_key/kivi_value).
// Encoded units (a row, or a G-row block) are never re-encoded: appends only add units, keep_rows()
// and truncate() only drop rows (a per-channel block that loses some rows keeps its bytes and a
// live mask, reported as index bytes).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvb/kernels/quantize.h"

namespace kvb {

enum class KvKind { kKey = 0, kValue = 1 };

// Storage type of full-precision rows (plain codec, residual windows).
enum class RowDtype { kF32, kF16, kBF16 };
int64_t row_dtype_bytes(RowDtype d);
const char* row_dtype_name(RowDtype d);          // "fp32" | "fp16" | "bf16"
RowDtype parse_row_dtype(const std::string& s);  // throws kvb::Error naming the value

// The bytes one stream (or a sum of streams) holds, exactly, by kind.
struct CodecBytes {
  int64_t code_bytes = 0;      // packed codes, including the padding bits of each unit's last byte
  int64_t metadata_bytes = 0;  // fp16 scales and minimums
  int64_t full_bytes = 0;      // rows at full precision (plain storage, residual windows)
  int64_t index_bytes = 0;     // live-row masks of per-channel blocks that lost rows to keep_rows()
  int64_t reserved_bytes = 0;  // allocated, holding no live row (growth capacity, residual room)
  int64_t encoded_elems = 0;   // live elements held as codes
  int64_t full_elems = 0;      // live elements held at full precision
  int64_t dead_elems = 0;      // removed elements whose codes remain inside a kept block

  int64_t payload_bytes() const { return code_bytes + full_bytes; }
  int64_t physical_bytes() const { return code_bytes + metadata_bytes + full_bytes + index_bytes; }
  int64_t live_elems() const { return encoded_elems + full_elems; }
  // Everything physical per live element (what the ledger's compression comes from); 0 when empty.
  double bits_per_element() const;
  // Codes + metadata per encoded element (dead ones included: they occupy the same codes).
  double encoded_bits_per_element() const;
  CodecBytes& operator+=(const CodecBytes& o);
};

// The counters every codec-holding store reports from its key and value bytes:
// effective_bits_per_element (all, k_, v_), encoded_bits_per_element, full_precision_fraction.
void add_codec_bit_counters(const CodecBytes& k, const CodecBytes& v,
                            std::map<std::string, double>* counters);

// The encoded rows of one tensor of one sequence (and layer, and maybe head).
class CodecStream {
 public:
  virtual ~CodecStream() = default;
  virtual int64_t width() const = 0;  // elements per row
  virtual int64_t rows() const = 0;   // live rows
  // Appends n rows. x: [n, width] fp32 host, contiguous. Encodes the rows that become due.
  virtual void append(const float* x, int64_t n) = 0;
  // Writes the live rows in order. out: [rows(), width] fp32 host, contiguous. Full-precision rows
  // come back as stored (rounded to their dtype), encoded rows dequantized.
  virtual void decode(float* out) const = 0;
  // Keeps only the live rows at `idx` (ascending, unique, in [0, rows())), in order. Never
  // re-encodes anything: eviction policies and truncation use this.
  virtual void keep_rows(const std::vector<int64_t>& idx) = 0;
  virtual void truncate(int64_t n);  // keeps rows [0, n)
  virtual std::unique_ptr<CodecStream> clone() const = 0;
  virtual CodecBytes bytes() const = 0;
  // Each encoded unit's stored bytes (codes, then scales, then mins), oldest first: tests check
  // that appends never change a unit once written.
  virtual std::vector<std::vector<uint8_t>> encoded_units() const { return {}; }
  // Query-aware codecs (KvCodec::query_window() > 0): the observation window's per-channel query
  // energy of this stream's head over the `window` newest prompt queries ([width] floats), given
  // right before the prompt's kept rows are appended: n_c = ||mean over the group's query heads of
  // q[:, c]||_2 (QueryEnergy::kGroupMean), or n_c = sqrt(sum over the window of the mean over the
  // group's query heads of q_c^2) (kMeanSquare). Other codecs ignore it.
  virtual void set_query_energy(const float* energy, int64_t window) {
    (void)energy;
    (void)window;
  }
};

// A GQA group's per-channel query energy (CodecStream::set_query_energy): the group's mean query
// squared (SparK's statistic), or the mean of the query heads' squares (kvpress's ThinKPress).
enum class QueryEnergy { kGroupMean, kMeanSquare };

class KvCodec {
 public:
  virtual ~KvCodec() = default;
  virtual std::string name() const = 0;
  // width: elements per row, a multiple of head_dim (all heads of a layer, or one head).
  virtual std::unique_ptr<CodecStream> make_stream(KvKind kind, int layer, int64_t width,
                                                   int64_t head_dim) const = 0;
  // Bits per encoded element the codec declares, metadata included (plain: the dtype's bits).
  virtual double declared_bits(KvKind kind, int layer) const = 0;
  // The bytes a stream holds after `rows` rows were appended in order (in any chunking) and nothing
  // was removed; reserved_bytes is left 0 (capacity growth is the container's business).
  virtual CodecBytes expected_bytes(KvKind kind, int layer, int64_t width, int64_t rows) const = 0;
  // Figures for the run's counters (bit widths, group sizes actually used, residual length).
  virtual std::map<std::string, double> describe() const { return {}; }
  // Observation-window queries a query-aware codec needs before the prompt is encoded (0: none).
  virtual int64_t query_window() const { return 0; }
  // How a GQA group's query heads make one energy per channel (CodecStream::set_query_energy).
  virtual QueryEnergy query_energy() const { return QueryEnergy::kGroupMean; }
};

// A codec stream that deep-copies with its owner (stores copy their sequences on fork).
struct StreamBox {
  std::unique_ptr<CodecStream> p;
  StreamBox() = default;
  StreamBox(const StreamBox& o) : p(o.p ? o.p->clone() : nullptr) {}
  StreamBox& operator=(const StreamBox& o) {
    p = o.p ? o.p->clone() : nullptr;
    return *this;
  }
  StreamBox(StreamBox&&) = default;
  StreamBox& operator=(StreamBox&&) = default;
};

// Eviction over a K/V pair held as codec streams followed by `*pend` pending fp32 rows ([*pend,
// dim] each in pk / pv; `len` rows in all): keeps the rows at the ascending slots `keep` (into
// [stream rows | pending rows]), dropping stream rows with keep_rows (never re-encoded) and
// compacting the pending rows in place. The stores that hold a step's rows exact until its end
// (eviction stores, kvreviver) share it.
void keep_codec_rows(StreamBox& ks, StreamBox& vs, std::vector<float>& pk, std::vector<float>& pv,
                     int64_t* pend, int64_t len, int64_t dim, const std::vector<int64_t>& keep);

std::unique_ptr<KvCodec> make_plain_codec(RowDtype dtype);

// How one tensor (K or V) is quantized.
struct QuantSpec {
  int32_t bits = 4;                                    // 2, 3, 4 or 8
  kernels::QuantAxis axis = kernels::QuantAxis::kRow;  // kRow: per token; kColumn: per channel
  int64_t group_size = 32;  // kRow: channels per group (must divide head_dim); kColumn: tokens
  int64_t residual = 0;     // full-precision rows (see the top of this file); kColumn: R % G == 0
  RowDtype residual_dtype = RowDtype::kF16;
};

// Quantized K and V, optionally with a different (K, V) pair per layer (KVTuner).
class QuantCodec : public KvCodec {
 public:
  QuantCodec(std::string name, QuantSpec key, QuantSpec value);
  // KIVI: keys per channel in groups of G tokens, values per token in groups of v_group channels,
  // both with a full-precision residual of R tokens (keys chunked, values sliding).
  static QuantSpec kivi_key(int32_t bits, int64_t group_tokens, int64_t residual, RowDtype rd);
  static QuantSpec kivi_value(int32_t bits, int64_t group_channels, int64_t residual, RowDtype rd);
  static QuantSpec per_token(int32_t bits, int64_t group_channels, int64_t residual, RowDtype rd);

  void set_layer(int layer, QuantSpec key, QuantSpec value);  // overrides the defaults for `layer`
  const QuantSpec& spec(KvKind kind, int layer) const;

  std::string name() const override { return name_; }
  std::unique_ptr<CodecStream> make_stream(KvKind kind, int layer, int64_t width,
                                           int64_t head_dim) const override;
  double declared_bits(KvKind kind, int layer) const override;
  CodecBytes expected_bytes(KvKind kind, int layer, int64_t width, int64_t rows) const override;
  std::map<std::string, double> describe() const override;

  // Throws kvb::Error naming `where` when the spec cannot serve rows of `head_dim` channels.
  static void validate(const QuantSpec& s, int64_t head_dim, const std::string& where);

 private:
  std::string name_;
  QuantSpec key_, value_;
  std::map<int, std::pair<QuantSpec, QuantSpec>> layers_;
};

// The largest divisor of head_dim that is <= requested (channel groups never straddle heads):
// KIVI's G = 32 becomes 8 on stories260K's head_dim 8.
int64_t adapt_channel_group(int64_t requested, int64_t head_dim);

}  // namespace kvb
