#pragma once
// What the built-in protocols share: a run that keeps what it needs from its context (the model,
// the method and its resolved parameters, its capabilities, the resolved protocol parameters, the
// seed), and a protocol base that plans such runs.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/eval/protocol.h"
#include "harness/kv/method.h"

namespace kvb {

class ModelRun : public ProtocolRun {
 protected:
  explicit ModelRun(const RunContext& ctx)
      : model_(ctx.model),
        method_(ctx.method.name),
        method_params_(ctx.method_params),
        caps_(ctx.method.caps),
        proto_(ctx.protocol()),
        seed_(ctx.seed()) {}

  // Each stored sample's JSON through T::from_json (the protocol's sample type).
  template <typename T>
  static std::vector<T> parsed(const StoredSamples& stored) {
    std::vector<T> out;
    for (const auto& j : stored.outputs()) out.push_back(T::from_json(j));
    return out;
  }

  std::shared_ptr<Model> model_;
  std::string method_;
  nlohmann::json method_params_;
  MethodCaps caps_;
  nlohmann::json proto_;
  uint64_t seed_;
};

// A built-in protocol whose runs are Run(ctx): its name, summary and schema are given once, and
// the derived constructor fills in the rest of the info (tokenizer, report hints).
template <typename Run>
class PlannedProtocol : public Protocol {
 public:
  ProtocolInfo info() const override { return info_; }
  std::unique_ptr<ProtocolRun> plan(const RunContext& ctx) const override {
    return std::make_unique<Run>(ctx);
  }

 protected:
  PlannedProtocol(std::string name, std::string summary, std::vector<ParamSpec> params) {
    info_.name = std::move(name);
    info_.summary = std::move(summary);
    info_.params = std::move(params);
  }
  ProtocolInfo info_;
};

}  // namespace kvb
