#pragma once
// A validating reader for GGUF (llama.cpp's model format, versions 2 and 3): a header, typed metadata
// key/values, a tensor index, then aligned tensor data. Torch-free: it hands out raw pointers into
// the memory-mapped file and dequantizes blocks to float32; the model loader wraps them.
//
// Layout (little-endian): "GGUF" magic, u32 version, u64 tensor count, u64 metadata count; each
// metadata entry is a string key, a u32 value type and the value (arrays: u32 element type, u64
// count, elements); each tensor entry is a string name, u32 n_dims, n_dims u64 dims (dims[0] is the
// fastest-varying), u32 ggml type, u64 offset relative to the data section; the data section starts
// at the next multiple of `general.alignment` (default 32) after the index.
//
// Everything is checked before any pointer is handed out: counts and string lengths against the bytes
// left, value and ggml types, dims x type = byte size, offsets aligned and inside the file, tensors not
// overlapping. A defect throws kvb::Error naming the file and the key or tensor.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/common/mapped_file.h"

namespace kvb {

// ggml's tensor types (the numbers are the file format's).
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kBF16 = 30,
};

// "F32", "Q4_K", ...; "type <n>" for a number ggml does not define.
std::string ggml_type_name(uint32_t type);
// Whether gguf_dequantize handles the type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K at least).
bool ggml_type_supported(uint32_t type);

// A metadata value. Integers of every width land in `i` (u64 above INT64_MAX is refused), floats in
// `f`, strings in `s`; arrays keep their element type and fill the matching vector.
struct GgufValue {
  enum class Kind { kInt, kFloat, kBool, kString, kArray };
  Kind kind = Kind::kInt;
  uint32_t type = 0;       // the GGUF value type as stored (0 u8 ... 12 f64)
  uint32_t elem_type = 0;  // arrays: the element type
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;         // integer arrays (and bool arrays as 0/1)
  std::vector<double> floats;        // float arrays
  std::vector<std::string> strings;  // string arrays
};

struct GgufTensor {
  std::string name;
  std::string file;            // the file's path (or source name), for errors
  uint32_t type = 0;           // a GgmlType number
  std::vector<int64_t> dims;   // GGUF order: dims[0] fastest (a matrix [out][in] is dims {in, out})
  uint64_t offset = 0;            // bytes from the start of the data section
  const uint8_t* data = nullptr;  // [nbytes], inside the mapping, read-only
  size_t nbytes = 0;
  int64_t numel() const;
  // Row-major shape as numpy / PyTorch write it: dims reversed ({out, in} for a matrix).
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  // Maps and validates `path`. Throws kvb::Error naming the file (and key or tensor) on any defect.
  explicit GgufFile(const std::string& path);
  // Validates GGUF bytes held in memory (a fuzzer's input); `source` names them in errors. The
  // bytes are copied, so the tensors' pointers stay valid for the object's lifetime.
  GgufFile(const std::string& bytes, const std::string& source);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t file_size() const { return size_; }
  size_t data_offset() const { return data_offset_; }  // where the data section starts
  uint32_t alignment() const { return alignment_; }

  bool has(const std::string& key) const { return meta_.count(key) != 0; }
  const std::map<std::string, GgufValue>& metadata() const { return meta_; }
  // Typed getters: throw kvb::Error naming the file and the key when absent or of another kind.
  const GgufValue& get(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // a float, or an integer widened
  bool get_bool(const std::string& key) const;
  const std::vector<std::string>& get_strings(const std::string& key) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  const std::vector<double>& get_floats(const std::string& key) const;  // float arrays only
  // The same with a default when the key is absent (a present key of the wrong kind still throws).
  std::string get_string_or(const std::string& key, const std::string& dflt) const;
  int64_t get_int_or(const std::string& key, int64_t dflt) const;
  double get_float_or(const std::string& key, double dflt) const;
  bool get_bool_or(const std::string& key, bool dflt) const;

  bool has_tensor(const std::string& name) const { return index_.count(name) != 0; }
  // Throws kvb::Error naming the file and the tensor when absent.
  const GgufTensor& tensor(const std::string& name) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // file order

 private:
  void parse(const uint8_t* data, size_t size);

  std::string path_;
  std::shared_ptr<MappedFile> file_;         // a mapped file, or
  std::shared_ptr<const std::string> bytes_;  // bytes given in memory
  size_t size_ = 0;
  size_t data_offset_ = 0;
  uint32_t alignment_ = 32;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> meta_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// Bytes of `n` elements of `type` (n a multiple of the type's block size); throws for an unknown type.
size_t ggml_row_bytes(uint32_t type, int64_t n);
// Elements per block (1 for F32/F16/BF16, 32 for Q4_0..Q8_0, 256 for the K-quants).
int64_t ggml_block_size(uint32_t type);

// Dequantizes `n` elements of `type` at `src` to float32 `dst[n]` (n a multiple of the block size).
// Throws kvb::Error for a type not supported (naming it).
void ggml_dequantize(uint32_t type, const uint8_t* src, float* dst, int64_t n);
// A whole tensor to float32, dst[t.numel()]; errors name the file's tensor.
void gguf_dequantize(const GgufTensor& t, float* dst);

}  // namespace kvb
