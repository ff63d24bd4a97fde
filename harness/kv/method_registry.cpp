#include "harness/kv/method_registry.h"

#include "harness/kv/baseline_method.h"
#include "harness/kv/windowed_kv_cache.h"

#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/registry_name.h"
#include "harness/common/strings.h"

namespace kvb {

MethodRegistry& MethodRegistry::instance() {
  static MethodRegistry* r = new MethodRegistry();  // outlives every static destructor
  return *r;
}

void MethodRegistry::add(MethodInfo info, CacheFactory factory, Calibrator calibrator) {
  check_registry_name("method", info.name);
  auto it = methods_.find(info.name);
  KVB_CHECK(it == methods_.end(), "method '", info.name, "' is registered twice (",
            it == methods_.end() ? "" : it->second.info.origin, " and ", info.origin, ")");
  // Every default must satisfy its own schema: a broken schema fails at registration, not in a grid.
  resolve_params(info.params, nlohmann::json::object(), "method " + info.name);
  KVB_CHECK(!calibrator || info.caps.needs_calibration, "method '", info.name,
            "' has a calibrator but its caps do not say needs_calibration");
  const std::string name = info.name;
  methods_.emplace(name, Entry{std::move(info), std::move(factory), std::move(calibrator)});
}

const MethodInfo& MethodRegistry::info(const std::string& name) const {
  auto it = methods_.find(name);
  KVB_CHECK(it != methods_.end(), "unknown method '", name, "'", did_you_mean(name, names()),
            // A C string: the registry's own list, shown whole (error.h shortens std::string
            // parts, which it takes for quoted inputs).
            "; known: ", join(names(), ", ").c_str());
  return it->second.info;
}

std::vector<std::string> MethodRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& kv : methods_) out.push_back(kv.first);
  return out;
}

nlohmann::json MethodRegistry::resolve(const std::string& name, const nlohmann::json& params) const {
  return resolve_params(info(name).params, params, "method " + name);
}

bool MethodRegistry::calibrates(const std::string& name) const {
  info(name);  // unknown: the error with its hint
  return static_cast<bool>(methods_.at(name).calibrator);
}

std::shared_ptr<const CalibrationArtifact> MethodRegistry::calibrate(
    const std::string& name, const std::shared_ptr<Model>& model,
    const nlohmann::json& params) const {
  const nlohmann::json resolved = resolve(name, params);
  const Entry& e = methods_.at(name);
  if (!e.calibrator) return nullptr;
  KVB_CHECK(model != nullptr, "method ", name,
            " calibrates on the run's model, and none was given (CacheContext::model)");
  const std::string key = name + "|" + std::to_string(reinterpret_cast<uintptr_t>(model.get())) +
                          "|" + resolved.dump();
  // One lock over the whole computation: a second caller waits for the artifact instead of
  // computing it again.
  std::lock_guard<std::mutex> lock(memo_mutex_);
  auto it = memo_.find(key);
  if (it != memo_.end() && it->second.model.lock() == model) return it->second.artifact;
  std::shared_ptr<const CalibrationArtifact> a = e.calibrator(model, resolved);
  KVB_ASSERT(a != nullptr && !a->key.empty(), "method " + name, "its calibrator returned no artifact");
  for (auto m = memo_.begin(); m != memo_.end();)  // forget artifacts of models freed since
    m = m->second.model.expired() ? memo_.erase(m) : std::next(m);
  memo_[key] = Memo{model, a};
  return a;
}

namespace {
// The config's spelling of a compute dtype (run configs say fp32 / bf16 / fp16).
std::string config_dtype_name(c10::ScalarType t) {
  if (t == c10::kFloat) return "fp32";
  if (t == c10::kBFloat16) return "bf16";
  if (t == c10::kHalf) return "fp16";
  return c10::toString(t);
}
}  // namespace

std::string MethodRegistry::target_refusal(const std::string& name, const nlohmann::json& params,
                                          const RunTarget& target) const {
  const MethodInfo& mi = info(name);
  if (mi.caps.cpu_only && !target.device.is_cpu())
    return "method " + name + " runs on the CPU only (device " + target.device.str() + " requested)";
  if (mi.caps.fp32_only && target.dtype != c10::kFloat)
    return "method " + name + " runs in fp32 only (dtype " + config_dtype_name(target.dtype) +
           " requested)";
  if (!mi.target_check) return "";
  const std::string why = mi.target_check(params, target);
  return why.empty() ? why : "method " + name + ": " + why;
}

std::unique_ptr<KvCache> MethodRegistry::create(const std::string& name, const CacheContext& ctx_in,
                                                const nlohmann::json& params) const {
  const nlohmann::json resolved = resolve(name, params);
  const Entry& e = methods_.at(name);
  const std::string refusal = target_refusal(name, resolved, RunTarget{ctx_in.device, ctx_in.dtype});
  KVB_CHECK(refusal.empty(), refusal);
  CacheContext ctx = ctx_in;
  if (e.calibrator && !ctx.calibration) ctx.calibration = calibrate(name, ctx.model, resolved);
  // A model with sliding-window layers: the method's store serves the global layers, the window
  // layers keep their window (windowed_kv_cache.h). On a model that is all windows the exact
  // stores keep the windows; any other method's store takes every layer and runs within the window.
  const bool exact = name == baseline_method() || name == "paged" || name == "static";
  return make_window_aware(
      ctx, [&](const CacheContext& c) { return e.factory(c, resolved); }, !exact,
      "method " + name);
}

detail::MethodRegistration::MethodRegistration(MethodInfo (*info)(), CacheFactory factory,
                                               Calibrator calibrator) {
  MethodRegistry::instance().add(info(), std::move(factory), std::move(calibrator));
}

nlohmann::json method_info_json(const MethodInfo& info) {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : info.params) params.push_back(param_spec_json(p));
  const auto& c = info.caps;
  return {{"name", info.name},
          {"summary", info.summary},
          {"paper", info.paper},
          {"origin", info.origin},
          {"params", params},
          {"caps",
           {{"evicts", c.evicts},
            {"quantizes", c.quantizes},
            {"tiers", c.tiers},
            {"needs_calibration", c.needs_calibration},
            {"query_aware", c.query_aware},
            {"needs_question", c.needs_question},
            {"needs_context_pass", c.needs_context_pass},
            {"needs_hindsight", c.needs_hindsight},
            {"simulated", c.simulated},
            {"oracle", c.oracle},
            {"supports_fork", c.supports_fork},
            {"cpu_only", c.cpu_only},
            {"fp32_only", c.fp32_only}}}};
}

}  // namespace kvb
