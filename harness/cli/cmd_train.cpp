#include <iostream>

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "harness/engine/thread_policy.h"
#include "harness/cli/cli_common.h"
#include "harness/common/error.h"
#include "harness/common/limits.h"
#include "harness/train/trainer.h"

namespace kvb::cli {

void register_train(CLI::App& app) {
  struct Args {
    TrainOptions opts;
    int threads = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "train", "train a Llama-architecture model from a recipe (configs/models/*.json); resumes from "
               "the latest checkpoint; exports a Hugging Face directory to OUT/model when done");
  sub->add_option("--config,-c", args->opts.config_path, "training recipe (JSON)")->required();
  sub->add_option("--out,-o", args->opts.out_dir, "output directory (default runs/train/<name>)");
  sub->add_option("--data-dir", args->opts.data_dir, "where corpora live (default: $KVBENCH_DATA, ./data, ../shared/data)");
  sub->add_option("--set", args->opts.overrides, "override a recipe value: key.path=value (repeatable)");
  sub->add_flag("--fresh", args->opts.fresh, "discard existing checkpoints and start over");
  sub->add_option("--max-seconds", args->opts.max_seconds,
                  "stop (checkpointed) at the first step past this many seconds; resume or --export-only later")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--stop-after", args->opts.stop_after,
                  "stop (with a checkpoint) after this many steps; run again to resume");
  sub->add_flag("--export-only", args->opts.export_only, "export the latest checkpoint and stop");
  sub->add_option("--show-rows", args->opts.show_rows, "print N decoded training rows and stop");
  sub->add_option("--show-step", args->opts.show_step, "the step whose rows --show-rows prints");
  sub->add_option("--threads", args->threads, "CPU threads (0: LibTorch's default)");
  sub->add_flag("--quiet,-q", args->opts.quiet, "no progress lines");
  sub->callback([args] {
    check_thread_count(args->threads, "--threads");
    apply_thread_policy(args->threads);
    TrainSummary s = run_training(args->opts);
    nlohmann::json j = {{"steps_done", s.steps_done}, {"total_steps", s.total_steps},
                        {"last_loss", s.last_loss}, {"heldout_loss", s.heldout_loss},
                        {"model_dir", s.model_dir}};
    std::cout << j.dump() << "\n";
  });
}

}  // namespace kvb::cli
