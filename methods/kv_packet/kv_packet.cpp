// kv_packet: KV Packet (Chen et al., arXiv 2604.13226) -- recomputation-free reuse of per-document
// KV caches. Documents are prefilled alone, each wrapped in a trained soft header and trailer
// (packet_adapter.h), and placed one after another at query time with their keys re-rotated (the
// store's splice); only the question is prefilled then. The store is the dense per-sequence cache
// of `full` (or, with a `codec`, the codec store: packets kept quantized; or, with `inner`, any
// method whose store can splice, wrapped: e.g. SnapKV-compressed packets): what differs from that
// store is the qa protocol's document route, which this store's document_reuse() turns on. The
// protocols without documents (stream, probe, perf) run it as that store.

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/kv/document_reuse.h"
#include "harness/kv/forwarding_kv_cache.h"
#include "harness/kv/hidden_state.h"
#include "harness/kv/lookahead.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/probe_view.h"
#include "harness/kv/splice.h"
#include "methods/common/codec_kv_cache.h"
#include "methods/common/contiguous_kv_cache.h"
#include "methods/common/eviction_select.h"
#include "methods/common/method_listing.h"
#include "methods/kv_packet/packet_adapter.h"

namespace kvb {
namespace {

// A store that can splice, declaring how documents are cached (composition by subclassing the
// store: the dense one, or the codec store).
template <class Store>
class KvPacketCache : public Store, public DocumentReuseCache {
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

// Any splicing store, wrapped (composition by wrapping, as kvpress composes presses): every call
// goes to the inner store, capabilities included; the wrapper adds how documents are cached.
class PacketWrapper : public ForwardingKvCache,
                      public DocumentReuseCache,
                      public SplicingCache,
                      public ProbedCache,
                      public LookaheadCache,
                      public HiddenStateCache {
 public:
  PacketWrapper(DocumentReuse reuse, std::unique_ptr<KvCache> inner)
      : ForwardingKvCache(std::move(inner)), reuse_(std::move(reuse)) {}
  std::string name() const override { return "kv_packet(" + inner().name() + ")"; }
  std::map<std::string, double> counters() const override {
    std::map<std::string, double> m = inner().counters();
    m["doc_tokens"] = static_cast<double>(reuse_.doc_tokens);
    m["rows_per_document"] = static_cast<double>(reuse_.extra_rows());
    return m;
  }
  std::vector<HeadSnapshot> probe_view(int layer, int64_t seq_id) const override {
    return probe_view_of(inner(), layer, seq_id);
  }
  bool wants_lookahead() const override { return wanting_lookahead(inner()) != nullptr; }
  void set_lookahead_rows(const std::vector<uint8_t>& rows) override {
    if (LookaheadCache* l = wanting_lookahead(wrapped())) l->set_lookahead_rows(rows);
  }
  bool can_splice() const override { return splicing(inner()) != nullptr; }
  void splice(int64_t dst_id, const std::vector<SpliceSource>& sources) override {
    splicing(wrapped())->splice(dst_id, sources);
  }
  void layer_hidden(int layer, const at::Tensor& hidden) override {
    if (auto* h = dynamic_cast<HiddenStateCache*>(&wrapped())) h->layer_hidden(layer, hidden);
  }
  const DocumentReuse* document_reuse() const override { return &reuse_; }

 private:
  DocumentReuse reuse_;
};

MethodInfo kv_packet_info() {
  MethodInfo m = method_listing(
      "kv_packet",
      "KV Packet: documents cached separately (each wrapped in a trained soft header/trailer), "
      "spliced with re-rotated keys at query time; no document token recomputed",
      "Chen et al., KV Packet: Recomputation-Free Context-Independent KV Caching (arXiv "
      "2604.13226)",
      {string_param(
           "wrap", "adapter", {"adapter", "none", "bos"},
           "adapter: the trained header and trailer (KV Packet); none: plain concatenation "
           "of separately prefilled documents (the paper's no-recompute baseline); bos: a BOS "
           "token before each document (an untrained one-row header)"),
       string_param(
           "adapter", "", {},
           "the header/trailer file from `kvbench packet-train` (safetensors); required with "
           "wrap=adapter"),
       int_param("doc_tokens", 256, 0, 1 << 24,
                 "tokens per document: the qa context is cut into documents of about this many "
                 "tokens, at a sentence end where one is near (0: the whole context is one "
                 "document)"),
       string_param(
           "inner", "full", {},
           "the store that keeps the packets: full (the dense cache; with `codec`, the "
           "codec store) or any method whose store can splice, e.g. snapkv, h2o, "
           "streaming_llm, pyramidkv (each document is then compressed by that method when "
           "it is cached, before the question exists)"),
       string_param("inner_params", "{}", {},
                    "the inner method's parameters, a JSON object, e.g. {\"budget\": 0.25}")});
  for (auto& c : codec_params()) m.params.push_back(c);  // packets kept quantized (CPU codec store)
  // Where the codec runs, and where the inner store runs (when its parameters parse; the factory
  // reports any that do not).
  m.target_check = [](const nlohmann::json& p, const RunTarget& t) -> std::string {
    std::string why = codec_target_check(p, t);
    if (!why.empty()) return why;
    const std::string inner = p.value("inner", "full");
    nlohmann::json inner_params;
    const auto& reg = MethodRegistry::instance();
    if (inner == "kv_packet" || !reg.has(inner) ||
        !parse_json_if_valid(p.value("inner_params", "{}"), "method kv_packet.inner_params",
                             &inner_params) ||
        !inner_params.is_object())
      return "";
    why = reg.target_refusal(inner, reg.resolve(inner, inner_params), t);
    return why.empty() ? why : "inner=" + inner + ": " + why;
  };
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
  const std::string inner = p["inner"];
  nlohmann::json inner_params;
  if (!parse_json_if_valid(p["inner_params"].get<std::string>(), "method kv_packet.inner_params",
                           &inner_params)) {
    KVB_FAIL("method kv_packet.inner_params: not a JSON object: ",
             p["inner_params"].get<std::string>());
  }
  KVB_CHECK(inner_params.is_object(), "method kv_packet.inner_params: must be a JSON object, got ",
            inner_params.dump());
  if (inner != "full" || !inner_params.empty()) {
    KVB_CHECK(inner != "kv_packet", "method kv_packet.inner: kv_packet cannot wrap itself");
    KVB_CHECK(p["codec"] == "none", "method kv_packet.codec: give the codec to the inner method (",
              inner, ") instead, in inner_params");
    std::unique_ptr<KvCache> store = MethodRegistry::instance().create(inner, ctx, inner_params);
    KVB_CHECK(splicing(*store) != nullptr, "method kv_packet.inner=", inner, ": its store (",
              store->name(), ") cannot splice sequences, so its packets cannot be reused");
    return std::make_unique<PacketWrapper>(std::move(r), std::move(store));
  }
  if (auto codec = parse_codec(p, "kv_packet", ctx.config.head_dim))
    return std::make_unique<KvPacketCache<CodecKvCache>>(std::move(r), ctx, codec, "kv_packet");
  return std::make_unique<KvPacketCache<ContiguousKvCache>>(
      std::move(r), ctx, ContiguousKvCache::Mode::kGrow, 0, "kv_packet");
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_METHOD(kv_packet, kvb::kv_packet_info, kvb::make_kv_packet);
