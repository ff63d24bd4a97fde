// The kvbench binary end to end: outputs of generate/score/inspect, and every loader error path giving
// one clear line that names the file (and tensor or key), exit code 2, and no crash.

#include <gtest/gtest.h>

#include <filesystem>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/store/build_info.h"
#include "tests/support/test_support.h"

namespace kvb {
namespace {

using test::run_kvbench;

std::string hf_dir() { return test::models_dir() + "/stories260K-hf"; }

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

// A copy of stories260K-hf whose files the test then damages.
struct HfCopy {
  std::string dir = test::make_temp_dir("hf");
  std::string config = slurp(hf_dir() + "/config.json");
  std::string weights = slurp(hf_dir() + "/model.safetensors");
  std::string tokenizer = slurp(hf_dir() + "/tokenizer.model");

  nlohmann::json header() const {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(weights[i]);
    return nlohmann::json::parse(weights.substr(8, n));
  }
  // Rewrites the header (padding with spaces keeps the data offsets valid when it shrinks).
  void set_header(const nlohmann::json& h) {
    uint64_t old_n = 0;
    for (int i = 7; i >= 0; --i) old_n = (old_n << 8) | static_cast<uint8_t>(weights[i]);
    std::string s = h.dump();
    ASSERT_LE(s.size(), old_n) << "test header grew; pick a smaller edit";
    s.resize(old_n, ' ');
    weights = weights.substr(0, 8) + s + weights.substr(8 + old_n);
  }
  void save() {
    write(dir + "/config.json", config);
    write(dir + "/model.safetensors", weights);
    write(dir + "/tokenizer.model", tokenizer);
  }
};

void expect_one_line_error(const test::CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  // The error is one line, "kvbench: error: ...\n", and the last thing on stderr (logs may precede it).
  const size_t at = r.err.find("kvbench: error: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n', at), r.err.size() - 1) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
}

TEST(Cli, ScorePrintsReferenceJson) {
  auto r = run_kvbench("score --model " + hf_dir() +
                       " --text 'One day, a clever fox found a shiny key under the old oak tree.'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["n"], 34);
  EXPECT_NEAR(j["nll"].get<double>(), 54.4041, 5e-4);
  EXPECT_NEAR(j["ppl"].get<double>(), 4.95364, 1e-4);
  EXPECT_EQ(j["tokens"][0], 1);
  EXPECT_EQ(j["tokens"].size(), 35u);
}

// --per-token and --top-k: with K the whole vocabulary (stories260K: 512), each token's NLL must be
// logsumexp(row) - row[next id] of the very logits printed, and the rows come highest first.
TEST(Cli, ScorePrintsPerTokenNllAndTopLogitsThatAgree) {
  auto r = run_kvbench("score --model " + hf_dir() +
                       " --text 'One day, a clever fox found a shiny key.' --per-token --top-k 512");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto& tokens = j["tokens"];
  const auto& nll = j["token_nll"];
  const auto& top = j["top_logits"];
  ASSERT_EQ(nll.size(), tokens.size() - 1);
  ASSERT_EQ(top.size(), nll.size());
  double sum = 0;
  for (size_t i = 0; i < nll.size(); ++i) {
    ASSERT_EQ(top[i].size(), 512u);
    double max_logit = top[i][0][1].get<double>(), z = 0, target = 0;
    for (size_t k = 0; k < top[i].size(); ++k) {
      const double v = top[i][k][1].get<double>();
      if (k > 0) {
        EXPECT_LE(v, top[i][k - 1][1].get<double>()) << "row " << i << " not sorted at " << k;
      }
      z += std::exp(v - max_logit);
      if (top[i][k][0] == tokens[i + 1]) target = v;
    }
    EXPECT_NEAR(nll[i].get<double>(), max_logit + std::log(z) - target, 1e-4) << "row " << i;
    sum += nll[i].get<double>();
  }
  EXPECT_NEAR(sum, j["nll"].get<double>(), 1e-9);
  // Without the flags the output has neither field; a K past the vocabulary is refused.
  auto plain = nlohmann::json::parse(
      run_kvbench("score --model " + hf_dir() + " --text 'One day, a clever fox.'").out);
  EXPECT_FALSE(plain.contains("token_nll"));
  EXPECT_FALSE(plain.contains("top_logits"));
  expect_one_line_error(run_kvbench("score --model " + hf_dir() + " --text hi --top-k 513"),
                        {"top-k 513", "vocabulary"});
}

TEST(Cli, GeneratePrintsPromptAndContinuation) {
  auto r = run_kvbench("generate --model stories260K --models-dir " + test::models_dir() +
                       " --prompt 'Once upon a time' -n 12");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("Once upon a time\n").size() + 10);
}

TEST(Cli, InspectReportsArchitectureAndKvBytes) {
  auto r = run_kvbench("inspect --model " + hf_dir());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["num_hidden_layers"], 5);
  EXPECT_EQ(j["parameter_count"], 260032);
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * 5 * 32 * 4);  // K and V, 5 layers, kv_dim 32, fp32
  EXPECT_EQ(j["rope_style"], "half");
}

TEST(Cli, InspectSyntheticPreset) {
  auto r = run_kvbench("inspect --model synthetic:tiny");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "synthetic");
  EXPECT_EQ(j["head_dim"], 8);
}

TEST(Cli, VersionNamesTheBuildCommit) {
  auto r = run_kvbench("--version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "kvbench " + kvbench_version_string() + "\n");
  EXPECT_NE(r.out.find(std::string("+") + build_info().git_commit), std::string::npos) << r.out;
}

TEST(CliErrors, UnknownModelAndPreset) {
  expect_one_line_error(run_kvbench("inspect --model no-such-model"), {"no-such-model", "not found"});
  expect_one_line_error(run_kvbench("inspect --model synthetic:llama-3-8c"),
                        {"llama-3-8c", "did you mean 'llama-3-8b'"});
}

TEST(CliErrors, BadDeviceAndDtype) {
  expect_one_line_error(run_kvbench("inspect --model synthetic:tiny --dtype fp64"), {"--dtype", "fp64"});
  expect_one_line_error(run_kvbench("inspect --model synthetic:tiny --device tpu"), {"--device", "tpu"});
}

TEST(CliErrors, TruncatedSafetensors) {
  HfCopy c;
  c.weights.resize(c.weights.size() / 2);
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                        {c.dir + "/model.safetensors", "out of range"});
}

TEST(CliErrors, HeaderLengthBeyondFile) {
  HfCopy c;
  c.weights = std::string("\xff\xff\xff\x00\x00\x00\x00\x00", 8) + c.weights.substr(8);
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                        {"model.safetensors", "header length", "beyond the end"});
}

TEST(CliErrors, OverlappingOffsets) {
  HfCopy c;
  auto h = c.header();
  auto& e = h["model.layers.0.input_layernorm.weight"]["data_offsets"];
  e = {0, 256};  // same bytes as the start of embed_tokens
  c.set_header(h);
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir), {"model.safetensors", "overlap"});
}

TEST(CliErrors, UnknownDtype) {
  HfCopy c;
  auto h = c.header();
  h["model.norm.weight"]["dtype"] = "F9";
  c.set_header(h);
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                        {"model.safetensors", "model.norm.weight", "unknown dtype 'F9'"});
}

TEST(CliErrors, DtypeTimesShapeIsNotTheByteSpan) {
  HfCopy c;
  auto h = c.header();
  h["model.norm.weight"]["dtype"] = "F16";  // 64 x 2 bytes != the 256-byte span
  c.set_header(h);
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                        {"model.norm.weight", "needs 128 bytes", "span 256"});
}

TEST(CliErrors, MissingTensor) {
  HfCopy c;
  auto h = c.header();
  h.erase("model.layers.3.mlp.up_proj.weight");
  c.set_header(h);
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                        {c.dir, "missing tensor 'model.layers.3.mlp.up_proj.weight'"});
}

TEST(CliErrors, ShapeContradictsConfig) {
  HfCopy c;
  auto j = nlohmann::json::parse(c.config);
  j["intermediate_size"] = 171;
  c.config = j.dump();
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                        {"model.safetensors", "gate_proj", "[172, 64]", "implies [171, 64]"});
}

TEST(CliErrors, ConfigMissingFieldOrMalformed) {
  {
    HfCopy c;
    auto j = nlohmann::json::parse(c.config);
    j.erase("num_hidden_layers");
    c.config = j.dump();
    c.save();
    expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                          {c.dir + "/config.json", "missing required field 'num_hidden_layers'"});
  }
  {
    HfCopy c;
    c.config = "{\"hidden_size\": 64,";
    c.save();
    expect_one_line_error(run_kvbench("inspect --model " + c.dir), {"config.json", "not valid JSON"});
  }
  {
    HfCopy c;
    auto j = nlohmann::json::parse(c.config);
    j["num_attention_heads"] = "eight";
    c.config = j.dump();
    c.save();
    expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                          {"config.json", "'num_attention_heads' must be an integer"});
  }
}

TEST(CliErrors, TokenizerMissingOrCorrupt) {
  {
    HfCopy c;
    c.save();
    std::remove((c.dir + "/tokenizer.model").c_str());
    expect_one_line_error(run_kvbench("score --model " + c.dir + " --text hello"),
                          {c.dir, "no tokenizer.model"});
  }
  {
    HfCopy c;
    c.tokenizer = c.tokenizer.substr(0, c.tokenizer.size() / 3);
    c.save();
    expect_one_line_error(run_kvbench("score --model " + c.dir + " --text hello"),
                          {c.dir + "/tokenizer.model", "SentencePiece"});
  }
}

TEST(CliErrors, TruncatedLlama2cCheckpoint) {
  std::string dir = test::make_temp_dir("l2c");
  std::string bin = slurp(test::models_dir() + "/stories260K/stories260K.bin");
  write(dir + "/m.bin", bin.substr(0, bin.size() - 4));
  expect_one_line_error(run_kvbench("inspect --model " + dir + "/m.bin"),
                        {dir + "/m.bin", "does not match its header"});
  write(dir + "/h.bin", bin.substr(0, 20));
  expect_one_line_error(run_kvbench("inspect --model " + dir + "/h.bin"), {dir + "/h.bin", "truncated"});
}

// The first element of `tensor` in a safetensors header set to `bits` (F32), data offsets unchanged.
void poke_f32(HfCopy& c, const std::string& tensor, int64_t element, uint32_t bits) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(c.weights[i]);
  const auto h = c.header();
  ASSERT_TRUE(h.contains(tensor)) << tensor;
  ASSERT_EQ(h[tensor]["dtype"], "F32");
  const size_t at = 8 + n + h[tensor]["data_offsets"][0].get<size_t>() + 4 * element;
  for (int b = 0; b < 4; ++b) c.weights[at + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
}

TEST(CliErrors, NonFiniteWeightsAreRefusedNamingTheTensor) {
  {
    HfCopy c;
    poke_f32(c, "model.layers.2.mlp.down_proj.weight", 17, 0x7fc00000u);  // NaN
    c.save();
    expect_one_line_error(run_kvbench("score --model " + c.dir + " --text 'Once upon a time'"),
                          {c.dir + "/model.safetensors", "'model.layers.2.mlp.down_proj.weight'",
                           "NaN or Inf", "element 17"});
  }
  {
    HfCopy c;
    poke_f32(c, "model.embed_tokens.weight", 0, 0xff800000u);  // -Inf
    c.save();
    expect_one_line_error(run_kvbench("inspect --model " + c.dir), {"'model.embed_tokens.weight'", "NaN or Inf"});
  }
  // llama2.c: the first float after the 28-byte header is token_embedding[0][0].
  std::string dir = test::make_temp_dir("l2cnan");
  std::string bin = slurp(test::models_dir() + "/stories260K/stories260K.bin");
  const uint32_t nan = 0x7fc00000u;
  std::memcpy(&bin[28 + 4 * 3], &nan, 4);
  write(dir + "/m.bin", bin);
  expect_one_line_error(run_kvbench("inspect --model " + dir + "/m.bin"),
                        {dir + "/m.bin", "'token_embedding'", "NaN or Inf", "element 3"});
}

TEST(CliErrors, DeclaredContextIsBoundedBeforeRopeTables) {
  // 2^40 positions: the RoPE tables alone would be 2^40 x head_dim floats. Refused at the config,
  // naming the key, instead of an allocation failure or an OOM kill.
  HfCopy c;
  auto j = nlohmann::json::parse(c.config);
  j["max_position_embeddings"] = int64_t{1} << 40;
  c.config = j.dump();
  c.save();
  expect_one_line_error(run_kvbench("inspect --model " + c.dir),
                        {c.dir + "/config.json", "'max_position_embeddings' 1099511627776", "supported maximum"});
  // A long declared context within the bound loads without allocating tables for it.
  j["max_position_embeddings"] = int64_t{1} << 24;
  c.config = j.dump();
  c.save();
  auto r = run_kvbench("score --model " + c.dir + " --text 'Once upon a time'");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(CliErrors, ThreadCountsAreBounded) {
  expect_one_line_error(run_kvbench("score --model " + hf_dir() + " --threads 100000 --text hi"),
                        {"--threads", "100000 threads", "[0, 1024]"});
  expect_one_line_error(run_kvbench("inspect --model synthetic:tiny --threads -2"), {"--threads", "-2"});
  expect_one_line_error(run_kvbench("bench --model synthetic:tiny --threads-list 1,5000"),
                        {"--threads-list", "5000 threads"});
  expect_one_line_error(run_kvbench("train --threads 2000 -c /nonexistent.json"), {"--threads", "2000"});
}

TEST(CliErrors, ScoreRefusesTextLongerThanTheContext) {
  // stories260K's context is 512 positions; ~700 tokens of text is refused before any forward pass.
  std::string text;
  for (int i = 0; i < 70; ++i) text += "The cat sat on the mat. ";
  expect_one_line_error(run_kvbench("score --model " + hf_dir() + " --text '" + text + "'"),
                        {"--text", "longer than the model's context of 512", "--beyond-context"});
  std::string ids;
  for (int i = 0; i < 513; ++i) ids += " 5";
  expect_one_line_error(run_kvbench("score --model " + hf_dir() + " --ids" + ids), {"--ids", "513 tokens"});
  // Exactly the context is scored, and the override scores past it.
  ids.resize(ids.size() - 2);
  auto r = run_kvbench("score --model " + hf_dir() + " --ids" + ids);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["n"], 511);
  r = run_kvbench("score --model " + hf_dir() + " --beyond-context --ids" + ids + " 5 5");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["n"], 513);
}

TEST(Cli, ScoreReadsTheTextFromAFile) {
  const std::string text = "One day, a clever fox found a shiny key under the old oak tree.";
  auto by_text = run_kvbench("score --model " + hf_dir() + " --text '" + text + "'");
  ASSERT_EQ(by_text.exit_code, 0) << by_text.err;
  const std::string dir = test::make_temp_dir("score_file");
  write(dir + "/t.txt", text);
  auto by_file = run_kvbench("score --model " + hf_dir() + " --file " + dir + "/t.txt");
  ASSERT_EQ(by_file.exit_code, 0) << by_file.err;
  EXPECT_EQ(by_file.out, by_text.out);
}

TEST(CliErrors, ScoreFileIsBoundedAndMustBeUtf8Text) {
  const std::string dir = test::make_temp_dir("score_bad");
  const std::string model = " --model " + hf_dir();
  expect_one_line_error(run_kvbench("score" + model + " --file " + dir + "/missing.txt"),
                        {"--file", dir + "/missing.txt"});
  // A FIFO nobody writes to is refused at once (the test would hang otherwise).
  ASSERT_EQ(std::system(("mkfifo " + dir + "/fifo").c_str()), 0);
  expect_one_line_error(run_kvbench("score" + model + " --file " + dir + "/fifo"),
                        {"--file", dir + "/fifo", "not a regular file"});
  write(dir + "/latin1.txt", std::string("caf\xe9 au lait"));
  expect_one_line_error(run_kvbench("score" + model + " --file " + dir + "/latin1.txt"),
                        {"--file " + dir + "/latin1.txt", "not UTF-8", "0xe9", "offset 3"});
  // Over the bound: refused from the file's size (a sparse file: no 17 MiB written), and from stdin
  // after reading just past the bound.
  ASSERT_EQ(std::system(("truncate -s 17M " + dir + "/huge.txt").c_str()), 0);
  expect_one_line_error(run_kvbench("score" + model + " --file " + dir + "/huge.txt"),
                        {"--file", dir + "/huge.txt", "bytes"});
  auto both = run_kvbench("score" + model + " --file " + dir + "/latin1.txt --text hi");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--file"), std::string::npos) << both.err;
}

}  // namespace
}  // namespace kvb

namespace kvb {
namespace {

TEST(CliErrors, ConfigThatIsNotAFileIsNamedForWhatItIs) {
  const std::string dir = test::make_temp_dir("config_kinds");
  expect_one_line_error(run_kvbench("run -c " + dir + "/missing.json --db " + dir + "/db.sqlite"),
                        {dir + "/missing.json", "config file not found"});
  ASSERT_EQ(std::system(("mkfifo " + dir + "/fifo.json").c_str()), 0);
  expect_one_line_error(run_kvbench("run -c " + dir + "/fifo.json --db " + dir + "/db.sqlite"),
                        {dir + "/fifo.json", "not a regular file"});
  expect_one_line_error(run_kvbench("grid -c " + dir + " --db " + dir + "/db.sqlite"),
                        {dir, "not a regular file"});
  EXPECT_FALSE(std::filesystem::exists(dir + "/db.sqlite"));
}

}  // namespace
}  // namespace kvb
