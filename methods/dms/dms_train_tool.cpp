// `kvbench dms-train`: DMS's adapter retrofit (methods/dms/dms_train.h) — trains the per-layer
// eviction-decision adapters of a frozen model by distillation with a compression target, and
// writes the adapter file that method `dms`'s `adapter` parameter loads. Prints a summary (JSON) on
// stdout; progress on stderr.

#include <nlohmann/json.hpp>

#include "harness/tool/model_options.h"
#include "harness/tool/tool_registry.h"
#include "methods/common/tool_output.h"
#include "methods/dms/dms_train.h"

namespace kvb::dms {
namespace {

using tool::add_model_options;
using tool::load_model_from_args;
using tool::ModelArgs;

void setup_dms_train(CLI::App* sub) {
  struct Args {
    ModelArgs model;
    dms::TrainOptions o;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  add_model_options(sub, &a->model);
  sub->add_option("--recipe", a->o.recipe,
                  "a `kvbench train` recipe whose data mix gives the training rows")
      ->required();
  sub->add_option("--data-dir", a->o.data_dir,
                  "data directory (else $KVBENCH_DATA, ./data, ../shared/data)");
  sub->add_option("--out,-o", a->o.out, "adapter path (.safetensors)")->required();
  sub->add_option("--steps", a->o.steps, "optimizer steps")->capture_default_str();
  sub->add_option("--batch", a->o.batch, "rows per step")->capture_default_str();
  sub->add_option("--seq-len", a->o.seq_len, "tokens per row")->capture_default_str();
  sub->add_option("--window", a->o.window, "delayed-eviction window w")->capture_default_str();
  sub->add_option("--target-cr", a->o.target_cr, "final compression ratio target")
      ->capture_default_str();
  sub->add_option("--ramp", a->o.ramp_fraction, "share of the steps over which CR rises from 1")
      ->capture_default_str();
  sub->add_option("--lr", a->o.lr, "Adam learning rate")->capture_default_str();
  sub->add_option("--tau", a->o.tau, "Gumbel-sigmoid temperature")->capture_default_str();
  sub->add_option("--compression-weight", a->o.compression_weight,
                  "weight of the one-sided compression hinge")
      ->capture_default_str();
  sub->add_option("--seed", a->o.seed, "noise seed")->capture_default_str();
  sub->add_option("--log-every", a->o.log_every, "progress every N steps")->capture_default_str();
  add_quiet_flag(sub, &a->quiet);
  sub->callback([a] {
    a->o.log = tool_progress("dms-train", a->quiet);
    const dms::TrainResult r = dms::train_adapter(load_model_from_args(a->model), a->o);
    print_trained_adapter(a->o.out, r.steps,
                          {{"kl", r.kl},
                           {"evicted_fraction", r.realized_frac},
                           {"target_fraction", r.target_frac},
                           {"window", a->o.window}});
  });
}

}  // namespace

// Registered from this folder, so that harness/cli (the layer above the methods) names no method.
KVB_REGISTER_TOOL(
    "dms-train",
    "DMS retrofit: train the eviction-decision adapters of a frozen model (distillation + "
    "compression target); writes the adapter for method dms",
    setup_dms_train);

}  // namespace kvb::dms
