#include "methods/kv_packet/packet_adapter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "harness/common/error.h"
#include "methods/common/adapter_file.h"

namespace kvb::kv_packet {

namespace {
const char* const kKind = "kv-packet-adapter";  // the file's metadata 'kind'
}  // namespace

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
  const SafetensorsFile f = open_adapter(path, kKind, "KV Packet");
  const auto& m = f.metadata();
  Adapter a;
  for (auto [name, dst] :
       {std::pair<const char*, at::Tensor*>{"header", &a.header}, {"trailer", &a.trailer}}) {
    *dst = adapter_tensor(f, name);
    KVB_CHECK(dst->dim() == 2 && dst->size(1) == c.dim, path, ": tensor '", name,
              "' should be [rows, ", c.dim, "] for model ", c.name, " (dim ", c.dim, ")");
    KVB_CHECK(at::isfinite(*dst).all().item<bool>(), path, ": tensor '", name,
              "' holds NaN or infinity");
  }
  KVB_CHECK(a.header.size(0) + a.trailer.size(0) > 0, path, ": header and trailer are both empty");
  for (const auto& [k, v] : m) a.info[k] = v;
  return a;
}

void Adapter::save(const std::string& path, const std::map<std::string, std::string>& extra) const {
  std::map<std::string, std::string> meta = extra;
  meta["dim"] = std::to_string(header.size(1));
  meta["header_rows"] = std::to_string(header.size(0));
  meta["trailer_rows"] = std::to_string(trailer.size(0));
  write_adapter(path, kKind, {{"header", header}, {"trailer", trailer}}, std::move(meta));
}

}  // namespace kvb::kv_packet
