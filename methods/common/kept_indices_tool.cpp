// `kvbench kept-indices`: what an eviction method keeps at the end of a context prefill, per layer
// and KV head, as token indices (EvictingKvCache::kept_indices), so that another implementation of
// the same method (scripts/peer-kvpress.sh: NVIDIA kvpress) can be compared with kvbench token for
// token rather than only through its answers. With --channels it also lists, per head, the key
// channels that read back as zero in every kept key (channel-pruning methods: ThinK's zero fill).
//
//   kvbench kept-indices --model M --method '{"name":"snapkv","params":{...}}' --ids ids.json
//       --out kept.json
//
// ids.json: {"prompts": [[id, ...], ...]} (or the bare list), each prompt prefilled as given (no
// BOS added) into a fresh sequence, end_prefill called, then dumped. A method that runs its own
// pass over the context before compressing it (ContextPassCache: KVzip) is given it as the qa
// protocol gives it on a model without a chat template: the first --context-prefix tokens (the BOS)
// are not text, a user turn closes with "\n", the model's tokenizer encodes the method's prompts.
// Output: {"model", "method":
// {"name", "params" (resolved)}, "prompts": [{"n_tokens", "kept": [layer][head][token index
// ascending], "zero_key_channels": [layer][head][channel] (with --channels)}]}. A method whose
// store is not the eviction store is refused: its "kept set" would mean something else.

#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/context_pass.h"
#include "harness/kv/method_registry.h"
#include "harness/tool/model_options.h"
#include "harness/tool/tool_registry.h"
#include "methods/common/evicting_kv_cache.h"

namespace kvb {
namespace {

using tool::add_model_options;
using tool::load_model_from_args;
using tool::ModelArgs;

// "name" or {"name": ..., "params": {...}} (as a run config's method), params resolved against the
// method's schema (unknown keys and bad values are refused there).
std::pair<std::string, nlohmann::json> parse_method(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    j = text;  // a bare method name
  }
  std::string name;
  nlohmann::json params = nlohmann::json::object();
  if (j.is_string()) {
    name = j.get<std::string>();
  } else {
    KVB_CHECK(j.is_object() && j.contains("name") && j["name"].is_string(),
              "--method: expected a name or {\"name\": ..., \"params\": {...}}");
    for (const auto& [k, v] : j.items())
      KVB_CHECK(k == "name" || k == "params", "--method: unknown key \"", k, "\"");
    name = j["name"].get<std::string>();
    if (j.contains("params")) params = j["params"];
  }
  return {name, MethodRegistry::instance().resolve(name, params)};
}

std::vector<std::vector<int64_t>> read_prompts(const std::string& path, int64_t vocab) {
  std::ifstream in(path);
  KVB_CHECK(in.good(), "--ids: cannot read ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    KVB_CHECK(false, "--ids: ", path, " is not JSON: ", e.what());
  }
  if (j.is_object() && j.contains("prompts")) j = j["prompts"];
  KVB_CHECK(j.is_array() && !j.empty(), "--ids: expected a non-empty list of prompts");
  std::vector<std::vector<int64_t>> out;
  for (const auto& p : j) {
    KVB_CHECK(p.is_array() && !p.empty(), "--ids: prompt ", out.size(),
              " is not a non-empty list of ids");
    std::vector<int64_t> ids;
    for (const auto& t : p) {
      KVB_CHECK(t.is_number_integer(), "--ids: prompt ", out.size(), " holds a non-integer");
      const int64_t id = t.get<int64_t>();
      KVB_CHECK(id >= 0 && id < vocab, "--ids: id ", id, " is outside the vocabulary [0, ", vocab,
                ")");
      ids.push_back(id);
    }
    out.push_back(std::move(ids));
  }
  return out;
}

// Channels whose kept keys are all zero (a pruned channel under zero fill); none when a head keeps
// no entry.
std::vector<int64_t> zero_channels(const at::Tensor& keys) {  // [len, head_dim]
  std::vector<int64_t> out;
  if (keys.size(0) == 0) return out;
  const at::Tensor zero = (keys.to(at::kFloat) == 0).all(0);  // [head_dim] bool
  for (int64_t c = 0; c < zero.size(0); ++c)
    if (zero[c].item<bool>()) out.push_back(c);
  return out;
}

void setup_kept_indices(CLI::App* sub) {
  struct Args {
    ModelArgs model;
    std::string method, ids, out;
    int64_t prefill_chunk = EngineOptions{}.prefill_chunk;
    int64_t context_prefix = 1;
    bool channels = false;
  };
  auto a = std::make_shared<Args>();
  add_model_options(sub, &a->model);
  sub->add_option("--method", a->method,
                  "an eviction method: a name or {\"name\": ..., \"params\": {...}} (JSON)")
      ->required();
  sub->add_option("--ids", a->ids, "prompts as token ids: {\"prompts\": [[id, ...], ...]} (JSON)")
      ->required();
  sub->add_option("--out,-o", a->out, "where to write the kept indices (JSON)")->required();
  sub->add_option("--prefill-chunk", a->prefill_chunk, "tokens per prefill step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--context-prefix", a->context_prefix,
                  "for a method with a context pass (KVzip): the prompt's leading tokens that are "
                  "not text (the BOS)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--channels", a->channels,
                "also list each head's key channels that are zero in every kept key");
  sub->callback([a] {
    const auto [name, params] = parse_method(a->method);
    auto model = load_model_from_args(a->model);
    const auto prompts = read_prompts(a->ids, model->config.vocab_size);
    // With the model: a calibrating method (qfilters, kvzap) calibrates on it first.
    const CacheContext ctx{model->config, model->device, model->dtype, model};
    std::unique_ptr<KvCache> kv = MethodRegistry::instance().create(name, ctx, params);
    KVB_CHECK(dynamic_cast<EvictingKvCache*>(kv.get()) != nullptr, "--method: ", name, "'s store (",
              kv->name(),
              ") is not the eviction store (EvictingKvCache): it has no kept token indices");
    EngineOptions eo;
    eo.prefill_chunk = a->prefill_chunk;
    Engine engine(model, std::move(kv), eo);
    const auto& store = dynamic_cast<const EvictingKvCache&>(engine.kv());
    const int n_layers = static_cast<int>(model->config.n_layers);
    const int64_t n_kv = model->config.n_kv_heads;
    nlohmann::json out_prompts = nlohmann::json::array();
    std::unique_ptr<Tokenizer> tok;  // loaded for a context pass only
    for (const auto& ids : prompts) {
      const int64_t seq = engine.new_sequence();
      if (auto* pass_cache = dynamic_cast<ContextPassCache*>(&engine.kv())) {
        KVB_CHECK(a->context_prefix <= static_cast<int64_t>(ids.size()), "--context-prefix ",
                  a->context_prefix, " is longer than a ", ids.size(), "-token prompt");
        if (!tok) tok = tool::load_tokenizer(*model);
        engine.prefill({seq}, {ids}, nullptr, /*call_end_prefill=*/false);
        ContextPass pass;
        pass.engine = &engine;
        pass.seq = seq;
        pass.context = ids;
        pass.prefix_tokens = a->context_prefix;
        pass.turn_close = tok->encode("\n");
        pass.encode = [&](const std::string& text) { return tok->encode(text); };
        pass_cache->run_context_pass(pass);
        engine.kv().end_prefill(seq);
      } else {
        engine.prefill({seq}, {ids});  // calls end_prefill: the prefill-time eviction runs
      }
      nlohmann::json kept = nlohmann::json::array(), chans = nlohmann::json::array();
      for (int l = 0; l < n_layers; ++l) {
        nlohmann::json kl = nlohmann::json::array(), cl = nlohmann::json::array();
        for (int64_t h = 0; h < n_kv; ++h) {
          kl.push_back(store.kept_indices(seq, l, h));
          if (a->channels) cl.push_back(zero_channels(store.kept_keys(seq, l, h)));
        }
        kept.push_back(std::move(kl));
        chans.push_back(std::move(cl));
      }
      nlohmann::json p = {{"n_tokens", ids.size()}, {"kept", std::move(kept)}};
      if (a->channels) p["zero_key_channels"] = std::move(chans);
      out_prompts.push_back(std::move(p));
      engine.release(seq);
    }
    const nlohmann::json out = {{"model", a->model.model},
                                {"method", {{"name", name}, {"params", params}}},
                                {"prompts", std::move(out_prompts)}};
    std::ofstream f(a->out);
    KVB_CHECK(f.good(), "--out: cannot write ", a->out);
    f << out.dump() << "\n";
    KVB_CHECK(f.good(), "--out: writing ", a->out, " failed");
    std::cerr << "kept-indices: " << prompts.size() << " prompt(s), " << name << " -> " << a->out
              << "\n";
  });
}

}  // namespace
}  // namespace kvb

KVB_REGISTER_TOOL("kept-indices",
                  "the token indices an eviction method keeps per layer and KV head after a "
                  "prefill (JSON)",
                  kvb::setup_kept_indices);
