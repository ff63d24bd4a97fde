#include "harness/eval/run_config.h"

#include <sys/stat.h>
#include <torch/cuda.h>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/limits.h"
#include "harness/common/mapped_file.h"
#include "harness/common/strings.h"
#include "harness/eval/protocol_registry.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "harness/store/config_hash.h"

namespace kvb {

nlohmann::json load_config_file(const std::string& path) {
  if (!file_exists(path)) {
    struct stat st {};
    KVB_CHECK(::stat(path.c_str(), &st) == 0, path, ": config file not found");
    check_regular_file(path);  // a FIFO or a device: named as such, never opened
  }
  return parse_json(read_text_file(path), path);
}

namespace {

void check_keys(const nlohmann::json& obj, const std::vector<std::string>& allowed,
                const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = std::find(allowed.begin(), allowed.end(), it.key()) != allowed.end();
    KVB_CHECK(ok, where, "unknown key '", it.key(), "'", did_you_mean(it.key(), allowed),
              "; allowed: ", join(allowed, ", "));
  }
}

}  // namespace

nlohmann::json resolve_run_config(const nlohmann::json& raw) {
  KVB_CHECK(raw.is_object(), "config: expected a JSON object at the top level");
  check_keys(raw, {"model", "device", "dtype", "threads", "seed", "method", "protocol", "label"},
             "config: ");
  static const std::vector<ParamSpec> top = {
      string_param("model", "stories260K", {}, "model spec"),
      string_param("device", "cpu", {}, "cpu | cuda | cuda:N"),
      string_param("dtype", "fp32", {"fp32", "bf16", "fp16"}, "compute dtype"),
      int_param("threads", 0, 0, static_cast<double>(kMaxThreads), "CPU threads (0: default)"),
      int_param("seed", 0, 0, 1e15, "seed for anything random"),
      string_param("label", "", {}, "free text, not hashed"),
  };
  nlohmann::json flat = nlohmann::json::object();
  for (const auto& p : top)
    if (raw.contains(p.name)) flat[p.name] = raw[p.name];
  nlohmann::json out = resolve_params(top, flat, "config");
  const std::string dev = out["device"];
  KVB_CHECK(dev == "cpu" || starts_with(dev, "cuda"), "config.device: '", dev,
            "' is not one of cpu, cuda, cuda:N");

  // method: "name" or {"name": ..., "params": {...}}
  KVB_CHECK(raw.contains("method"), "config: missing required key 'method'");
  nlohmann::json m = raw["method"];
  if (m.is_string()) m = {{"name", m}};
  KVB_CHECK(m.is_object(), "config.method: expected a name or {\"name\": ..., \"params\": {...}}");
  check_keys(m, {"name", "params"}, "config.method: ");
  KVB_CHECK(m.contains("name") && m["name"].is_string(), "config.method.name: expected a string");
  const std::string mname = m["name"];
  MethodRegistry::instance().info(mname);  // unknown -> error with hint
  out["method"] = {{"name", mname},
                   {"params", MethodRegistry::instance().resolve(mname, m.value("params", nlohmann::json::object()))}};

  // protocol: {"name": ..., <params>}
  KVB_CHECK(raw.contains("protocol"), "config: missing required key 'protocol'");
  nlohmann::json p = raw["protocol"];
  if (p.is_string()) p = {{"name", p}};
  KVB_CHECK(p.is_object() && p.contains("name") && p["name"].is_string(),
            "config.protocol: expected {\"name\": ..., <parameters>}");
  const ProtocolInfo& spec = ProtocolRegistry::instance().info(p["name"]);
  nlohmann::json pp = p;
  pp.erase("name");
  nlohmann::json resolved = ProtocolRegistry::instance().get(spec.name).finish_config(
      pp, resolve_params(spec.params, pp, "config.protocol"));
  resolved["name"] = spec.name;
  out["protocol"] = resolved;
  const MethodInfo& minfo = MethodRegistry::instance().info(mname);
  const std::string dt = out["dtype"];
  RunTarget target;
  try {
    target.device = c10::Device(dev);
  } catch (const std::exception&) {
    KVB_CHECK(false, "config.device: '", dev, "' is not one of cpu, cuda, cuda:N");
  }
  target.dtype = dt == "bf16" ? c10::kBFloat16 : dt == "fp16" ? c10::kHalf : c10::kFloat;
  const std::string refusal =
      MethodRegistry::instance().target_refusal(mname, out["method"]["params"], target);
  KVB_CHECK(refusal.empty(), "config: ", refusal);
  KVB_CHECK(!minfo.caps.needs_question ||
                ProtocolRegistry::instance().get(spec.name).prompt_holds_question(resolved),
            "config: method ", mname, " scores the context by its question, which protocol ",
            spec.name, " does not put in the prompt (use qa with mode=query_aware)");
  KVB_CHECK(!minfo.caps.needs_context_pass ||
                ProtocolRegistry::instance().get(spec.name).runs_context_pass(resolved),
            "config: method ", mname, " runs its own pass over the context before the question, "
            "which protocol ", spec.name, " does not run (use qa with mode=query_agnostic)");
  KVB_CHECK(!minfo.caps.needs_hindsight ||
                ProtocolRegistry::instance().get(spec.name).hands_hindsight(resolved),
            "config: method ", mname,
            " compresses with hindsight of the continuation, which protocol ", spec.name,
            " does not hand over (use stream, or qa with mode=query_agnostic)");
  return out;
}

void RunConfigChecker::once(const std::string& what, const std::function<void()>& fn) {
  auto it = checked_.find(what);
  if (it == checked_.end()) {
    std::string err;
    try {
      fn();
    } catch (const Error& e) {
      err = e.what();
    }
    it = checked_.emplace(what, err).first;
  }
  if (!it->second.empty()) throw Error(it->second);
}

void RunConfigChecker::check(const nlohmann::json& resolved) {
  const std::string model = resolved.at("model");
  const bool synthetic = model.rfind("synthetic:", 0) == 0;
  const nlohmann::json& proto = resolved.at("protocol");
  const Protocol& protocol = ProtocolRegistry::instance().get(proto.at("name"));
  const InputCheck input = [&](const std::string& what, const std::function<void()>& fn) {
    once(what, fn);
  };
  if (options_.check_inputs && !synthetic)
    once("model:" + model, [&] { resolve_model_path(model, options_.models_dir); });
  if (!options_.check_inputs && !synthetic) return;
  // The model as its files declare it (no weights), for the settings and stores that depend on it.
  once("model config:" + model, [&] {
    if (configs_.count(model)) return;
    ModelFacts f;
    f.spec = model;
    ModelConfig c = read_model_config(model, options_.models_dir);
    f.context_tokens = c.max_seq_len;
    f.add_bos = c.add_bos;
    try {
      f.tokenizer_path = resolve_tokenizer_path(model, options_.models_dir);
    } catch (const Error&) {
      // None: the protocols that need one say so (and a run's plan would).
    }
    facts_[model] = f;
    configs_[model] = std::move(c);
  });
  // The settings against the model first (a length past its context is the config's error,
  // whatever the data holds), then the data files.
  if (options_.check_inputs) {
    protocol.check_model_inputs(resolved, facts_.at(model), options_.data_dir, input);
    protocol.check_inputs(proto, options_.data_dir, input);
  }
  const nlohmann::json& method = resolved.at("method");
  const std::string name = method.at("name");
  const std::string device = resolved.at("device"), dtype = resolved.at("dtype");
  if (MethodRegistry::instance().calibrates(name)) return;
  // A GPU cell planned on a machine without one: its store cannot be built here (the run builds it
  // before its row); its target was checked at resolution.
  if (device != "cpu" && !torch::cuda::is_available()) return;
  const c10::Device dev = parse_device(device);
  once("store:" + name + method.at("params").dump() + "|" + model + "|" + device + "|" + dtype,
       [&] {
         const CacheContext ctx{configs_.at(model), dev, parse_dtype(dtype)};
         MethodRegistry::instance().create(name, ctx, method.at("params"));
       });
}

std::string run_dataset_label(const nlohmann::json& resolved) {
  const nlohmann::json& proto = resolved.at("protocol");
  return ProtocolRegistry::instance().get(proto.at("name")).dataset_label(proto);
}

std::string run_config_hash(const nlohmann::json& resolved) {
  nlohmann::json h = resolved;
  h.erase("label");
  return config_hash(h);
}

}  // namespace kvb
