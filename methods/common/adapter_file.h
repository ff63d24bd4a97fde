#pragma once
// The adapter files of the methods that train a few tensors against a frozen model (DMS's eviction
// decisions, KV Packet's soft header and trailer): safetensors of fp32 tensors whose metadata
// 'kind' names the method's format, so that one method's file is never read as another's.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness/formats/safetensors.h"

namespace kvb {

// Opens `path` and checks its metadata 'kind' is `kind`; what: the format in an error ("DMS").
SafetensorsFile open_adapter(const std::string& path, const std::string& kind,
                             const std::string& what);

// Tensor `name` of an adapter, fp32 (an error naming the file and tensor otherwise), copied out of
// the mapping.
at::Tensor adapter_tensor(const SafetensorsFile& f, const std::string& name);

// Writes `tensors` (in order; copied to fp32 on the host) with `meta` and kind = `kind`.
void write_adapter(const std::string& path, const std::string& kind,
                   const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                   std::map<std::string, std::string> meta);

}  // namespace kvb
