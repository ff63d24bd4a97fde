// kv_packet: KV Packet (Chen et al., arXiv 2604.13226) -- recomputation-free reuse of per-document KV
// caches. Documents are prefilled alone, each wrapped in a trained soft header and trailer
// (packet_adapter.h), and placed one after another at query time with their keys re-rotated (the
// store's splice); only the question is prefilled then. The store is the dense per-sequence cache of
// `full`: what differs from `full` is the qa protocol's document route, which this store's
// document_reuse() turns on. The protocols without documents (stream, probe, perf) run it as `full`.

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/kv/method_registry.h"
#include "methods/common/contiguous_kv_cache.h"
#include "methods/kv_packet/packet_adapter.h"

namespace kvb {
namespace {

class KvPacketCache : public ContiguousKvCache {
 public:
  KvPacketCache(const CacheContext& ctx, DocumentReuse reuse)
      : ContiguousKvCache(ctx, Mode::kGrow, 0, "kv_packet"), reuse_(std::move(reuse)) {}
  const DocumentReuse* document_reuse() const override { return &reuse_; }
  std::map<std::string, double> counters() const override {
    return {{"doc_tokens", static_cast<double>(reuse_.doc_tokens)},
            {"rows_per_document", static_cast<double>(reuse_.extra_rows())}};
  }

 private:
  DocumentReuse reuse_;
};

MethodInfo kv_packet_info() {
  MethodInfo m;
  m.name = "kv_packet";
  m.summary =
      "KV Packet: documents cached separately (each wrapped in a trained soft header/trailer), "
      "spliced with re-rotated keys at query time; no document token recomputed";
  m.paper =
      "Chen et al., KV Packet: Recomputation-Free Context-Independent KV Caching (arXiv 2604.13226)";
  m.params = {
      string_param("wrap", "adapter", {"adapter", "none", "bos"},
                   "adapter: the trained header and trailer (KV Packet); none: plain concatenation "
                   "of separately prefilled documents (the paper's no-recompute baseline); bos: a BOS "
                   "token before each document (an untrained one-row header)"),
      string_param("adapter", "", {},
                   "the header/trailer file from `kvbench packet-train` (safetensors); required with "
                   "wrap=adapter"),
      int_param("doc_tokens", 256, 0, 1 << 24,
                "tokens per document: the qa context is cut into documents of about this many "
                "tokens, at a sentence end where one is near (0: the whole context is one "
                "document)")};
  return m;
}

std::unique_ptr<KvCache> make_kv_packet(const CacheContext& ctx, const nlohmann::json& p) {
  DocumentReuse r;
  r.doc_tokens = p["doc_tokens"].get<int64_t>();
  const std::string wrap = p["wrap"];
  const std::string path = p["adapter"];
  if (wrap == "adapter") {
    KVB_CHECK(!path.empty(),
              "method kv_packet.adapter: no adapter given (train one with `kvbench packet-train`, "
              "or set wrap=none / bos)");
    kv_packet::Adapter a = kv_packet::Adapter::load(path, ctx.config);
    auto to_model = [&](const at::Tensor& t) {
      return t.size(0) == 0 ? at::Tensor() : t.to(ctx.device, ctx.dtype);
    };
    r.header = to_model(a.header);
    r.trailer = to_model(a.trailer);
  } else {
    KVB_CHECK(path.empty(), "method kv_packet.adapter: given with wrap=", wrap,
              ", which uses no adapter (set wrap=adapter)");
    if (wrap == "bos") r.header_ids = {ctx.config.bos_id};
  }
  return std::make_unique<KvPacketCache>(ctx, std::move(r));
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(kv_packet, kvb::kv_packet_info, kvb::make_kv_packet);
