// The small shared parts of methods/common that several methods build on: enum name tables, the
// adapter file format, the adapter training loop and its metadata, the tools' progress lines and
// summaries, the dense probe view and the row-attention logits.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/enum_names.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/sha256.h"
#include "methods/common/adapter_file.h"
#include "methods/common/adapter_training.h"
#include "methods/common/calibration_text.h"
#include "methods/common/eviction_select.h"
#include "methods/common/head_snapshots.h"
#include "methods/common/kv_codec.h"
#include "methods/common/row_attention.h"
#include "methods/common/tensor_artifact.h"
#include "methods/common/tool_output.h"
#include "tests/methods/calibrated_test_util.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::error_of;

enum class Colour { kRed, kGreen, kBlue };
const EnumName<Colour> kColours[] = {
    {Colour::kRed, "red"}, {Colour::kGreen, "green"}, {Colour::kBlue, "blue"}};

TEST(EnumNames, NamesAndParsesEveryValueOfTheTable) {
  for (const auto& n : kColours) {
    EXPECT_STREQ(enum_name(kColours, n.value), n.name);
    EXPECT_EQ(parse_enum(kColours, n.name, "colour"), n.value);
  }
  // The tables the methods use read both ways too.
  for (RowDtype d : {RowDtype::kF32, RowDtype::kF16, RowDtype::kBF16})
    EXPECT_EQ(parse_row_dtype(row_dtype_name(d)), d);
  for (Pooling p : {Pooling::kNone, Pooling::kAvg, Pooling::kMax})
    EXPECT_STRNE(pooling_name(p), "?");
  EXPECT_STREQ(gqa_agg_name(GqaAgg::kMax), "max");
  EXPECT_STREQ(gqa_agg_name(GqaAgg::kMean), "mean");
}

TEST(EnumNames, UnknownNameErrorNamesTheValueAndListsTheChoices) {
  const std::string e = error_of([] { parse_enum(kColours, "mauve", "colour"); });
  EXPECT_NE(e.find("unknown colour 'mauve'"), std::string::npos) << e;
  EXPECT_NE(e.find("(allowed: red, green, blue)"), std::string::npos) << e;
  const std::string d = error_of([] { parse_row_dtype("fp8"); });
  EXPECT_NE(d.find("storage dtype 'fp8'"), std::string::npos) << d;
}

TEST(CalibrationArtifact, KeyIsTheArtifactTheModelTheTextAndTheMethodsSettings) {
  const std::shared_ptr<Model> model = test::testbed();
  CalibrationText text;
  text.data_dir = test::data_dir();
  text.samples = 1;
  text.tokens = 16;
  int computed = 0;
  auto make = [&](const nlohmann::json& settings) {
    return cached_calibration_artifact("toy", "toy.stat/1", *model, text, settings, [&] {
      ++computed;
      return std::map<std::string, at::Tensor>{{"stat", at::ones({2})}};
    });
  };
  const auto a = make({{"alpha", 1.0}});
  const nlohmann::json inputs = {{"artifact", "toy.stat/1"},
                                 {"model", model_content_hash(*model)},
                                 {"tokenizer", model->tokenizer_hash()},
                                 {"text", calibration_text_json(text)},
                                 {"alpha", 1.0}};
  EXPECT_EQ(a->meta, inputs);
  EXPECT_EQ(a->key, sha256_hex(inputs.dump()));
  EXPECT_TRUE(at::equal(a->get("stat"), at::ones({2})));
  // A setting that decides the statistic is part of the key; no settings at all is a key too.
  EXPECT_NE(make({{"alpha", 2.0}})->key, a->key);
  EXPECT_EQ(make(nlohmann::json::object())->meta.size(), 4u);
  EXPECT_EQ(computed, 3);  // cache_dir "": nothing is saved, each call computes
}

TEST(AdapterFile, RoundTripsTensorsAndMetadataAndRefusesAnotherKind) {
  const std::string path = test::make_temp_dir("adapter_file") + "/a.safetensors";
  const at::Tensor x = at::arange(6, at::kFloat).view({2, 3});
  const at::Tensor y = at::full({4}, 0.5, at::kDouble);  // written as fp32
  write_adapter(path, "toy-adapter", {{"x", x}, {"y", y}}, {{"note", "n1"}});

  const SafetensorsFile f = open_adapter(path, "toy-adapter", "toy");
  EXPECT_TRUE(at::equal(adapter_tensor(f, "x"), x));
  EXPECT_TRUE(at::equal(adapter_tensor(f, "y"), y.to(at::kFloat)));
  EXPECT_EQ(f.metadata().at("note"), "n1");
  EXPECT_EQ(f.metadata().at("kind"), "toy-adapter");

  const std::string e = error_of([&] { open_adapter(path, "other-adapter", "Other"); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("not a Other adapter (metadata 'kind' is not 'other-adapter')"),
            std::string::npos)
      << e;
  EXPECT_NE(error_of([&] { adapter_tensor(f, "z"); }), "");
}

TEST(AdapterTraining, AveragesEachIntervalLogsItAndTrainsTheTensors) {
  at::Tensor w = at::zeros({1});
  std::vector<at::Tensor*> params = {&w};
  std::vector<std::string> lines;
  std::vector<std::vector<double>> means_seen;
  AdapterTraining t;
  t.steps = 5;
  t.log_every = 2;
  t.log = [&](const std::string& s) { lines.push_back(s); };
  bool grad_during = true;
  auto step = [&](int64_t i, AdapterAdam& adam) -> std::vector<double> {
    grad_during = grad_during && w.requires_grad();
    at::Tensor loss = (w - 3.0).pow(2).sum();  // pulls w towards 3
    loss.backward();
    adam.step(0.5, i);
    return {static_cast<double>(i), 2.0};
  };
  auto interval = [&](const std::vector<double>& means, std::ostream& line) {
    means_seen.push_back(means);
    line << "mean step " << means[0];
  };
  train_adapter_tensors(params, t, step, interval);

  EXPECT_TRUE(grad_during);
  EXPECT_FALSE(w.requires_grad());
  EXPECT_GT(w.item<float>(), 1.0f);  // five Adam steps of 0.5 towards 3
  // Intervals end at steps 2, 4 and the last (5): means of the step indices 0-1, 2-3, 4.
  ASSERT_EQ(means_seen.size(), 3u);
  EXPECT_DOUBLE_EQ(means_seen[0][0], 0.5);
  EXPECT_DOUBLE_EQ(means_seen[1][0], 2.5);
  EXPECT_DOUBLE_EQ(means_seen[2][0], 4.0);
  for (const auto& m : means_seen) EXPECT_DOUBLE_EQ(m[1], 2.0);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("step 2/5: mean step 0.5, ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[2].rfind("step 5/5: mean step 4, ", 0), 0u) << lines[2];
}

TEST(AdapterTraining, MetadataRecordsTheModelAndTheStepsBesideTheMethodsEntries) {
  const auto meta = trained_adapter_metadata("stories260K", 40, {{"recipe", "r.json"}});
  EXPECT_EQ(meta, (std::map<std::string, std::string>{
                      {"model", "stories260K"}, {"recipe", "r.json"}, {"trained_steps", "40"}}));
  // A method entry that would overwrite the provenance is a bug of the trainer.
  EXPECT_THROW(trained_adapter_metadata("m", 1, {{"model", "other"}}), InternalError);
  EXPECT_THROW(trained_adapter_metadata("m", 1, {{"trained_steps", "2"}}), InternalError);
}

TEST(ToolOutput, ProgressLinesNameTheToolAndQuietSilencesThem) {
  EXPECT_FALSE(tool_progress("my-tool", /*quiet=*/true));
  const ProgressLog log = tool_progress("my-tool", /*quiet=*/false);
  ASSERT_TRUE(log);
  testing::internal::CaptureStderr();
  log("step 1/2: KL 0.5");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "my-tool: step 1/2: KL 0.5\n");
}

TEST(ToolOutput, TrainedAdapterSummaryLeadsWithTheAdapterAndItsSteps) {
  testing::internal::CaptureStdout();
  print_trained_adapter("a.safetensors", 4, {{"kl", 0.25}, {"window", 16}});
  // Keys sorted (nlohmann::json objects), indented by 2, one trailing newline: what scripts parse.
  EXPECT_EQ(testing::internal::GetCapturedStdout(),
            "{\n  \"adapter\": \"a.safetensors\",\n  \"kl\": 0.25,\n  \"steps\": 4,\n"
            "  \"window\": 16\n}\n");
  testing::internal::CaptureStdout();
  EXPECT_THROW(print_trained_adapter("a", 1, {{"steps", 2}}), InternalError);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");  // nothing printed for a broken summary
}

TEST(HeadSnapshots, OneSnapshotPerKvHeadWithTokenIndices) {
  const at::Tensor k = at::randn({5, 2, 4}), v = at::randn({5, 2, 4});  // [n, Hkv, D]
  const auto snaps = dense_head_snapshots(k, v);
  ASSERT_EQ(snaps.size(), 2u);
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_TRUE(at::equal(snaps[h].k, k.select(1, h)));
    EXPECT_TRUE(at::equal(snaps[h].v, v.select(1, h)));
    EXPECT_TRUE(at::equal(snaps[h].index, at::arange(5, at::kLong)));
  }
}

TEST(RowAttention, BiasedEntriesMatchSoftmaxOfBiasedLogits) {
  const int64_t D = 3, m = 4;
  const std::vector<float> q = {0.5f, -1.f, 2.f};
  const std::vector<float> keys = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<float> vals = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<float> bias = {0.f, 3.f};  // biases the first two entries only
  auto key = [&](int64_t j) { return keys.data() + j * D; };
  auto value = [&](int64_t j) { return vals.data() + j * D; };
  std::vector<float> logit(m);
  const float mx = key_logits_f32(q.data(), D, 0.5f, m, key, logit.data());
  EXPECT_FLOAT_EQ(logit[2], 1.0f);  // 2 * 0.5
  EXPECT_FLOAT_EQ(mx, 1.0f);        // logits 0.25, -0.5, 1.0, 0.75

  std::vector<float> p(m), o(D);
  const float inv =
      attend_entries_f32(q.data(), D, 0.5f, m, key, value, bias.data(), 2, p.data(), o.data());
  // Expected: softmax over logits + bias (0.25, 2.5, 1.0, 0.75), the biased entry 1 is the max.
  const std::vector<double> l = {0.25, 2.5, 1.0, 0.75};
  double z = 0;
  for (double x : l) z += std::exp(x - 2.5);
  for (int64_t j = 0; j < m; ++j) EXPECT_NEAR(p[j] * inv, std::exp(l[j] - 2.5) / z, 1e-6);
  for (int64_t d = 0; d < D; ++d) {
    double want = 0;
    for (int64_t j = 0; j < m; ++j) want += std::exp(l[j] - 2.5) / z * vals[j * D + d];
    EXPECT_NEAR(o[d], want, 1e-5);
  }
}

}  // namespace
}  // namespace kvb
