#include "methods/common/adapter_file.h"

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/formats/safetensors_writer.h"

namespace kvb {

SafetensorsFile open_adapter(const std::string& path, const std::string& kind,
                             const std::string& what) {
  SafetensorsFile f(path);
  const auto& m = f.metadata();
  auto found = m.find("kind");
  KVB_CHECK(found != m.end() && found->second == kind, path, ": not a ", what,
            " adapter (metadata 'kind' is not '", kind, "')");
  return f;
}

at::Tensor adapter_tensor(const SafetensorsFile& f, const std::string& name) {
  const StTensor& t = f.get(name);
  KVB_CHECK(t.dtype == StDtype::kF32, f.path(), ": tensor '", name, "' is not F32");
  return at::from_blob(const_cast<uint8_t*>(t.data), t.shape, at::TensorOptions().dtype(at::kFloat))
      .clone();
}

void write_adapter(const std::string& path, const std::string& kind,
                   const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                   std::map<std::string, std::string> meta) {
  std::vector<at::Tensor> keep;  // the host fp32 copies the entries point into
  keep.reserve(tensors.size());
  std::vector<StWriteEntry> entries;
  for (const auto& [name, x] : tensors) {
    keep.push_back(x.detach().to(at::kCPU, at::kFloat).contiguous());
    StWriteEntry e;
    e.name = name;
    e.dtype = StDtype::kF32;
    e.shape = keep.back().sizes().vec();
    e.data = keep.back().data_ptr<float>();
    e.nbytes = static_cast<size_t>(keep.back().numel()) * sizeof(float);
    entries.push_back(e);
  }
  meta["kind"] = kind;
  write_safetensors(path, entries, meta);
}

}  // namespace kvb
