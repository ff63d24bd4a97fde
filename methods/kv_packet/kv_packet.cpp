// kv_packet: KV Packet (Chen et al., arXiv 2604.13226) -- recomputation-free reuse of per-document KV
// caches. Documents are prefilled alone, each wrapped in a trained soft header and trailer
// (packet_adapter.h), and placed one after another at query time with their keys re-rotated (the
// store's splice); only the question is prefilled then. The store is the dense per-sequence cache of
// `full` (or, with a `codec`, the codec store: packets kept quantized): what differs from `full` is
// the qa protocol's document route, which this store's document_reuse() turns on. The protocols
// without documents (stream, probe, perf) run it as `full` (or as that codec store).

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/kv/method_registry.h"
#include "methods/common/codec_kv_cache.h"
#include "methods/common/contiguous_kv_cache.h"
#include "methods/common/eviction_select.h"
#include "methods/kv_packet/packet_adapter.h"

namespace kvb {
namespace {

// A store that can splice, declaring how documents are cached (composition by subclassing the
// store: the dense one, or the codec store).
template <class Store>
class KvPacketCache : public Store {
 public:
  template <class... Args>
  explicit KvPacketCache(DocumentReuse reuse, Args&&... args)
      : Store(std::forward<Args>(args)...), reuse_(std::move(reuse)) {}
  const DocumentReuse* document_reuse() const override { return &reuse_; }
  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m = Store::counters();
    m["doc_tokens"] = static_cast<double>(reuse_.doc_tokens);
    m["rows_per_document"] = static_cast<double>(reuse_.extra_rows());
    return m;
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
  for (auto& c : codec_params()) m.params.push_back(c);  // packets kept quantized (CPU codec store)
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
  if (auto codec = parse_codec(p, "kv_packet", ctx.config.head_dim))
    return std::make_unique<KvPacketCache<CodecKvCache>>(std::move(r), ctx, codec, "kv_packet");
  return std::make_unique<KvPacketCache<ContiguousKvCache>>(std::move(r), ctx,
                                                            ContiguousKvCache::Mode::kGrow, 0,
                                                            "kv_packet");
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(kv_packet, kvb::kv_packet_info, kvb::make_kv_packet);
