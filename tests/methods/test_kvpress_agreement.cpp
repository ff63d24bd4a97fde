// kvbench's eviction methods against NVIDIA kvpress, token for token, with no Python: the fixtures
// (tests/fixtures/kvpress/<pair>.json, written by scripts/peer-kvpress.sh from kvpress itself) hold
// what kvpress's press kept per layer and KV head on two short prompts of kvb-testbed, and this
// test runs kvbench's method (the fixture's method + parameters) on the same ids and checks,
// exactly:
//   equal     kvbench's kept set = kvpress's with the recorded differences applied (entries that
//             tie, or agree to float rounding, in kvpress's own scores; each recorded entry by
//             entry, so a new difference or a vanished one fails);
//   nested    per head one kept set contains the other (the same scores, top-k of the same order),
//             and each side's sizes follow its own documented budget rule (PyramidKV: kvbench's
//             pyramid_layer_budget, kvpress's get_layer_budget reimplemented below; Ada-KV: the
//             same total per layer, KV heads x n (1 - r));
//   channels  per head, the key channels kvpress's ThinK rule zeroes under kvbench's default GQA
//             aggregation of the window queries (recomputed from kvpress's tensors), and as many as
//             kvpress zeroes; with query_energy=mean_square (kvpress's aggregation), the very
//             channels kvpress zeroes.

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/engine/engine.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/context_pass.h"
#include "harness/kv/method_registry.h"
#include "harness/model/model.h"
#include "methods/common/evicting_kv_cache.h"
#include "methods/common/eviction_select.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Every pair scripts/peer/kvpress_pairs.py defines, with the relation its fixture must declare: a
// fixture that goes missing or changes its relation fails here rather than being skipped.
const std::map<std::string, std::string> kPairs = {
    {"snapkv", "equal"},   {"knorm", "equal"},      {"streaming_llm", "equal"},
    {"tova", "equal"},     {"pyramidkv", "nested"}, {"adakv", "nested"},
    {"think", "channels"}, {"h2o", "equal"},        {"keydiff", "equal"},
    {"lagkv", "equal"},    {"cur", "equal"},        {"expected_attention", "equal"},
    {"chunkkv", "equal"},  {"kvzip", "nested"},     {"kvzip_plus", "nested"},
    {"kvzap", "equal"},    {"qfilters", "equal"},   {"duo_attention", "equal"}};

fs::path repo_root() { return fs::path(test::fixtures_dir()).parent_path().parent_path(); }

std::shared_ptr<Model> testbed() {
  static std::shared_ptr<Model> m = load_model((repo_root() / "models" / "kvb-testbed").string());
  return m;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

struct Kept {
  std::vector<std::vector<std::vector<int32_t>>> tokens;    // [layer][head]
  std::vector<std::vector<std::vector<int64_t>>> channels;  // [layer][head]: zero key channels
};

// kvbench's method on one prompt: prefill (end_prefill included), then what each head keeps.
// The fixtures were written with OpenBLAS on one thread: its threaded reductions move float
// rounding, and with it the exact ties the fixtures record entry by entry (knorm's key norms).
// Looked up at run time so the test does not link OpenBLAS itself; absent, nothing changes.
struct OneBlasThread {
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  SetThreads set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  GetThreads get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  int before = get ? get() : 0;
  OneBlasThread() {
    if (set) set(1);
  }
  ~OneBlasThread() {
    if (set && before > 0) set(before);
  }
};

Kept run_kvbench(const json& method, const std::vector<int64_t>& ids) {
  const OneBlasThread one_blas_thread;
  auto m = testbed();
  // With the model: a calibrating method (kvzap) fits on it first, from the test data, keeping
  // nothing on disk (where the script kept its artifact does not change it).
  const CacheContext ctx{m->config, m->device, m->dtype, m};
  json given = method.at("params");
  const json schema_view = MethodRegistry::instance().resolve(method.at("name"), given);
  if (schema_view.contains("cache_dir")) given["cache_dir"] = "";
  if (schema_view.contains("data_dir")) given["data_dir"] = test::data_dir();
  const json params = MethodRegistry::instance().resolve(method.at("name"), given);
  Engine engine(m, MethodRegistry::instance().create(method.at("name"), ctx, params));
  const auto& store = dynamic_cast<const EvictingKvCache&>(engine.kv());
  const int64_t seq = engine.new_sequence();
  if (auto* pass_cache = dynamic_cast<ContextPassCache*>(&engine.kv())) {
    // KVzip's reconstruction, handed over as the qa protocol does on a model without a chat
    // template (and as scripts/peer/kvzip_tokenizer.py makes KVzipPress read it): BOS is the
    // prefix, "\n" closes the user turn.
    static const Tokenizer tok(m->tokenizer_path);
    engine.prefill({seq}, {ids}, nullptr, /*call_end_prefill=*/false);
    ContextPass pass;
    pass.engine = &engine;
    pass.seq = seq;
    pass.context = ids;
    pass.prefix_tokens = 1;
    pass.turn_close = tok.encode("\n");
    pass.encode = [](const std::string& text) { return tok.encode(text); };
    pass_cache->run_context_pass(pass);
    engine.kv().end_prefill(seq);
  } else {
    engine.prefill({seq}, {ids});
  }
  Kept k;
  for (int l = 0; l < static_cast<int>(m->config.n_layers); ++l) {
    k.tokens.emplace_back();
    k.channels.emplace_back();
    for (int64_t h = 0; h < m->config.n_kv_heads; ++h) {
      k.tokens.back().push_back(store.kept_indices(seq, l, h));
      const at::Tensor zero = (store.kept_keys(seq, l, h) == 0).all(0);
      std::vector<int64_t> ch;
      for (int64_t c = 0; c < zero.size(0); ++c)
        if (zero[c].item<bool>()) ch.push_back(c);
      k.channels.back().push_back(ch);
    }
  }
  return k;
}

std::set<int32_t> as_set(const json& a) { return a.get<std::set<int32_t>>(); }
std::set<int32_t> as_set(const std::vector<int32_t>& a) { return {a.begin(), a.end()}; }

// kvpress PyramidKVPress.get_layer_budget (kvpress 0.5.5), Python's round = half to even.
int64_t kvpress_pyramid_budget(int64_t q_len, double r, int64_t w, double beta, int layer,
                               int n_layers) {
  const double cap = static_cast<double>(w) + static_cast<double>(q_len) * (1 - r);
  double mn = (cap - static_cast<double>(w)) / beta;
  double mx = (cap - static_cast<double>(w)) * 2 - mn;
  if (mx >= static_cast<double>(q_len - w)) {
    mx = static_cast<double>(q_len - w);
    mn = (cap - static_cast<double>(w)) * 2 - mx;
  }
  if (!(static_cast<double>(q_len) >= mx && mx >= mn && mn >= static_cast<double>(w)))
    return std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(q_len * (1 - r))));
  const double steps = n_layers > 1 ? (mx - mn) / (n_layers - 1) : 0.0;
  return static_cast<int64_t>(std::nearbyint(mx - layer * steps));
}

class KvpressAgreement : public ::testing::TestWithParam<std::string> {};

TEST_P(KvpressAgreement, KeptSetsMatchKvpressAsDocumented) {
  const std::string pair = GetParam();
  const fs::path model_dir = repo_root() / "models" / "kvb-testbed";
  if (!fs::exists(model_dir / "model.safetensors")) GTEST_SKIP() << model_dir << " not shipped";
  const fs::path path = fs::path(test::fixtures_dir()) / "kvpress" / (pair + ".json");
  ASSERT_TRUE(fs::exists(path)) << path << ": run scripts/peer-kvpress.sh";
  const json fx = read_json(path);
  ASSERT_EQ(fx.at("relation"), kPairs.at(pair)) << pair;
  ASSERT_EQ(fx.at("prompts").size(), 2u);
  const double r = fx.at("compression_ratio").get<double>();
  const int L = static_cast<int>(testbed()->config.n_layers);
  const int64_t H = testbed()->config.n_kv_heads;
  const std::string relation = fx.at("relation");
  for (size_t pi = 0; pi < fx["prompts"].size(); ++pi) {
    const json& p = fx["prompts"][pi];
    const auto ids = p.at("ids").get<std::vector<int64_t>>();
    const int64_t n = static_cast<int64_t>(ids.size());
    const Kept got = run_kvbench(fx.at("kvbench_method"), ids);
    SCOPED_TRACE(pair + " prompt " + std::to_string(pi));
    if (relation == "channels") {
      // No token is evicted (budget 1): the comparison is the pruned channels.
      for (int l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(got.tokens[l][h].size(), static_cast<size_t>(n));
          // The documented difference: kvbench squares the GQA group's mean window query, kvpress
          // averages the squares; the fixture holds kvpress's rule recomputed that way from
          // kvpress's tensors, and kvpress's own choice (same count, a different set somewhere).
          EXPECT_EQ(got.channels[l][h],
                    p.at("zero_key_channels_group_mean")[l][h].get<std::vector<int64_t>>())
              << "layer " << l << " head " << h;
          EXPECT_EQ(got.channels[l][h].size(), p.at("zero_key_channels")[l][h].size());
          EXPECT_FALSE(got.channels[l][h].empty()) << "nothing pruned: the check would be vacuous";
        }
      // With kvpress's aggregation (query_energy=mean_square), kvpress's own zeroed channels.
      json as_kvpress = fx.at("kvbench_method");
      as_kvpress["params"]["query_energy"] = "mean_square";
      const Kept same = run_kvbench(as_kvpress, ids);
      for (int l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h)
          EXPECT_EQ(same.channels[l][h],
                    p.at("zero_key_channels")[l][h].get<std::vector<int64_t>>())
              << "query_energy=mean_square, layer " << l << " head " << h;
      continue;
    }
    const json& want = p.at("kept");
    if (relation == "equal") {
      std::map<std::pair<int, int64_t>, json> diffs;
      for (const json& d : p.at("differences")) {
        EXPECT_TRUE(d.at("why") == "tie" || d.at("why") == "rounding") << d.dump();
        diffs[{d.at("layer").get<int>(), d.at("head").get<int64_t>()}] = d;
      }
      int64_t evicting_heads = 0;
      for (int l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h) {
          std::set<int32_t> expect = as_set(want[l][h]);
          auto it = diffs.find({l, h});
          if (it != diffs.end()) {
            for (int32_t t : as_set(it->second.at("only_kvpress"))) expect.erase(t);
            for (int32_t t : as_set(it->second.at("only_kvbench"))) expect.insert(t);
          }
          EXPECT_EQ(as_set(got.tokens[l][h]), expect) << "layer " << l << " head " << h;
          // DuoAttention's retrieval heads keep everything by definition; every other method's
          // heads each evict.
          if (pair != "duo_attention") {
            EXPECT_LT(expect.size(), static_cast<size_t>(n)) << "nothing evicted: vacuous";
          }
          evicting_heads += expect.size() < static_cast<size_t>(n);
        }
      EXPECT_GT(evicting_heads, 0) << "nothing evicted: vacuous";
      continue;
    }
    ASSERT_EQ(relation, "nested");
    int64_t kvp_cache = 0, kvb_cache = 0;  // entries kept over the whole cache
    for (int l = 0; l < L; ++l) {
      int64_t kvp_total = 0, kvb_total = 0;
      for (int64_t h = 0; h < H; ++h) {
        const std::set<int32_t> a = as_set(want[l][h]), b = as_set(got.tokens[l][h]);
        const bool b_in_a = std::includes(a.begin(), a.end(), b.begin(), b.end());
        const bool a_in_b = std::includes(b.begin(), b.end(), a.begin(), a.end());
        EXPECT_TRUE(a_in_b || b_in_a) << "layer " << l << " head " << h;
        kvp_total += static_cast<int64_t>(a.size());
        kvb_total += static_cast<int64_t>(b.size());
        if (pair == "kvzip" || pair == "kvzip_plus") {
          // One ranking, kvbench's total the smaller: its set is the head's share of a prefix.
          EXPECT_TRUE(b_in_a) << "layer " << l << " head " << h;
        }
        if (pair == "pyramidkv") {
          const int64_t w = fx["press_params"].at("window_size").get<int64_t>();
          const double beta = fx["press_params"].at("beta").get<double>();
          const int64_t avg = static_cast<int64_t>(std::floor((1 - r) * n + 1e-9));
          EXPECT_EQ(static_cast<int64_t>(b.size()), pyramid_layer_budget(avg, w, n, beta, l, L))
              << "kvbench layer " << l;
          EXPECT_EQ(static_cast<int64_t>(a.size()), kvpress_pyramid_budget(n, r, w, beta, l, L))
              << "kvpress layer " << l;
        }
      }
      if (pair == "adakv") {
        EXPECT_EQ(kvb_total, kvp_total) << "layer " << l;
        EXPECT_EQ(kvb_total, H * static_cast<int64_t>(std::floor((1 - r) * n + 1e-9)));
      }
      kvp_cache += kvp_total;
      kvb_cache += kvb_total;
    }
    if (pair == "kvzip" || pair == "kvzip_plus") {
      // kvpress prunes int(L H n r) entries of the whole cache; kvbench keeps floor(n (1 - r)) per
      // head, L H times.
      const int64_t all = static_cast<int64_t>(L) * H * n;
      EXPECT_EQ(kvp_cache, all - static_cast<int64_t>(static_cast<double>(all) * r + 1e-9));
      EXPECT_EQ(kvb_cache,
                static_cast<int64_t>(L) * H * static_cast<int64_t>(std::floor((1 - r) * n + 1e-9)));
    }
  }
}

// `kvbench kept-indices` (the script's kvbench side) writes what the store keeps, prompt by prompt,
// and refuses a method whose store has no kept indices.
TEST(KeptIndicesTool, DumpsTheStoresKeptSetsAndRefusesOtherStores) {
  const fs::path model_dir = repo_root() / "models" / "kvb-testbed";
  if (!fs::exists(model_dir / "model.safetensors")) GTEST_SKIP() << model_dir << " not shipped";
  const json fx = read_json(fs::path(test::fixtures_dir()) / "kvpress" / "snapkv.json");
  const std::string dir = test::make_temp_dir("kept_indices_tool");
  json prompts = json::array();
  for (const json& p : fx["prompts"]) prompts.push_back(p["ids"]);
  {
    std::ofstream(dir + "/ids.json") << json{{"prompts", prompts}}.dump();
    std::ofstream(dir + "/method.json") << fx["kvbench_method"].dump();
  }
  const std::string args = "kept-indices --model " + model_dir.string() + " --method \"$(cat " +
                           dir + "/method.json)\" --ids " + dir + "/ids.json --out " + dir +
                           "/kept.json";
  const test::CommandResult r = test::run_kvbench(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = read_json(dir + "/kept.json");
  ASSERT_EQ(out["prompts"].size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Kept k = run_kvbench(fx["kvbench_method"], prompts[i].get<std::vector<int64_t>>());
    EXPECT_EQ(out["prompts"][i]["n_tokens"], prompts[i].size());
    EXPECT_EQ(out["prompts"][i]["kept"].get<decltype(k.tokens)>(), k.tokens) << "prompt " << i;
  }
  // The parameters as resolved (schema defaults filled in), not only the ones given.
  EXPECT_EQ(out["method"]["params"]["preset"], "kvpress");
  EXPECT_EQ(out["method"]["params"]["allocator"], "uniform");
  const test::CommandResult full =
      test::run_kvbench("kept-indices --model " + model_dir.string() + " --method full --ids " +
                        dir + "/ids.json --out " + dir + "/full.json");
  EXPECT_EQ(full.exit_code, 2);
  EXPECT_NE(full.err.find("not the eviction store"), std::string::npos) << full.err;
}

std::vector<std::string> pair_names() {
  std::vector<std::string> v;
  for (const auto& [name, relation] : kPairs) v.push_back(name);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Pairs, KvpressAgreement, ::testing::ValuesIn(pair_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace kvb
