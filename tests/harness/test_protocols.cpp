// The protocol registry and the generic run loop: an unknown protocol is refused by name, the
// built-in protocols are registered with their report hints, and a protocol registered in this file
// (nothing else knows it) plans, runs through execute_run, fails mid-run, resumes from the stored
// samples (a sample reads the one stored before it, as serve's simulation reads its footprint),
// refuses stored samples of other data, and writes nothing when its plan refuses the config.

#include <gtest/gtest.h>

#include "harness/common/error.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/run_config.h"
#include "harness/eval/runner.h"
#include "harness/store/results_db.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

// How the next run of the chain protocol behaves (set by each test step).
struct ChainControl {
  int64_t fail_at = -1;      // run_sample of this index throws
  bool refuse_plan = false;  // plan throws
  std::string key_salt;      // part of every sample key ("data" the samples were computed on)
  int64_t computed = 0;      // run_sample calls
};
ChainControl chain;

// Sample i stores sum_i = sum_{i-1} + i + 1, reading sum_{i-1} back from the database.
class ChainRun : public ProtocolRun {
 public:
  explicit ChainRun(int64_t n) : n_(n) {}
  int64_t samples() const override { return n_; }
  std::string sample_key(int64_t i) const override {
    return "link" + std::to_string(i) + chain.key_salt;
  }
  SampleOutput run_sample(int64_t i, const StoredSamples& stored) override {
    KVB_CHECK(i != chain.fail_at, "chain: sample ", i, " fails on purpose");
    chain.computed++;
    const int64_t prev = i == 0 ? 0 : stored.output(i - 1).at("sum").get<int64_t>();
    return {{{"sum", prev + i + 1}}, "link " + std::to_string(i)};
  }
  std::vector<Metric> metrics(const StoredSamples& stored) const override {
    const auto all = stored.outputs();
    return {{"chain_sum", static_cast<double>(all.back().at("sum").get<int64_t>())},
            {"chain_samples", static_cast<double>(all.size())}};
  }

 private:
  int64_t n_;
};

class ChainProtocol : public Protocol {
 public:
  ProtocolInfo info() const override {
    ProtocolInfo p;
    p.name = "test_chain";
    p.summary = "test: each sample adds to the sum stored by the one before";
    p.params = {int_param("links", 4, 1, 100, "samples")};
    p.report.default_metric = "chain_sum";
    return p;
  }
  std::unique_ptr<ProtocolRun> plan(const RunContext& ctx) const override {
    KVB_CHECK(!chain.refuse_plan, "config.protocol.links: refused by the test");
    return std::make_unique<ChainRun>(ctx.protocol().at("links").get<int64_t>());
  }
  int64_t expected_samples(const nlohmann::json& proto) const override { return proto.at("links"); }
};

}  // namespace
}  // namespace kvb

KVB_REGISTER_PROTOCOL(test_chain, kvb::ChainProtocol);

namespace kvb {
namespace {

nlohmann::json config_of(const std::string& protocol) {
  return {{"model", "synthetic:tiny"}, {"method", "full"}, {"protocol", {{"name", protocol}}}};
}

TEST(Protocols, UnknownProtocolIsRefusedByName) {
  try {
    resolve_run_config(config_of("streem"));
    FAIL() << "an unknown protocol resolved";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown protocol 'streem'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'stream'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_chain"), std::string::npos) << msg;  // the known ones are listed
  }
}

TEST(Protocols, BuiltinsAreRegisteredWithTheirSchemasAndHints) {
  const auto& r = ProtocolRegistry::instance();
  for (const char* name : {"stream", "probe", "profile", "qa", "perf", "serve"}) {
    ASSERT_TRUE(r.has(name)) << name;
    EXPECT_EQ(r.info(name).origin, "builtin");
    EXPECT_FALSE(r.info(name).params.empty()) << name;
  }
  EXPECT_TRUE(r.report("perf").measures_throughput);
  EXPECT_FALSE(r.report("stream").measures_throughput);
  EXPECT_EQ(r.report("qa").paired_in_sample.at("accuracy"), "full_accuracy");
  EXPECT_EQ(r.report("no_such_protocol").default_metric, "");  // unknown: the defaults
  // Defaults come from the protocol's own schema.
  const nlohmann::json resolved = resolve_run_config(config_of("test_chain"));
  EXPECT_EQ(resolved["protocol"]["links"], 4);
  EXPECT_EQ(run_dataset_label(resolved), "synthetic");
  EXPECT_THROW(resolve_run_config({{"model", "synthetic:tiny"},
                                   {"method", "full"},
                                   {"protocol", {{"name", "test_chain"}, {"links", 0}}}}),
               Error);
}

TEST(Protocols, StreamSkipTokensIsUnsetByDefaultAndShiftsTheWindows) {
  auto stream = [](nlohmann::json extra) {
    nlohmann::json p = {{"name", "stream"}, {"window", 128}, {"max_windows", 2}};
    p.update(extra);
    return resolve_run_config(
        {{"model", test::models_dir() + "/stories260K"}, {"method", "full"}, {"protocol", p}});
  };
  const nlohmann::json plain = stream(nlohmann::json::object());
  // Unset stays out of the resolved config, so every stored stream run keeps its hash.
  EXPECT_FALSE(plain["protocol"].contains("skip_tokens")) << plain.dump();
  const nlohmann::json skipped = stream({{"skip_tokens", 254}});
  EXPECT_EQ(skipped["protocol"]["skip_tokens"], 254);
  EXPECT_NE(run_config_hash(skipped), run_config_hash(plain));
  // 254 content tokens are two windows of 127: the held-out windows are the plain run's third
  // and fourth.
  const std::string tok = test::models_dir() + "/stories260K/tok512.model";
  std::string plain_hash, skipped_hash;
  nlohmann::json four = plain["protocol"];
  four["max_windows"] = 4;
  const auto all = stream_windows(tok, four, test::data_dir(), &plain_hash);
  const auto held_out = stream_windows(tok, skipped["protocol"], test::data_dir(), &skipped_hash);
  ASSERT_EQ(all.size(), 4u);
  ASSERT_EQ(held_out.size(), 2u);
  EXPECT_EQ(held_out[0].tokens, all[2].tokens);
  EXPECT_EQ(held_out[1].key, all[3].key);
  EXPECT_NE(skipped_hash, plain_hash);
  EXPECT_THROW(stream({{"skip_tokens", -1}}), Error);
}

TEST(Protocols, DuplicateOrMalformedRegistrationIsRefused) {
  EXPECT_THROW(ProtocolRegistry::instance().add(std::make_unique<ChainProtocol>()), Error);
}

TEST(Protocols, ARegisteredProtocolRunsFailsAndResumesThroughTheGenericLoop) {
  const std::string dir = test::make_temp_dir("protocols");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  const nlohmann::json cfg = resolve_run_config(config_of("test_chain"));

  chain = {};
  chain.refuse_plan = true;  // a config error: nothing is written
  EXPECT_THROW(execute_run(cfg, db, env), Error);
  EXPECT_TRUE(db.list_runs().empty());

  chain = {};
  chain.fail_at = 2;
  EXPECT_THROW(execute_run(cfg, db, env), Error);
  ASSERT_EQ(db.list_runs().size(), 1u);
  EXPECT_EQ(db.list_runs()[0].status, RunStatus::kFailed);
  EXPECT_EQ(db.done_sample_indices(db.list_runs()[0].id), (std::set<int64_t>{0, 1}));

  chain = {};
  RunOutcome o = execute_run(cfg, db, env);
  EXPECT_FALSE(o.skipped);
  EXPECT_EQ(o.samples_total, 4);
  EXPECT_EQ(o.samples_computed, 2);  // 0 and 1 came from the database
  EXPECT_EQ(chain.computed, 2);
  EXPECT_EQ(test::metric(o.metrics, "chain_sum"), 1 + 2 + 3 + 4);  // sample 2 read sample 1's sum
  EXPECT_EQ(test::metric(o.metrics, "chain_samples"), 4);

  RunOutcome again = execute_run(cfg, db, env);
  EXPECT_TRUE(again.skipped);
  EXPECT_EQ(chain.computed, 2);
}

TEST(Protocols, StoredSamplesOfOtherDataAreRefusedOnResume) {
  const std::string dir = test::make_temp_dir("protocols_keys");
  ResultsDb db(dir + "/db.sqlite");
  RunEnv env;
  const nlohmann::json cfg = resolve_run_config(config_of("test_chain"));
  chain = {};
  chain.fail_at = 1;
  EXPECT_THROW(execute_run(cfg, db, env), Error);
  chain = {};
  chain.key_salt = "-other";
  try {
    execute_run(cfg, db, env);
    FAIL() << "resumed over samples of other data";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("key mismatch"), std::string::npos) << e.what();
  }
  EXPECT_EQ(chain.computed, 0);
}

}  // namespace
}  // namespace kvb
