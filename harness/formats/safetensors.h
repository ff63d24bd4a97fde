#pragma once
// A validating reader for the safetensors format: 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data.
// Torch-free: it hands out raw pointers into the memory-mapped file; the model loader wraps them.
//
// Everything is checked before any pointer is handed out: N vs the file size, the JSON, every entry's
// fields, dtype x shape = byte size, offsets inside the data section and non-overlapping.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/common/mapped_file.h"

namespace kvb {

enum class StDtype { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

const char* st_dtype_name(StDtype d);
size_t st_dtype_size(StDtype d);

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // [nbytes], inside the mapping, read-only
  size_t nbytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws kvb::Error naming the file (and tensor) on any defect.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_->path(); }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws kvb::Error naming the file and the tensor when absent.
  const StTensor& get(const std::string& name) const;
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A model's weights as one or more safetensors files: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json` ({"weight_map": {tensor: file}}). Validates that the index's files
// exist and that each listed tensor is in the shard the index names.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& model_dir);
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const StTensor& get(const std::string& name) const;  // throws naming dir + tensor
  const std::string& file_of(const std::string& name) const;
  std::vector<std::string> names() const;
  // Keeps the mappings alive (the loader may hand out tensors that point into them).
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace kvb
