// `kvbench packet-train`: KV Packet's header/trailer training (methods/kv_packet/packet_train.h) --
// distils a frozen model's answers over whole contexts into soft tokens that let separately cached
// documents be spliced without recomputation, and writes the adapter that method kv_packet's
// `adapter` parameter loads. Prints a summary (JSON) on stdout; progress on stderr.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/model/model.h"
#include "harness/tool/model_options.h"
#include "harness/tool/tool_registry.h"
#include "methods/common/tool_output.h"
#include "methods/kv_packet/packet_adapter.h"
#include "methods/kv_packet/packet_train.h"

namespace kvb::kv_packet {
namespace {

using tool::add_model_options;
using tool::load_model_from_args;
using tool::ModelArgs;

std::vector<std::string> comma_list(const std::string& s) {
  std::vector<std::string> out;
  for (size_t start = 0; start <= s.size();) {
    const size_t comma = std::min(s.find(',', start), s.size());
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

void setup_packet_train(CLI::App* sub) {
  struct Args {
    ModelArgs model;
    kv_packet::TrainOptions o;
    std::string tasks = "passkey,niah_single_1,niah_single_2";
    std::string doc_tokens = "64,128,256";
    std::string eval;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  add_model_options(sub, &a->model);
  sub->add_option("--out,-o", a->o.out, "adapter path (.safetensors); required unless --eval");
  sub->add_option("--eval", a->eval,
                  "evaluate instead of training: none | bos | an adapter file -- the KL to the "
                  "full-context teacher per answer token on the samples (use another --seed than "
                  "the training one)");
  sub->add_option("--tasks", a->tasks, "comma-separated synthetic tasks of the training samples")
      ->capture_default_str();
  sub->add_option("--length", a->o.length, "prompt tokens per training sample")
      ->capture_default_str();
  sub->add_option("--doc-tokens", a->doc_tokens,
                  "comma-separated tokens per document; sample i is cut at the i-th, cyclically "
                  "(the qa protocol cuts contexts the same way)")
      ->capture_default_str();
  sub->add_option("--samples", a->o.samples, "training samples per task")->capture_default_str();
  sub->add_option("--steps", a->o.steps, "optimizer steps")->capture_default_str();
  sub->add_option("--batch", a->o.batch, "samples per step")->capture_default_str();
  sub->add_option("--header-rows", a->o.header_rows, "soft header rows")->capture_default_str();
  sub->add_option("--trailer-rows", a->o.trailer_rows, "soft trailer rows")->capture_default_str();
  sub->add_option("--lr", a->o.lr, "Adam learning rate (decays linearly to 0)")
      ->capture_default_str();
  sub->add_option("--seed", a->o.seed,
                  "data and initialisation seed (keep it apart from the evaluation seed)")
      ->capture_default_str();
  sub->add_option("--data-dir", a->o.data_dir,
                  "data directory (else $KVBENCH_DATA, ./data, ../shared/data)");
  sub->add_option("--cache-dir", a->o.cache_dir,
                  "where generated task sets are cached (\"\": none)");
  sub->add_option("--log-every", a->o.log_every, "progress every N steps")->capture_default_str();
  add_quiet_flag(sub, &a->quiet);
  sub->callback([a] {
    a->o.log = tool_progress("packet-train", a->quiet);
    a->o.tasks = comma_list(a->tasks);
    a->o.doc_tokens.clear();
    for (const auto& d : comma_list(a->doc_tokens)) {
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      KVB_CHECK(end && *end == '\0' && v >= 0, "packet-train --doc-tokens: '", d,
                "' is not a token count");
      a->o.doc_tokens.push_back(v);
    }
    auto model = load_model_from_args(a->model);
    if (!a->eval.empty()) {
      at::Tensor header = at::zeros({0, model->config.dim}), trailer = header;
      if (a->eval == "bos") {
        header = model->weights.embedding.narrow(0, model->config.bos_id, 1).to(at::kFloat).clone();
      } else if (a->eval != "none") {
        const auto ad = kv_packet::Adapter::load(a->eval, model->config);
        header = ad.header;
        trailer = ad.trailer;
      }
      const kv_packet::EvalResult r = kv_packet::evaluate_wrap(model, a->o, header, trailer);
      print_tool_summary({{"eval", a->eval},
                          {"samples", r.samples},
                          {"kl", r.kl},
                          {"argmax_agreement", r.argmax_agreement},
                          {"teacher_answers_correct", r.teacher_answers_correct},
                          {"doc_tokens", a->o.doc_tokens},
                          {"seed", a->o.seed}});
      return;
    }
    KVB_CHECK(!a->o.out.empty(), "packet-train: --out is required (or --eval to evaluate)");
    const kv_packet::TrainResult r = kv_packet::train_adapter(model, a->o);
    print_trained_adapter(a->o.out, r.steps,
                          {{"samples", r.samples},
                           {"kl_first", r.kl_first},
                           {"kl_last", r.kl_last},
                           {"teacher_answers_correct", r.teacher_answers_correct},
                           {"doc_tokens", a->o.doc_tokens}});
  });
}

}  // namespace

// Registered from this folder, so that harness/cli (the layer above the methods) names no method.
KVB_REGISTER_TOOL(
    "packet-train",
    "KV Packet: train the soft header and trailer that wrap separately cached documents "
    "(distillation from the full-context model); writes the adapter for method kv_packet",
    setup_packet_train);

}  // namespace kvb::kv_packet
