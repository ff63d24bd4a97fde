#include "harness/formats/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
// Header-only and torch-free: the kernels' fp16/bf16 conversions, so that every part of kvbench
// turns the same bits into the same float.
#include "kernels/include/kvb/kernels/half.h"

// The dequantizers must give ggml's bits: no a * b + c may become one fused multiply-add (GCC keeps
// them apart under -std=c++17; clang contracts within an expression unless told not to).
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace kvb {

namespace {

// ---- ggml types ----

struct TypeInfo {
  uint32_t id;
  const char* name;
  int64_t block;       // elements per block
  size_t block_bytes;  // bytes per block
};
// Block sizes as ggml's block structs define them (ggml-common.h). Types ggml has but this table
// lacks are refused as unknown: their sizes could not be checked, so no pointer could be trusted.
constexpr TypeInfo kTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},       {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},   {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},
};

const TypeInfo* find_type(uint32_t id) {
  for (const auto& t : kTypes)
    if (t.id == id) return &t;
  return nullptr;
}

// ---- GGUF metadata value types ----

enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8,
  kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
constexpr uint32_t kNumValueTypes = 13;

const char* value_type_name(uint32_t t) {
  static const char* const kNames[kNumValueTypes] = {"u8",   "i8",     "u16",   "i16", "u32",
                                                     "i32",  "f32",    "bool",  "string",
                                                     "array", "u64",   "i64",   "f64"};
  return t < kNumValueTypes ? kNames[t] : "?";
}

// The fewest bytes one value of a type takes (a string: its 8-byte length). Bounds a count read
// from the file against the bytes left before anything is reserved for it.
size_t min_value_bytes(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: case kString: return 8;
    case kArray: return 12;  // element type + count
  }
  return 1;
}

const char* kind_name(GgufValue::Kind k) {
  switch (k) {
    case GgufValue::Kind::kInt: return "an integer";
    case GgufValue::Kind::kFloat: return "a float";
    case GgufValue::Kind::kBool: return "a bool";
    case GgufValue::Kind::kString: return "a string";
    case GgufValue::Kind::kArray: return "an array";
  }
  return "?";
}

// Sequential little-endian reads with every length checked against the bytes left. `what` names
// the field being read, so that a truncation says where it happened.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  void need(size_t n, const std::string& what) const {
    KVB_CHECK(n <= left(), path_, ": truncated GGUF file: ", what, " needs ", n,
              " bytes at offset ", pos_, " but ", left(), " are left");
  }
  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // little-endian host; the file need not be aligned
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " (string length)");
    KVB_CHECK(len <= left(), path_, ": ", what, ": string length ", len,
              " goes beyond the end of the file (offset ", pos_, ", ", left(), " bytes left)");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

int64_t checked_int(uint64_t v, const std::string& path, const std::string& what) {
  KVB_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), path, ": ", what,
            ": u64 value ", v, " is larger than the largest supported integer (2^63 - 1)");
  return static_cast<int64_t>(v);
}

// One scalar of value type `t` as an integer, float or bool (strings and arrays are read apart).
void read_scalar(Cursor& c, uint32_t t, const std::string& path, const std::string& what,
                 GgufValue::Kind* kind, int64_t* i, double* f, bool* b) {
  switch (t) {
    case kU8: *kind = GgufValue::Kind::kInt; *i = c.read<uint8_t>(what); return;
    case kI8: *kind = GgufValue::Kind::kInt; *i = c.read<int8_t>(what); return;
    case kU16: *kind = GgufValue::Kind::kInt; *i = c.read<uint16_t>(what); return;
    case kI16: *kind = GgufValue::Kind::kInt; *i = c.read<int16_t>(what); return;
    case kU32: *kind = GgufValue::Kind::kInt; *i = c.read<uint32_t>(what); return;
    case kI32: *kind = GgufValue::Kind::kInt; *i = c.read<int32_t>(what); return;
    case kU64:
      *kind = GgufValue::Kind::kInt;
      *i = checked_int(c.read<uint64_t>(what), path, what);
      return;
    case kI64: *kind = GgufValue::Kind::kInt; *i = c.read<int64_t>(what); return;
    case kF32: *kind = GgufValue::Kind::kFloat; *f = c.read<float>(what); return;
    case kF64: *kind = GgufValue::Kind::kFloat; *f = c.read<double>(what); return;
    case kBool: {
      const uint8_t v = c.read<uint8_t>(what);
      KVB_CHECK(v <= 1, path, ": ", what, ": bool value is ", static_cast<int>(v),
                " (must be 0 or 1)");
      *kind = GgufValue::Kind::kBool;
      *b = v != 0;
      return;
    }
    default:
      KVB_FAIL(path, ": ", what, ": unknown value type ", t, " (GGUF defines 0..12)");
  }
}

GgufValue read_value(Cursor& c, const std::string& path, const std::string& what) {
  GgufValue v;
  v.type = c.read<uint32_t>(what + " (value type)");
  KVB_CHECK(v.type < kNumValueTypes, path, ": ", what, ": unknown value type ", v.type,
            " (GGUF defines 0..12)");
  if (v.type == kString) {
    v.kind = GgufValue::Kind::kString;
    v.s = c.read_string(what);
    return v;
  }
  if (v.type != kArray) {
    read_scalar(c, v.type, path, what, &v.kind, &v.i, &v.f, &v.b);
    return v;
  }
  v.kind = GgufValue::Kind::kArray;
  v.elem_type = c.read<uint32_t>(what + " (array element type)");
  KVB_CHECK(v.elem_type < kNumValueTypes, path, ": ", what, ": unknown array element type ",
            v.elem_type, " (GGUF defines 0..12)");
  // No real model nests arrays, and refusing them bounds the recursion a hostile file could ask for.
  KVB_CHECK(v.elem_type != kArray, path, ": ", what, ": nested arrays are not supported");
  const uint64_t n = c.read<uint64_t>(what + " (array length)");
  const size_t each = min_value_bytes(v.elem_type);
  KVB_CHECK(n <= c.left() / each, path, ": ", what, ": array of ", n, " ",
            value_type_name(v.elem_type), " values needs at least ", each, " bytes each but only ",
            c.left(), " bytes are left");
  const size_t count = static_cast<size_t>(n);
  if (v.elem_type == kString) {
    v.strings.reserve(count);
    for (size_t k = 0; k < count; ++k)
      v.strings.push_back(c.read_string(what + "[" + std::to_string(k) + "]"));
    return v;
  }
  const bool is_float = v.elem_type == kF32 || v.elem_type == kF64;
  if (is_float) {
    v.floats.reserve(count);
  } else {
    v.ints.reserve(count);
  }
  for (size_t k = 0; k < count; ++k) {
    GgufValue::Kind kind = GgufValue::Kind::kInt;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    read_scalar(c, v.elem_type, path, what + "[" + std::to_string(k) + "]", &kind, &i, &f, &b);
    if (is_float) {
      v.floats.push_back(f);
    } else {
      v.ints.push_back(kind == GgufValue::Kind::kBool ? (b ? 1 : 0) : i);
    }
  }
  return v;
}

std::string dims_str(const std::vector<int64_t>& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

// GGUF v1 (2023) used 32-bit lengths and counts; llama.cpp itself no longer reads it.
constexpr uint32_t kMinVersion = 2, kMaxVersion = 3;
constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS
// The fewest bytes a metadata entry (key length, value type, one byte) and a tensor entry (name
// length, n_dims, type, offset) take: bounds the header's counts by the file's size.
constexpr size_t kMinKvBytes = 8 + 4 + 1;
constexpr size_t kMinTensorBytes = 8 + 4 + 4 + 8;

}  // namespace

std::string ggml_type_name(uint32_t type) {
  const TypeInfo* t = find_type(type);
  return t ? t->name : "type " + std::to_string(type);
}

bool ggml_type_supported(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: case GgmlType::kF16: case GgmlType::kBF16: case GgmlType::kQ4_0:
    case GgmlType::kQ4_1: case GgmlType::kQ5_0: case GgmlType::kQ5_1: case GgmlType::kQ8_0:
    case GgmlType::kQ4_K: case GgmlType::kQ5_K: case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

int64_t ggml_block_size(uint32_t type) {
  const TypeInfo* t = find_type(type);
  KVB_CHECK(t != nullptr, "unknown ggml type ", type);
  return t->block;
}

size_t ggml_row_bytes(uint32_t type, int64_t n) {
  const TypeInfo* t = find_type(type);
  KVB_CHECK(t != nullptr, "unknown ggml type ", type);
  KVB_CHECK(n >= 0 && n % t->block == 0, "ggml type ", t->name, ": ", n,
            " elements is not a multiple of its block size ", t->block);
  const uint64_t blocks = static_cast<uint64_t>(n / t->block);
  KVB_CHECK(blocks <= std::numeric_limits<uint64_t>::max() / t->block_bytes, "ggml type ", t->name,
            ": ", n, " elements overflow a byte count");
  return static_cast<size_t>(blocks * t->block_bytes);
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::vector<int64_t> GgufTensor::shape() const { return {dims.rbegin(), dims.rend()}; }

GgufFile::GgufFile(const std::string& path)
    : path_(path), file_(std::make_shared<MappedFile>(path)) {
  parse(file_->data(), file_->size());
}

GgufFile::GgufFile(const std::string& bytes, const std::string& source)
    : path_(source), bytes_(std::make_shared<const std::string>(bytes)) {
  parse(reinterpret_cast<const uint8_t*>(bytes_->data()), bytes_->size());
}

void GgufFile::parse(const uint8_t* data, size_t size) {
  const std::string& path = path_;
  size_ = size;
  Cursor c(data, size, path);
  KVB_CHECK(size >= 4 && std::memcmp(data, "GGUF", 4) == 0, path,
            ": not a GGUF file (the magic \"GGUF\" is missing)");
  c.read<uint32_t>("magic");
  version_ = c.read<uint32_t>("version");
  KVB_CHECK(version_ != 1, path,
            ": GGUF version 1 is not supported (32-bit counts; convert the model again with a "
            "current llama.cpp)");
  KVB_CHECK(version_ >= kMinVersion && version_ <= kMaxVersion, path, ": GGUF version ", version_,
            " is not supported (2 or 3)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  KVB_CHECK(n_kv <= c.left() / kMinKvBytes, path, ": metadata count ", n_kv,
            " cannot fit in the ", c.left(), " bytes left");
  KVB_CHECK(n_tensors <= c.left() / kMinTensorBytes, path, ": tensor count ", n_tensors,
            " cannot fit in the ", c.left(), " bytes left");

  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string key = c.read_string("metadata key #" + std::to_string(k));
    const std::string what = "metadata key '" + key + "'";
    GgufValue v = read_value(c, path, what);
    KVB_CHECK(meta_.count(key) == 0, path, ": ", what, " appears twice");
    meta_.emplace(key, std::move(v));
  }

  if (auto it = meta_.find("general.alignment"); it != meta_.end()) {
    const GgufValue& a = it->second;
    KVB_CHECK(a.kind == GgufValue::Kind::kInt, path,
              ": metadata key 'general.alignment' must be an integer (got ", kind_name(a.kind), ")");
    KVB_CHECK(a.i > 0 && a.i <= (int64_t{1} << 30) && (a.i & (a.i - 1)) == 0, path,
              ": metadata key 'general.alignment' is ", a.i, " (must be a power of two, at most 2^30)");
    alignment_ = static_cast<uint32_t>(a.i);
  }

  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.file = path;
    t.name = c.read_string("tensor #" + std::to_string(k) + " name");
    const std::string what = "tensor '" + t.name + "'";
    KVB_CHECK(index_.count(t.name) == 0, path, ": ", what, " appears twice");
    const uint32_t n_dims = c.read<uint32_t>(what + " n_dims");
    KVB_CHECK(n_dims >= 1 && n_dims <= kMaxDims, path, ": ", what, ": n_dims is ", n_dims,
              " (must be 1..", kMaxDims, ")");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>(what + " dims");
      KVB_CHECK(dim > 0, path, ": ", what, ": dimension ", d, " is 0");
      KVB_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / numel, path,
                ": ", what, ": dimensions overflow the element count");
      numel *= dim;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    t.type = c.read<uint32_t>(what + " type");
    const TypeInfo* info = find_type(t.type);
    KVB_CHECK(info != nullptr, path, ": ", what, ": unknown ggml type ", t.type);
    KVB_CHECK(t.dims[0] % info->block == 0, path, ": ", what, ": ", info->name, " row length ",
              t.dims[0], " is not a multiple of its block size ", info->block);
    // Row bytes x rows, checked for overflow (a u64 count bounded by the file size below).
    const uint64_t row = static_cast<uint64_t>(t.dims[0] / info->block) * info->block_bytes;
    const uint64_t rows = numel / static_cast<uint64_t>(t.dims[0]);
    KVB_CHECK(rows <= std::numeric_limits<uint64_t>::max() / row, path, ": ", what, ": ",
              info->name, " x ", dims_str(t.dims), " overflows a byte count");
    t.nbytes = static_cast<size_t>(row * rows);
    t.offset = c.read<uint64_t>(what + " offset");
    index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (pos <= size, so no overflow).
  const uint64_t pos = c.pos();
  data_offset_ = static_cast<size_t>((pos + alignment_ - 1) / alignment_ * alignment_);
  if (tensors_.empty()) return;  // nothing to point into; the padding may be absent
  KVB_CHECK(data_offset_ <= size, path, ": the data section (at offset ", data_offset_,
            ", the index aligned to ", alignment_, ") starts beyond the end of the file (", size,
            " bytes)");
  const uint64_t data_size = size - data_offset_;
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(tensors_.size());
  for (GgufTensor& t : tensors_) {
    KVB_CHECK(t.offset % alignment_ == 0, path, ": tensor '", t.name, "': offset ", t.offset,
              " is not a multiple of general.alignment (", alignment_, ")");
    KVB_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset, path, ": tensor '",
              t.name, "': ", ggml_type_name(t.type), " x ", dims_str(t.dims), " needs ", t.nbytes,
              " bytes at data offset ", t.offset, ", past the end of the file (data section is ",
              data_size, " bytes)");
    t.data = data + data_offset_ + t.offset;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    KVB_CHECK(b.offset >= a.offset + a.nbytes, path, ": tensors '", a.name, "' (bytes ", a.offset,
              "..", a.offset + a.nbytes, ") and '", b.name, "' (from ", b.offset, ") overlap");
  }
}

// ---- metadata getters ----

const GgufValue& GgufFile::get(const std::string& key) const {
  auto it = meta_.find(key);
  KVB_CHECK(it != meta_.end(), path(), ": missing metadata key '", key, "'");
  return it->second;
}

namespace {
const GgufValue& expect_kind(const GgufValue& v, GgufValue::Kind k, const std::string& path,
                             const std::string& key) {
  KVB_CHECK(v.kind == k, path, ": metadata key '", key, "' is ", kind_name(v.kind), " (",
            value_type_name(v.type), "), not ", kind_name(k));
  return v;
}
const GgufValue& expect_array(const GgufValue& v, bool want_strings, bool want_floats,
                              const std::string& path, const std::string& key) {
  expect_kind(v, GgufValue::Kind::kArray, path, key);
  const bool is_string = v.elem_type == kString;
  const bool is_float = v.elem_type == kF32 || v.elem_type == kF64;
  const bool ok = want_strings ? is_string : want_floats ? is_float : !is_string && !is_float;
  KVB_CHECK(ok, path, ": metadata key '", key, "' is an array of ", value_type_name(v.elem_type),
            ", not of ", want_strings ? "strings" : want_floats ? "floats" : "integers");
  return v;
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  return expect_kind(get(key), GgufValue::Kind::kString, path(), key).s;
}
int64_t GgufFile::get_int(const std::string& key) const {
  return expect_kind(get(key), GgufValue::Kind::kInt, path(), key).i;
}
double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.kind == GgufValue::Kind::kInt) return static_cast<double>(v.i);
  return expect_kind(v, GgufValue::Kind::kFloat, path(), key).f;
}
bool GgufFile::get_bool(const std::string& key) const {
  return expect_kind(get(key), GgufValue::Kind::kBool, path(), key).b;
}
const std::vector<std::string>& GgufFile::get_strings(const std::string& key) const {
  return expect_array(get(key), true, false, path(), key).strings;
}
const std::vector<int64_t>& GgufFile::get_ints(const std::string& key) const {
  return expect_array(get(key), false, false, path(), key).ints;
}
const std::vector<double>& GgufFile::get_floats(const std::string& key) const {
  return expect_array(get(key), false, true, path(), key).floats;
}
std::string GgufFile::get_string_or(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}
int64_t GgufFile::get_int_or(const std::string& key, int64_t dflt) const {
  return has(key) ? get_int(key) : dflt;
}
double GgufFile::get_float_or(const std::string& key, double dflt) const {
  return has(key) ? get_float(key) : dflt;
}
bool GgufFile::get_bool_or(const std::string& key, bool dflt) const {
  return has(key) ? get_bool(key) : dflt;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  KVB_CHECK(it != index_.end(), path(), ": missing tensor '", name, "'");
  return tensors_[it->second];
}

// ---- dequantization ----
// Block layouts as ggml defines them (ggml-common.h; dequantize_row_* in ggml-quants.c). Products
// are formed in ggml's order ((d * scale) * q - (dmin * min)) so that the floats match its bits.

namespace {

using kernels::bf16_to_float;
using kernels::half_to_float;

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// Q4_0: fp16 d, 16 bytes of nibbles; element j is the low nibble of byte j, element j+16 the high.
void deq_q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// Q4_1: fp16 d, fp16 m, 16 bytes of nibbles: d * q + m.
void deq_q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5_0 / Q5_1: the fifth bit of element j is bit j of a little-endian u32 `qh`.
void deq_q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

void deq_q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

// Q8_0: fp16 d, 32 int8.
void deq_q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// The K-quants' 12 bytes of eight 6-bit scales and eight 6-bit mins: scales 0..3 and mins 0..3 are
// the low six bits of bytes 0..3 and 4..7; scales and mins 4..7 take their low four bits from bytes
// 8..11 and their top two from the spare bits of bytes 0..3 and 4..7.
inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: fp16 d, fp16 dmin, 12 scale bytes, 128 nibble bytes; eight sub-blocks of 32 in four groups
// of 64 (low nibbles of 32 bytes, then their high nibbles).
void deq_q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int g = 0; g < 4; ++g) {
    int sc, m;
    scale_min_k4(2 * g, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(2 * g + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    y += 64;
  }
}

// Q5_K: as Q4_K plus 32 bytes `qh` after the scales: bit s of qh[l] is the fifth bit of element l
// of sub-block s.
void deq_q5_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int g = 0; g < 4; ++g) {
    int sc, m;
    scale_min_k4(2 * g, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(2 * g + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const int s1 = 2 * g, s2 = 2 * g + 1;
    for (int l = 0; l < 32; ++l)
      y[l] = d1 * static_cast<float>((ql[l] & 0x0f) + (((qh[l] >> s1) & 1) << 4)) - m1;
    for (int l = 0; l < 32; ++l)
      y[32 + l] = d2 * static_cast<float>((ql[l] >> 4) + (((qh[l] >> s2) & 1) << 4)) - m2;
    ql += 32;
    y += 64;
  }
}

// Q6_K: 128 bytes low nibbles `ql`, 64 bytes of 2-bit highs `qh`, 16 int8 scales (one per 16
// elements), fp16 d; two halves of 128 elements, each four runs of 32 built from ql[0..63] and
// qh[0..31]. Values are 6-bit minus 32.
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

void ggml_dequantize(uint32_t type, const uint8_t* src, float* dst, int64_t n) {
  const TypeInfo* info = find_type(type);
  KVB_CHECK(info != nullptr && ggml_type_supported(type), "dequantizing ggml type ",
            ggml_type_name(type),
            " is not supported (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  KVB_CHECK(n >= 0 && n % info->block == 0, "dequantizing ", info->name, ": ", n,
            " elements is not a multiple of its block size ", info->block);
  const int64_t blocks = n / info->block;
  void (*fn)(const uint8_t*, float*) = nullptr;
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_at(src + 2 * i);
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_float(h);
      }
      return;
    case GgmlType::kQ4_0: fn = deq_q4_0; break;
    case GgmlType::kQ4_1: fn = deq_q4_1; break;
    case GgmlType::kQ5_0: fn = deq_q5_0; break;
    case GgmlType::kQ5_1: fn = deq_q5_1; break;
    case GgmlType::kQ8_0: fn = deq_q8_0; break;
    case GgmlType::kQ4_K: fn = deq_q4_k; break;
    case GgmlType::kQ5_K: fn = deq_q5_k; break;
    case GgmlType::kQ6_K: fn = deq_q6_k; break;
    default:
      KVB_UNREACHABLE("gguf", "ggml type ", info->name, " has no dequantizer");
  }
  for (int64_t k = 0; k < blocks; ++k)
    fn(src + static_cast<size_t>(k) * info->block_bytes, dst + k * info->block);
}

void gguf_dequantize(const GgufTensor& t, float* dst) {
  KVB_CHECK(ggml_type_supported(t.type), t.file, ": tensor '", t.name, "' is ", ggml_type_name(t.type),
            ", which cannot be dequantized (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
            "Q8_0, Q4_K, Q5_K, Q6_K)");
  ggml_dequantize(t.type, t.data, dst, t.numel());
}

}  // namespace kvb
