// The perf protocol on the families' real per-layer shapes (few-layer presets: two of Qwen3-8B's
// layers, one 5-sliding + 1-global period of Gemma-3-4B's). Slow: materializing their embeddings
// (150K-260K x 2.5-4K) takes seconds and gigabytes.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/model/synthetic_presets.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

TEST(FamilyPresets, PerfProtocolRunsOnQwen3AndGemma3Shapes) {
  const std::string dir = test::make_temp_dir("family_perf");
  ResultsDb db(dir + "/db.sqlite");
  for (const char* preset : {"qwen3-8b-2l", "gemma-3-4b-6l"}) {
    SCOPED_TRACE(preset);
    const nlohmann::json cfg = resolve_run_config({{"model", std::string("synthetic:") + preset},
                                                   {"dtype", "bf16"},
                                                   {"method", "full"},
                                                   {"protocol",
                                                    {{"name", "perf"},
                                                     {"context", 24},
                                                     {"decode_tokens", 2},
                                                     {"batch_sizes", "1"},
                                                     {"repeats", 1}}}});
    const RunOutcome o = execute_run(cfg, db, RunEnv{});
    EXPECT_EQ(o.samples_total, 1);
    EXPECT_GT(test::metric(o.metrics, "decode_tok_s"), 0.0);
    const ModelConfig c = synthetic_preset(preset);
    // The baseline is the full cache of 26 tokens (Gemma's window of 1,024 is not reached).
    EXPECT_EQ(test::metric(o.metrics, "baseline_bytes"),
              static_cast<double>(c.full_kv_bytes(26, 2)));
    EXPECT_NEAR(test::metric(o.metrics, "compression_ratio"), 1.0, 1e-9);
  }
}

}  // namespace
}  // namespace kvb
