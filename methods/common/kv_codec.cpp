#include "methods/common/kv_codec.h"

#include <algorithm>
#include <cstring>

#include "harness/common/enum_names.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "kvb/kernels/half.h"

namespace kvb {

using kernels::QuantAxis;

int64_t row_dtype_bytes(RowDtype d) { return d == RowDtype::kF32 ? 4 : 2; }

namespace {
const EnumName<RowDtype> kRowDtypes[] = {
    {RowDtype::kF32, "fp32"}, {RowDtype::kF16, "fp16"}, {RowDtype::kBF16, "bf16"}};
}  // namespace

const char* row_dtype_name(RowDtype d) { return enum_name(kRowDtypes, d); }

RowDtype parse_row_dtype(const std::string& s) {
  return parse_enum(kRowDtypes, s, "storage dtype");
}

double CodecBytes::bits_per_element() const {
  return live_elems()
             ? 8.0 * static_cast<double>(physical_bytes()) / static_cast<double>(live_elems())
             : 0.0;
}

double CodecBytes::encoded_bits_per_element() const {
  const int64_t n = encoded_elems + dead_elems;
  return n ? 8.0 * static_cast<double>(code_bytes + metadata_bytes) / static_cast<double>(n) : 0.0;
}

CodecBytes& CodecBytes::operator+=(const CodecBytes& o) {
  code_bytes += o.code_bytes;
  metadata_bytes += o.metadata_bytes;
  full_bytes += o.full_bytes;
  index_bytes += o.index_bytes;
  reserved_bytes += o.reserved_bytes;
  encoded_elems += o.encoded_elems;
  full_elems += o.full_elems;
  dead_elems += o.dead_elems;
  return *this;
}

void add_codec_bit_counters(const CodecBytes& k, const CodecBytes& v,
                            std::map<std::string, double>* counters) {
  CodecBytes all = k;
  all += v;
  auto& c = *counters;
  c["effective_bits_per_element"] = all.bits_per_element();
  c["k_effective_bits_per_element"] = k.bits_per_element();
  c["v_effective_bits_per_element"] = v.bits_per_element();
  c["encoded_bits_per_element"] = all.encoded_bits_per_element();
  c["full_precision_fraction"] =
      all.live_elems() ? static_cast<double>(all.full_elems) / static_cast<double>(all.live_elems())
                       : 0.0;
}

void CodecStream::truncate(int64_t n) {
  KVB_CHECK(n >= 0 && n <= rows(), "codec stream: cannot truncate ", rows(), " rows to ", n);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  keep_rows(idx);
}

namespace {

void check_keep(const std::vector<int64_t>& idx, int64_t rows) {
  for (size_t i = 0; i < idx.size(); ++i)
    KVB_ASSERT(idx[i] >= 0 && idx[i] < rows && (i == 0 || idx[i] > idx[i - 1]), "codec stream",
               "keep_rows needs ascending unique indices in [0, ", rows, "), got ", idx[i], " at ",
               i);
}

template <typename T>
int64_t spare_bytes(const std::vector<T>& v) {
  return static_cast<int64_t>((v.capacity() - v.size()) * sizeof(T));
}

// Full-precision rows in a storage dtype, appended at the end, removable anywhere.
class RowStore {
 public:
  RowStore(RowDtype d, int64_t width) : dtype_(d), width_(width), eb_(row_dtype_bytes(d)) {}

  int64_t rows() const { return rows_; }
  int64_t row_bytes() const { return width_ * eb_; }
  void reserve_rows(int64_t n) { data_.reserve(static_cast<size_t>(n * row_bytes())); }

  void append(const float* x, int64_t n) {
    if (n == 0) return;  // (memcpy from or into an empty vector's null data() is undefined)
    const size_t old = data_.size();
    data_.resize(old + static_cast<size_t>(n * row_bytes()));
    uint8_t* dst = data_.data() + old;
    const int64_t count = n * width_;
    if (dtype_ == RowDtype::kF32) {
      std::memcpy(dst, x, static_cast<size_t>(count * 4));
    } else {
      auto* h = reinterpret_cast<uint16_t*>(dst);
      if (dtype_ == RowDtype::kF16)
        for (int64_t i = 0; i < count; ++i) h[i] = kernels::float_to_half(x[i]);
      else
        for (int64_t i = 0; i < count; ++i) h[i] = kernels::float_to_bf16(x[i]);
    }
    rows_ += n;
  }

  // Rows [begin, end) into out: [end - begin, width] fp32.
  void decode(float* out, int64_t begin, int64_t end) const {
    if (end == begin) return;
    const uint8_t* src = data_.data() + begin * row_bytes();
    const int64_t count = (end - begin) * width_;
    if (dtype_ == RowDtype::kF32) {
      std::memcpy(out, src, static_cast<size_t>(count * 4));
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(src);
      if (dtype_ == RowDtype::kF16)
        for (int64_t i = 0; i < count; ++i) out[i] = kernels::half_to_float(h[i]);
      else
        for (int64_t i = 0; i < count; ++i) out[i] = kernels::bf16_to_float(h[i]);
    }
  }

  void erase_front(int64_t k) {
    data_.erase(data_.begin(), data_.begin() + k * row_bytes());
    rows_ -= k;
  }
  void clear() {
    data_.clear();
    rows_ = 0;
  }
  // idx: ascending rows of this store.
  void keep(const std::vector<int64_t>& idx) {
    const int64_t rb = row_bytes();
    int64_t o = 0;
    for (int64_t i : idx) {
      if (i != o)
        std::memmove(data_.data() + o * rb, data_.data() + i * rb, static_cast<size_t>(rb));
      ++o;
    }
    data_.resize(static_cast<size_t>(o * rb));
    rows_ = o;
  }

  int64_t full_bytes() const { return static_cast<int64_t>(data_.size()); }
  int64_t reserved_bytes() const { return spare_bytes(data_); }
  int64_t width() const { return width_; }

 private:
  RowDtype dtype_;
  int64_t width_, eb_;
  int64_t rows_ = 0;
  std::vector<uint8_t> data_;
};

class PlainStream : public CodecStream {
 public:
  PlainStream(RowDtype d, int64_t width) : store_(d, width) {}
  int64_t width() const override { return store_.width(); }
  int64_t rows() const override { return store_.rows(); }
  void append(const float* x, int64_t n) override { store_.append(x, n); }
  void decode(float* out) const override { store_.decode(out, 0, store_.rows()); }
  void keep_rows(const std::vector<int64_t>& idx) override {
    check_keep(idx, rows());
    store_.keep(idx);
  }
  std::unique_ptr<CodecStream> clone() const override {
    return std::make_unique<PlainStream>(*this);
  }
  CodecBytes bytes() const override {
    CodecBytes b;
    b.full_bytes = store_.full_bytes();
    b.reserved_bytes = store_.reserved_bytes();
    b.full_elems = store_.rows() * store_.width();
    return b;
  }

 private:
  RowStore store_;
};

// Per-token groups: each encoded row owns ceil(width*b/8) code bytes and width/G (scale, min)
// pairs.
class RowQuantStream : public CodecStream {
 public:
  RowQuantStream(const QuantSpec& s, int64_t width)
      : s_(s),
        width_(width),
        groups_(width / s.group_size),
        row_code_bytes_(kernels::packed_code_bytes(width, s.bits)),
        aligned_((width * s.bits) % 8 == 0),
        residual_(s.residual_dtype, width) {}

  int64_t width() const override { return width_; }
  int64_t rows() const override { return n_enc_ + residual_.rows(); }

  void append(const float* x, int64_t n) override {
    if (s_.residual == 0) {
      encode(x, n);
      return;
    }
    residual_.append(x, n);
    const int64_t k = residual_.rows() - s_.residual;
    if (k <= 0) return;
    tmp_.resize(static_cast<size_t>(k * width_));
    residual_.decode(tmp_.data(), 0, k);  // encoded from the stored (residual-dtype) values
    encode(tmp_.data(), k);
    residual_.erase_front(k);
  }

  void decode(float* out) const override {
    if (n_enc_ > 0) {
      if (aligned_) {
        dequant(0, n_enc_, out);
      } else {
        for (int64_t r = 0; r < n_enc_; ++r) dequant(r, 1, out + r * width_);
      }
    }
    residual_.decode(out + n_enc_ * width_, 0, residual_.rows());
  }

  void keep_rows(const std::vector<int64_t>& idx) override {
    check_keep(idx, rows());
    int64_t o = 0;
    std::vector<int64_t> res;
    for (int64_t i : idx) {
      if (i >= n_enc_) {
        res.push_back(i - n_enc_);
        continue;
      }
      if (i != o) {
        std::memmove(codes_.data() + o * row_code_bytes_, codes_.data() + i * row_code_bytes_,
                     static_cast<size_t>(row_code_bytes_));
        std::memmove(scales_.data() + o * groups_, scales_.data() + i * groups_,
                     static_cast<size_t>(groups_ * 2));
        std::memmove(mins_.data() + o * groups_, mins_.data() + i * groups_,
                     static_cast<size_t>(groups_ * 2));
      }
      ++o;
    }
    n_enc_ = o;
    codes_.resize(static_cast<size_t>(o * row_code_bytes_));
    scales_.resize(static_cast<size_t>(o * groups_));
    mins_.resize(static_cast<size_t>(o * groups_));
    residual_.keep(res);
  }

  std::unique_ptr<CodecStream> clone() const override {
    return std::make_unique<RowQuantStream>(*this);
  }

  CodecBytes bytes() const override {
    CodecBytes b;
    b.code_bytes = static_cast<int64_t>(codes_.size());
    b.metadata_bytes = static_cast<int64_t>(2 * (scales_.size() + mins_.size()));
    b.full_bytes = residual_.full_bytes();
    b.reserved_bytes = spare_bytes(codes_) + spare_bytes(scales_) + spare_bytes(mins_) +
                       residual_.reserved_bytes();
    b.encoded_elems = n_enc_ * width_;
    b.full_elems = residual_.rows() * width_;
    return b;
  }

  std::vector<std::vector<uint8_t>> encoded_units() const override {
    std::vector<std::vector<uint8_t>> u;
    for (int64_t r = 0; r < n_enc_; ++r) {
      std::vector<uint8_t> blob(codes_.begin() + r * row_code_bytes_,
                                codes_.begin() + (r + 1) * row_code_bytes_);
      const auto* sp = reinterpret_cast<const uint8_t*>(scales_.data() + r * groups_);
      const auto* mp = reinterpret_cast<const uint8_t*>(mins_.data() + r * groups_);
      blob.insert(blob.end(), sp, sp + groups_ * 2);
      blob.insert(blob.end(), mp, mp + groups_ * 2);
      u.push_back(std::move(blob));
    }
    return u;
  }

 private:
  kernels::GroupQuantShape shape(int64_t rows) const {
    return {s_.bits, rows, width_, s_.group_size, QuantAxis::kRow};
  }
  void encode(const float* x, int64_t n) {
    codes_.resize(static_cast<size_t>((n_enc_ + n) * row_code_bytes_));
    scales_.resize(static_cast<size_t>((n_enc_ + n) * groups_));
    mins_.resize(static_cast<size_t>((n_enc_ + n) * groups_));
    // Byte-aligned rows: one call writes the same bytes as a call per row.
    const int64_t step = aligned_ ? n : 1;
    for (int64_t r = 0; r < n; r += step) {
      kernels::GroupQuantizeParams p;
      p.shape = shape(step);
      p.x = x + r * width_;
      p.codes = codes_.data() + (n_enc_ + r) * row_code_bytes_;
      p.scales = scales_.data() + (n_enc_ + r) * groups_;
      p.mins = mins_.data() + (n_enc_ + r) * groups_;
      kernels::group_quantize_cpu(p);
    }
    n_enc_ += n;
  }
  void dequant(int64_t r0, int64_t n, float* out) const {
    kernels::GroupDequantizeParams p;
    p.shape = shape(n);
    p.codes = codes_.data() + r0 * row_code_bytes_;
    p.scales = scales_.data() + r0 * groups_;
    p.mins = mins_.data() + r0 * groups_;
    p.out = out;
    kernels::group_dequantize_cpu(p);
  }

  QuantSpec s_;
  int64_t width_, groups_, row_code_bytes_;
  bool aligned_;
  std::vector<uint8_t> codes_;    // [n_enc, row_code_bytes]
  std::vector<uint16_t> scales_;  // [n_enc, groups] fp16
  std::vector<uint16_t> mins_;
  int64_t n_enc_ = 0;
  RowStore residual_;  // the newest <= R rows
  std::vector<float> tmp_;
};

// Per-channel groups: rows collect in the residual until U are due, then become U/G blocks of G
// rows, each block one kernel call ([G, width], kColumn, group G: one (scale, min) per channel).
class ColQuantStream : public CodecStream {
 public:
  ColQuantStream(const QuantSpec& s, int64_t width)
      : s_(s),
        width_(width),
        unit_(s.residual > 0 ? s.residual : s.group_size),
        block_code_bytes_(kernels::packed_code_bytes(s.group_size * width, s.bits)),
        residual_(s.residual_dtype, width) {
    residual_.reserve_rows(unit_);
  }

  int64_t width() const override { return width_; }
  int64_t rows() const override { return block_rows_ + residual_.rows(); }

  void append(const float* x, int64_t n) override {
    while (n > 0) {
      const int64_t take = std::min(n, unit_ - residual_.rows());
      residual_.append(x, take);
      x += take * width_;
      n -= take;
      if (residual_.rows() == unit_) flush();
    }
  }

  void decode(float* out) const override {
    const int64_t G = s_.group_size;
    int64_t pos = 0;
    std::vector<float> tmp;
    for (const Block& b : blocks_) {
      if (b.live.empty()) {
        dequant(b, out + pos * width_);
        pos += G;
        continue;
      }
      tmp.resize(static_cast<size_t>(G * width_));
      dequant(b, tmp.data());
      for (int64_t r = 0; r < G; ++r)
        if (b.live[r]) std::memcpy(out + (pos++) * width_, tmp.data() + r * width_, width_ * 4);
    }
    residual_.decode(out + pos * width_, 0, residual_.rows());
  }

  void keep_rows(const std::vector<int64_t>& idx) override {
    check_keep(idx, rows());
    const int64_t G = s_.group_size;
    size_t k = 0;
    int64_t off = 0;  // live-row index of the current block's first live row
    std::vector<Block> kept;
    for (Block& b : blocks_) {
      std::vector<int64_t> phys;  // the block's live physical rows, in order
      for (int64_t r = 0; r < G; ++r)
        if (b.live.empty() || b.live[r]) phys.push_back(r);
      std::vector<uint8_t> live(static_cast<size_t>(G), 0);
      int64_t n = 0;
      while (k < idx.size() && idx[k] < off + b.live_rows) {
        live[phys[idx[k] - off]] = 1;
        ++n;
        ++k;
      }
      off += b.live_rows;
      if (n == 0) continue;  // the whole block goes
      b.live_rows = n;
      if (n == G) live.clear();
      b.live = std::move(live);
      kept.push_back(std::move(b));
    }
    blocks_ = std::move(kept);
    block_rows_ = 0;
    for (const Block& b : blocks_) block_rows_ += b.live_rows;
    std::vector<int64_t> res;
    for (; k < idx.size(); ++k) res.push_back(idx[k] - off);
    residual_.keep(res);
  }

  std::unique_ptr<CodecStream> clone() const override {
    return std::make_unique<ColQuantStream>(*this);
  }

  CodecBytes bytes() const override {
    CodecBytes b;
    const int64_t G = s_.group_size;
    for (const Block& x : blocks_) {
      b.code_bytes += static_cast<int64_t>(x.codes.size());
      b.metadata_bytes += static_cast<int64_t>(2 * (x.scales.size() + x.mins.size()));
      if (!x.live.empty()) b.index_bytes += (G + 7) / 8;  // one bit per row of the block
      b.encoded_elems += x.live_rows * width_;
      b.dead_elems += (G - x.live_rows) * width_;
    }
    b.full_bytes = residual_.full_bytes();
    b.full_elems = residual_.rows() * width_;
    b.reserved_bytes = residual_.reserved_bytes();
    return b;
  }

  std::vector<std::vector<uint8_t>> encoded_units() const override {
    std::vector<std::vector<uint8_t>> u;
    for (const Block& x : blocks_) {
      std::vector<uint8_t> blob = x.codes;
      const auto* sp = reinterpret_cast<const uint8_t*>(x.scales.data());
      const auto* mp = reinterpret_cast<const uint8_t*>(x.mins.data());
      blob.insert(blob.end(), sp, sp + x.scales.size() * 2);
      blob.insert(blob.end(), mp, mp + x.mins.size() * 2);
      u.push_back(std::move(blob));
    }
    return u;
  }

 private:
  struct Block {
    std::vector<uint8_t> codes;    // [block_code_bytes]
    std::vector<uint16_t> scales;  // [width] fp16, one per channel
    std::vector<uint16_t> mins;
    std::vector<uint8_t> live;  // [G] 0/1 once keep_rows removed some rows; empty: all live
    int64_t live_rows = 0;
  };
  kernels::GroupQuantShape shape() const {
    return {s_.bits, s_.group_size, width_, s_.group_size, QuantAxis::kColumn};
  }
  void flush() {
    const int64_t G = s_.group_size;
    tmp_.resize(static_cast<size_t>(unit_ * width_));
    residual_.decode(tmp_.data(), 0, unit_);  // encoded from the stored (residual-dtype) values
    for (int64_t r0 = 0; r0 < unit_; r0 += G) {
      Block b;
      b.codes.resize(static_cast<size_t>(block_code_bytes_));
      b.scales.resize(static_cast<size_t>(width_));
      b.mins.resize(static_cast<size_t>(width_));
      b.live_rows = G;
      kernels::GroupQuantizeParams p;
      p.shape = shape();
      p.x = tmp_.data() + r0 * width_;
      p.codes = b.codes.data();
      p.scales = b.scales.data();
      p.mins = b.mins.data();
      kernels::group_quantize_cpu(p);
      blocks_.push_back(std::move(b));
      block_rows_ += G;
    }
    residual_.clear();
  }
  void dequant(const Block& b, float* out) const {
    kernels::GroupDequantizeParams p;
    p.shape = shape();
    p.codes = b.codes.data();
    p.scales = b.scales.data();
    p.mins = b.mins.data();
    p.out = out;
    kernels::group_dequantize_cpu(p);
  }

  QuantSpec s_;
  int64_t width_, unit_, block_code_bytes_;
  std::vector<Block> blocks_;
  int64_t block_rows_ = 0;  // live rows in blocks
  RowStore residual_;       // < unit_ rows
  std::vector<float> tmp_;
};

class PlainCodec : public KvCodec {
 public:
  explicit PlainCodec(RowDtype d) : d_(d) {}
  std::string name() const override { return row_dtype_name(d_); }
  std::unique_ptr<CodecStream> make_stream(KvKind, int, int64_t width, int64_t) const override {
    return std::make_unique<PlainStream>(d_, width);
  }
  double declared_bits(KvKind, int) const override { return 8.0 * row_dtype_bytes(d_); }
  CodecBytes expected_bytes(KvKind, int, int64_t width, int64_t rows) const override {
    CodecBytes b;
    b.full_bytes = rows * width * row_dtype_bytes(d_);
    b.full_elems = rows * width;
    return b;
  }
  std::map<std::string, double> describe() const override {
    return {{"storage_bits", 8.0 * row_dtype_bytes(d_)}};
  }

 private:
  RowDtype d_;
};

}  // namespace

std::unique_ptr<KvCodec> make_plain_codec(RowDtype dtype) {
  return std::make_unique<PlainCodec>(dtype);
}

int64_t adapt_channel_group(int64_t requested, int64_t head_dim) {
  KVB_CHECK(requested >= 1 && head_dim >= 1, "channel group ", requested, " / head_dim ", head_dim);
  for (int64_t g = std::min(requested, head_dim); g > 1; --g)
    if (head_dim % g == 0) return g;
  return 1;
}

QuantCodec::QuantCodec(std::string name, QuantSpec key, QuantSpec value)
    : name_(std::move(name)), key_(key), value_(value) {}

QuantSpec QuantCodec::kivi_key(int32_t bits, int64_t group_tokens, int64_t residual, RowDtype rd) {
  return {bits, QuantAxis::kColumn, group_tokens, residual, rd};
}
QuantSpec QuantCodec::kivi_value(int32_t bits, int64_t group_channels, int64_t residual,
                                 RowDtype rd) {
  return {bits, QuantAxis::kRow, group_channels, residual, rd};
}
QuantSpec QuantCodec::per_token(int32_t bits, int64_t group_channels, int64_t residual,
                                RowDtype rd) {
  return {bits, QuantAxis::kRow, group_channels, residual, rd};
}

void QuantCodec::set_layer(int layer, QuantSpec key, QuantSpec value) {
  layers_[layer] = {key, value};
}

const QuantSpec& QuantCodec::spec(KvKind kind, int layer) const {
  auto it = layers_.find(layer);
  if (it != layers_.end()) return kind == KvKind::kKey ? it->second.first : it->second.second;
  return kind == KvKind::kKey ? key_ : value_;
}

void QuantCodec::validate(const QuantSpec& s, int64_t head_dim, const std::string& where) {
  KVB_CHECK(kernels::quant_bits_supported(s.bits), where, ": ", s.bits,
            " bits not supported (allowed: 2, 3, 4, 8)");
  KVB_CHECK(s.group_size >= 1, where, ": group size ", s.group_size, " must be >= 1");
  KVB_CHECK(s.residual >= 0, where, ": residual length ", s.residual, " must be >= 0");
  if (s.axis == QuantAxis::kRow) {
    KVB_CHECK(head_dim % s.group_size == 0, where, ": a group of ", s.group_size,
              " channels does not divide head_dim ", head_dim, " (groups may not straddle heads)");
  } else {
    KVB_CHECK(s.residual % s.group_size == 0, where, ": residual length ", s.residual,
              " is not a multiple of the key group size ", s.group_size,
              " (per-channel groups are quantized when the residual fills)");
  }
}

std::unique_ptr<CodecStream> QuantCodec::make_stream(KvKind kind, int layer, int64_t width,
                                                     int64_t head_dim) const {
  const QuantSpec& s = spec(kind, layer);
  KVB_CHECK(head_dim >= 1 && width % head_dim == 0, name_, ": row width ", width,
            " is not a multiple of head_dim ", head_dim);
  validate(
      s, head_dim,
      name_ + (kind == KvKind::kKey ? " keys" : " values") + " layer " + std::to_string(layer));
  if (s.axis == QuantAxis::kRow) return std::make_unique<RowQuantStream>(s, width);
  return std::make_unique<ColQuantStream>(s, width);
}

double QuantCodec::declared_bits(KvKind kind, int layer) const {
  const QuantSpec& s = spec(kind, layer);
  return kernels::effective_bits_per_element(s.bits, s.group_size);
}

CodecBytes QuantCodec::expected_bytes(KvKind kind, int layer, int64_t width, int64_t rows) const {
  const QuantSpec& s = spec(kind, layer);
  CodecBytes b;
  int64_t enc = 0;
  if (s.axis == QuantAxis::kRow) {
    enc = std::max<int64_t>(0, rows - s.residual);
    b.code_bytes = enc * kernels::packed_code_bytes(width, s.bits);
    b.metadata_bytes = enc * (width / s.group_size) * 4;
  } else {
    const int64_t unit = s.residual > 0 ? s.residual : s.group_size;
    enc = rows / unit * unit;
    const int64_t blocks = enc / s.group_size;
    b.code_bytes = blocks * kernels::packed_code_bytes(s.group_size * width, s.bits);
    b.metadata_bytes = blocks * width * 4;
  }
  b.encoded_elems = enc * width;
  b.full_elems = (rows - enc) * width;
  b.full_bytes = b.full_elems * row_dtype_bytes(s.residual_dtype);
  return b;
}

std::map<std::string, double> QuantCodec::describe() const {
  std::map<std::string, double> d;
  auto put = [&](const std::string& prefix, const QuantSpec& s) {
    d[prefix + "bits"] = s.bits;
    d[prefix + "group_size"] = static_cast<double>(s.group_size);
    d[prefix + "per_channel"] = s.axis == QuantAxis::kColumn ? 1.0 : 0.0;
    d[prefix + "residual_length"] = static_cast<double>(s.residual);
    d[prefix + "declared_bits"] = kernels::effective_bits_per_element(s.bits, s.group_size);
  };
  put("k_", key_);
  put("v_", value_);
  for (const auto& [l, kv] : layers_) {
    d["layer" + std::to_string(l) + "_k_bits"] = kv.first.bits;
    d["layer" + std::to_string(l) + "_v_bits"] = kv.second.bits;
  }
  return d;
}

void keep_codec_rows(StreamBox& ks, StreamBox& vs, std::vector<float>& pk, std::vector<float>& pv,
                     int64_t* pend, int64_t len, int64_t dim, const std::vector<int64_t>& keep) {
  const int64_t S = len - *pend;  // rows held by the streams
  std::vector<int64_t> in_stream;
  int64_t np = 0;
  for (int64_t slot : keep) {
    if (slot < S) {
      in_stream.push_back(slot);
      continue;
    }
    const int64_t src = slot - S;  // ascending: src >= np, forward copies never clobber
    if (src != np) {
      std::memcpy(pk.data() + np * dim, pk.data() + src * dim, sizeof(float) * dim);
      std::memcpy(pv.data() + np * dim, pv.data() + src * dim, sizeof(float) * dim);
    }
    ++np;
  }
  if (ks.p && static_cast<int64_t>(in_stream.size()) < S) {
    ks.p->keep_rows(in_stream);
    vs.p->keep_rows(in_stream);
  }
  *pend = np;
  pk.resize(static_cast<size_t>(np * dim));
  pv.resize(static_cast<size_t>(np * dim));
}

}  // namespace kvb
