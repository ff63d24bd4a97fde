#pragma once
// Writes a safetensors file (the format safetensors.h reads): 8-byte little-endian header length,
// the JSON header padded with spaces to a multiple of 8, then the tensors' bytes in the order
// given. Torch-free. The file appears atomically: it is written to a temporary file of this process
// (atomic_file.h) and renamed, so a full disk or a crash never leaves a truncated checkpoint under
// the final name, and a failed write removes the temporary (a full disk: DiskFullError).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "harness/formats/safetensors.h"

namespace kvb {

struct StWriteEntry {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // [nbytes] = numel(shape) * st_dtype_size(dtype)
  size_t nbytes = 0;
};

// Throws kvb::Error naming `path` (and the tensor) on a bad entry or a failed write.
void write_safetensors(const std::string& path, const std::vector<StWriteEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {});

// Writes `text` to `path` through a temporary file and a rename; throws naming the path on failure.
void write_text_file_atomic(const std::string& path, const std::string& text);

}  // namespace kvb
