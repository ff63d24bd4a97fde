// KVTC calibration: K/V collection from calibration text run through the model, the artifact (PCA
// bases, quantizer steps, bit allocation) and its content-hash cache on disk.

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/fast_hash.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/sha256.h"
#include "harness/engine/engine.h"
#include "harness/formats/safetensors.h"
#include "harness/formats/safetensors_writer.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "methods/common/observed_kv_cache.h"
#include "methods/kvtc/kvtc.h"

namespace kvb::kvtc {
namespace {

// Every layer's pre-RoPE keys, post-RoPE keys and values of one sequence, recorded by an
// observer (observed_kv_cache.h) while the wrapped full cache serves attention.
struct KvCapture {
  explicit KvCapture(int64_t n_layers) : k_pre(n_layers), k_post(n_layers), v(n_layers) {}
  void observe(const LayerInput& in) {
    KVB_CHECK(in.batch->batch_size() == 1, "kvtc calibration: one sequence at a time");
    k_pre[in.layer].push_back(in.k_pre_rope->to(at::kFloat).clone());
    k_post[in.layer].push_back(in.k->to(at::kFloat).clone());
    v[in.layer].push_back(in.v->to(at::kFloat).clone());
  }
  // [T, n_layers * kv_dim] of what was captured, then cleared.
  static at::Tensor take(std::vector<std::vector<at::Tensor>>& per_layer) {
    std::vector<at::Tensor> layers;
    for (auto& l : per_layer) {
      at::Tensor t = at::cat(l, 0);
      layers.push_back(t.reshape({t.size(0), -1}));
      l.clear();
    }
    return at::cat(layers, 1);
  }
  std::vector<std::vector<at::Tensor>> k_pre, k_post, v;  // [layer][step] -> [T, H, D]
};

void mkdirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if ((i == dir.size() || dir[i] == '/') && !cur.empty()) ::mkdir(cur.c_str(), 0755);
    if (i < dir.size()) cur += dir[i];
  }
}

nlohmann::json calib_json(const CalibOptions& c, const std::string& corpus_sha) {
  return {{"corpus", c.corpus},          {"corpus_sha256", corpus_sha},
          {"tokens", c.tokens},          {"skip_tokens", c.skip_tokens},
          {"window", c.window},          {"exclude_sinks", c.exclude_sinks},
          {"exclude_recent", c.exclude_recent}};
}

// The model by its content (weights, config, dtype) and its tokenizer's, which cuts the
// calibration text into tokens; where its files live does not enter.
nlohmann::json model_json(const Model& m) {
  return {{"config", m.config.to_json()},
          {"content", m.content_hash()},
          {"tokenizer", m.tokenizer_hash()},
          {"dtype", dtype_name(m.dtype)}};
}

// FastHash of the artifact's tensors in name order (name, then bytes): recorded in the file and
// checked on load, so a changed or zeroed payload is refused instead of read as numbers.
std::string payload_hash(std::map<std::string, std::pair<const void*, size_t>> tensors) {
  FastHash h;
  for (const auto& [name, bytes] : tensors) {
    h.update_field(name);
    h.update(bytes.first, bytes.second);
  }
  return h.hex_digest();
}

std::mutex& memo_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

CalibData collect_kv(const std::shared_ptr<Model>& model, const CalibOptions& o) {
  const ModelConfig& c = model->config;
  const int64_t per_seq = o.window - o.exclude_sinks - o.exclude_recent;
  KVB_CHECK(o.window >= 2 && o.exclude_sinks >= 0 && o.exclude_recent >= 0 && per_seq >= 1,
            "kvtc calibration: a window of ", o.window, " tokens minus ", o.exclude_sinks,
            " sinks and ", o.exclude_recent, " recent tokens leaves nothing to collect");
  KVB_CHECK(o.tokens >= 2, "kvtc calibration: calib_tokens ", o.tokens, " must be >= 2");
  KVB_CHECK(!model->tokenizer_path.empty(), "kvtc calibration: model ", model->source,
            " has no tokenizer");
  auto corpus = load_corpus(o.corpus, resolve_data_dir(o.data_dir));
  Tokenizer tok(model->tokenizer_path);
  const int64_t n_seq = (o.tokens + per_seq - 1) / per_seq;
  const int64_t content = o.window - 1;
  std::vector<int64_t> ids = encode_long_text(tok, corpus->text, o.skip_tokens + n_seq * content);
  KVB_CHECK(static_cast<int64_t>(ids.size()) >= o.skip_tokens + content, "kvtc calibration: corpus ",
            o.corpus, " holds ", ids.size(), " tokens, fewer than calib_skip_tokens ",
            o.skip_tokens, " + one window of ", o.window);
  CacheContext ctx{c, model->device, model->dtype};
  KvCapture cap(c.n_layers);
  auto capture = std::make_unique<ObservedKvCache>(
      MethodRegistry::instance().create("full", ctx, nlohmann::json::object()),
      [&](const LayerInput& in) { cap.observe(in); });
  EngineOptions eo;
  eo.prefill_chunk = o.window;
  Engine e(model, std::move(capture), eo);
  std::vector<at::Tensor> kp, kq, vv;
  CalibData d;
  d.corpus_sha256 = corpus->sha256;
  int64_t got = 0;
  for (int64_t s = 0; s < n_seq && got < o.tokens; ++s) {
    const int64_t start = o.skip_tokens + s * content;
    if (start + content > static_cast<int64_t>(ids.size())) break;
    std::vector<int64_t> seq = {c.bos_id};
    seq.insert(seq.end(), ids.begin() + start, ids.begin() + start + content);
    const int64_t id = e.new_sequence();
    e.prefill({id}, {seq}, nullptr, /*call_end_prefill=*/false);
    e.release(id);
    const int64_t take = std::min(per_seq, o.tokens - got);
    kp.push_back(KvCapture::take(cap.k_pre).narrow(0, o.exclude_sinks, take));
    kq.push_back(KvCapture::take(cap.k_post).narrow(0, o.exclude_sinks, take));
    vv.push_back(KvCapture::take(cap.v).narrow(0, o.exclude_sinks, take));
    got += take;
    d.sequences++;
  }
  KVB_CHECK(got >= 2, "kvtc calibration: corpus ", o.corpus, " gave no calibration tokens");
  d.k_pre = at::cat(kp, 0).contiguous();
  d.k_post = at::cat(kq, 0).contiguous();
  d.v = at::cat(vv, 0).contiguous();
  return d;
}

nlohmann::json artifact_meta(const Model& model, const CalibOptions& c, const TransformOptions& t) {
  auto corpus = load_corpus(c.corpus, resolve_data_dir(c.data_dir));
  // Version 2 adds the post-RoPE reference (k_post_rope); version 3 keys the model by its
  // content and checks the payload. An older file is recalibrated.
  nlohmann::json meta = {{"kvtc_artifact_version", 3},
                         {"model", model_json(model)},
                         {"calibration", calib_json(c, corpus->sha256)},
                         {"transform",
                          {{"pca_scope", scope_name(t.scope)},
                           {"rank", t.rank},
                           {"bits_per_element", t.bits_per_element},
                           {"band", t.band},
                           {"fit_samples", t.fit_samples},
                           {"widths", allowed_widths()}}}};
  // Only the uniform baseline names its allocation, so the DP artifacts keep their keys.
  if (t.allocation != BitAllocation::kDp)
    meta["transform"]["allocation"] = bit_allocation_name(t.allocation);
  return meta;
}

void save_artifact(const Artifact& a, const std::string& path) {
  std::vector<StWriteEntry> entries;
  std::vector<std::vector<int32_t>> bits_store;  // keeps the int32 widths alive
  std::vector<at::Tensor> keep;
  nlohmann::json kinds;
  for (const auto& [kname, kt] : {std::pair<const char*, const KindTransform*>{"k", &a.k},
                                  {"v", &a.v}}) {
    nlohmann::json groups = nlohmann::json::array();
    for (size_t g = 0; g < kt->groups.size(); ++g) {
      const Group& G = kt->groups[g];
      const std::string p = std::string(kname) + "." + std::to_string(g) + ".";
      const int64_t used = G.basis.size(1);
      entries.push_back({p + "mean", StDtype::kF32, {G.dim}, G.mean.data_ptr<float>(),
                         static_cast<size_t>(G.dim * 4)});
      if (used > 0) {
        entries.push_back({p + "basis", StDtype::kF32, {G.dim, used}, G.basis.data_ptr<float>(),
                           static_cast<size_t>(G.dim * used * 4)});
        bits_store.emplace_back(G.bits.begin(), G.bits.end());
        entries.push_back({p + "bits", StDtype::kI32, {used}, nullptr, static_cast<size_t>(used * 4)});
        entries.push_back({p + "step", StDtype::kF32, {used}, G.step.data(),
                           static_cast<size_t>(used * 4)});
      }
      groups.push_back({{"offset", G.offset}, {"dim", G.dim}, {"rank", G.rank}, {"used", used}});
    }
    kinds[kname] = {{"width", kt->width},
                    {"code_bits_per_token", kt->code_bits_per_token},
                    {"components_used", kt->components_used},
                    {"expected_mse", kt->expected_mse},
                    {"total_variance", kt->total_variance},
                    {"energy_top_used", kt->energy_top_used},
                    {"groups", groups}};
  }
  // Point the bits entries at their (now stable) storage.
  size_t b = 0;
  for (auto& e : entries)
    if (e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".bits") == 0)
      e.data = bits_store[b++].data();
  std::map<std::string, std::pair<const void*, size_t>> payload;
  for (const auto& e : entries) payload[e.name] = {e.data, e.nbytes};
  nlohmann::json head = {
      {"meta", a.meta},
      {"key", a.key},
      {"payload_hash", payload_hash(payload)},
      {"kinds", kinds},
      {"k_post_rope",
       {{"rel_mse", a.k_post_rope_rel_mse}, {"energy_top_used", a.k_post_rope_energy_top_used}}}};
  mkdirs(path.substr(0, path.find_last_of('/')));
  write_safetensors(path, entries, {{"kvtc", head.dump()}});
}

std::shared_ptr<Artifact> load_artifact(const std::string& path) {
  SafetensorsFile f(path);
  auto it = f.metadata().find("kvtc");
  KVB_CHECK(it != f.metadata().end(), path, ": not a kvtc artifact (no 'kvtc' metadata)");
  const nlohmann::json head = parse_json(it->second, path + ": kvtc metadata");
  auto a = std::make_shared<Artifact>();
  a->meta = head.at("meta");
  a->key = head.at("key").get<std::string>();
  a->path = path;
  a->from_cache = true;
  KVB_CHECK(head.contains("k_post_rope") && head["k_post_rope"].is_object(), path,
            ": kvtc metadata has no 'k_post_rope' (an artifact older than version 2)");
  std::map<std::string, std::pair<const void*, size_t>> payload;
  for (const auto& [name, t] : f.tensors()) payload[name] = {t.data, t.nbytes};
  const std::string got = payload_hash(payload);
  const std::string want = head.value("payload_hash", "");
  KVB_CHECK(got == want, path, ": kvtc artifact is corrupt (payload hash ", got, ", recorded ",
            want.empty() ? "nothing" : want, "); delete it to recalibrate");
  a->k_post_rope_rel_mse = head["k_post_rope"].at("rel_mse").get<double>();
  a->k_post_rope_energy_top_used = head["k_post_rope"].at("energy_top_used").get<double>();
  auto tensor = [&](const std::string& name, at::ScalarType st) {
    const StTensor& t = f.get(name);
    at::Tensor out = at::empty(t.shape, at::TensorOptions().dtype(st));
    KVB_CHECK(static_cast<size_t>(out.nbytes()) == t.nbytes, path, ": tensor ", name, " size");
    std::memcpy(out.data_ptr(), t.data, t.nbytes);
    return out;
  };
  for (const auto& [kname, kt] :
       {std::pair<const char*, KindTransform*>{"k", &a->k}, {"v", &a->v}}) {
    const auto& kj = head.at("kinds").at(kname);
    kt->width = kj.at("width").get<int64_t>();
    kt->code_bits_per_token = kj.at("code_bits_per_token").get<int64_t>();
    kt->components_used = kj.at("components_used").get<int64_t>();
    kt->expected_mse = kj.at("expected_mse").get<double>();
    kt->total_variance = kj.at("total_variance").get<double>();
    kt->energy_top_used = kj.at("energy_top_used").get<double>();
    size_t g = 0;
    for (const auto& gj : kj.at("groups")) {
      Group G;
      G.offset = gj.at("offset").get<int64_t>();
      G.dim = gj.at("dim").get<int64_t>();
      G.rank = gj.at("rank").get<int64_t>();
      const int64_t used = gj.at("used").get<int64_t>();
      const std::string p = std::string(kname) + "." + std::to_string(g++) + ".";
      G.mean = tensor(p + "mean", at::kFloat);
      if (used > 0) {
        G.basis = tensor(p + "basis", at::kFloat);
        at::Tensor bits = tensor(p + "bits", at::kInt);
        at::Tensor step = tensor(p + "step", at::kFloat);
        G.bits.assign(bits.data_ptr<int32_t>(), bits.data_ptr<int32_t>() + used);
        G.step.assign(step.data_ptr<float>(), step.data_ptr<float>() + used);
      } else {
        G.basis = at::zeros({G.dim, 0}, at::kFloat);
      }
      kt->groups.push_back(std::move(G));
    }
  }
  return a;
}

namespace {
int64_t transform_bytes(const KindTransform& t) {
  int64_t b = 0;
  for (const Group& g : t.groups) b += 4 * (g.dim + g.basis.numel() + 2 * g.basis.size(1));
  return b;
}
}  // namespace

std::shared_ptr<const Artifact> calibrate(const std::shared_ptr<Model>& model,
                                          const CalibOptions& c, const TransformOptions& t,
                                          const std::string& cache_dir) {
  const nlohmann::json meta = artifact_meta(*model, c, t);
  const std::string key = sha256_hex(meta.dump());
  static std::map<std::string, std::shared_ptr<const Artifact>> memo;
  static std::map<std::string, std::shared_ptr<const CalibData>> data_memo;
  std::lock_guard<std::mutex> lock(memo_mutex());
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  const std::string path = cache_dir.empty() ? "" : cache_dir + "/" + key + ".safetensors";
  if (!path.empty() && file_exists(path)) {
    auto a = load_artifact(path);
    KVB_CHECK(a->key == key, path, ": holds artifact ", a->key, ", expected ", key);
    a->file_bytes = static_cast<int64_t>(MappedFile(path).size());
    a->transform_bytes = transform_bytes(a->k) + transform_bytes(a->v);
    memo[key] = a;
    return a;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string data_key = sha256_hex(nlohmann::json{meta["model"], meta["calibration"]}.dump());
  std::shared_ptr<const CalibData> data;
  if (auto it = data_memo.find(data_key); it != data_memo.end()) {
    data = it->second;
  } else {
    data = std::make_shared<CalibData>(collect_kv(model, c));
    data_memo[data_key] = data;
  }
  const ModelConfig& mc = model->config;
  auto a = std::make_shared<Artifact>();
  a->meta = meta;
  a->key = key;
  a->k = build_transform(data->k_pre, mc.n_layers, mc.n_kv_heads, mc.head_dim, t);
  a->v = build_transform(data->v, mc.n_layers, mc.n_kv_heads, mc.head_dim, t);
  const KindTransform post =
      build_transform(data->k_post, mc.n_layers, mc.n_kv_heads, mc.head_dim, t);
  a->k_post_rope_rel_mse = post.total_variance > 0 ? post.expected_mse / post.total_variance : 0;
  a->k_post_rope_energy_top_used = post.energy_top_used;
  a->meta["calibration"]["sequences"] = data->sequences;
  a->meta["calibration"]["samples"] = data->k_pre.size(0);
  a->transform_bytes = transform_bytes(a->k) + transform_bytes(a->v);
  a->seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!path.empty()) {
    a->path = path;
    save_artifact(*a, path);
    a->file_bytes = static_cast<int64_t>(MappedFile(path).size());
  }
  memo[key] = a;
  return a;
}

}  // namespace kvb::kvtc
