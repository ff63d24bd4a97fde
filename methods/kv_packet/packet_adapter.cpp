#include "methods/kv_packet/packet_adapter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "harness/common/error.h"
#include "harness/formats/safetensors.h"
#include "harness/formats/safetensors_writer.h"

namespace kvb::kv_packet {

Adapter Adapter::fresh(const ModelConfig& c, int64_t header_rows, int64_t trailer_rows, double std,
                       uint64_t seed) {
  KVB_CHECK(header_rows >= 0 && trailer_rows >= 0 && header_rows + trailer_rows > 0,
            "kv_packet: header and trailer rows must be >= 0 and not both 0 (got ", header_rows,
            ", ", trailer_rows, ")");
  at::Generator gen = at::detail::createCPUGenerator(seed);
  Adapter a;
  a.header = at::normal(0.0, std, {header_rows, c.dim}, gen);
  a.trailer = at::normal(0.0, std, {trailer_rows, c.dim}, gen);
  return a;
}

Adapter Adapter::load(const std::string& path, const ModelConfig& c) {
  SafetensorsFile f(path);
  const auto& m = f.metadata();
  auto kind = m.find("kind");
  KVB_CHECK(kind != m.end() && kind->second == "kv-packet-adapter", path,
            ": not a KV Packet adapter (metadata 'kind' is not 'kv-packet-adapter')");
  Adapter a;
  for (auto [name, dst] : {std::pair<const char*, at::Tensor*>{"header", &a.header},
                           {"trailer", &a.trailer}}) {
    const StTensor& t = f.get(name);
    KVB_CHECK(t.dtype == StDtype::kF32, path, ": tensor '", name, "' is not F32");
    KVB_CHECK(t.shape.size() == 2 && t.shape[1] == c.dim, path, ": tensor '", name,
              "' should be [rows, ", c.dim, "] for model ", c.name, " (dim ", c.dim, ")");
    *dst = at::from_blob(const_cast<uint8_t*>(t.data), t.shape, at::TensorOptions().dtype(at::kFloat))
               .clone();
    KVB_CHECK(at::isfinite(*dst).all().item<bool>(), path, ": tensor '", name,
              "' holds NaN or infinity");
  }
  KVB_CHECK(a.header.size(0) + a.trailer.size(0) > 0, path, ": header and trailer are both empty");
  for (const auto& [k, v] : m) a.info[k] = v;
  return a;
}

void Adapter::save(const std::string& path, const std::map<std::string, std::string>& extra) const {
  at::Tensor h = header.detach().to(at::kCPU, at::kFloat).contiguous();
  at::Tensor t = trailer.detach().to(at::kCPU, at::kFloat).contiguous();
  std::vector<StWriteEntry> entries;
  for (auto [name, x] : {std::pair<const char*, const at::Tensor*>{"header", &h}, {"trailer", &t}}) {
    StWriteEntry e;
    e.name = name;
    e.dtype = StDtype::kF32;
    e.shape = x->sizes().vec();
    e.data = x->data_ptr<float>();
    e.nbytes = static_cast<size_t>(x->numel()) * sizeof(float);
    entries.push_back(e);
  }
  std::map<std::string, std::string> meta = extra;
  meta["kind"] = "kv-packet-adapter";
  meta["dim"] = std::to_string(h.size(1));
  meta["header_rows"] = std::to_string(h.size(0));
  meta["trailer_rows"] = std::to_string(t.size(0));
  write_safetensors(path, entries, meta);
}

}  // namespace kvb::kv_packet
