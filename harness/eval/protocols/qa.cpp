// The qa protocol (harness/eval/qa.h): a context, then questions answered greedily and paired with
// the full cache's answers; one sample per context.

#include "harness/eval/qa.h"

#include <algorithm>
#include <map>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/eval/protocol_registry.h"
#include "harness/eval/protocols/model_run.h"
#include "harness/eval/shared_prefill.h"
#include "harness/formats/chat_template.h"
#include "harness/formats/tokenizer.h"
#include "harness/model/model.h"

namespace kvb {
namespace {

// Where a sample came from, for messages: the JSONL line, or the corpus story.
std::string sample_origin(const nlohmann::json& proto, const QaSample& s) {
  if (proto.at("source") == "longbench")
    return proto.at("path").get<std::string>() + ":" +
           s.meta.value("line", nlohmann::json(0)).dump();
  return "config.protocol.dataset '" + proto.at("dataset").get<std::string>() + "' story " +
         s.meta.value("story", nlohmann::json(0)).dump();
}

// Every sample's prompt -- BOS, the chat turn's opener, the context (middle-truncated to `length`
// where that is given, as LongBench does), and its longest question with the turn's closer --
// within the model's context: a longer one is refused, naming the sample and the lengths, before
// the run row exists. Each question follows the context alone (a fork), so the longest one counts;
// the answer's tokens may run past, as a synthetic prompt's (made to `length`) do. A context is
// tokenized only where `length` cannot bound it.
void check_prompts_fit(const Tokenizer& tok, const std::vector<QaSample>& samples,
                       const ChatTemplate& chat, bool add_bos, int64_t context_tokens,
                       const std::string& model, const nlohmann::json& proto) {
  if (context_tokens <= 0 || proto.at("source") == "synthetic") return;
  const int64_t prefix = ((chat.active() ? chat.bos : add_bos) ? 1 : 0) +
                         static_cast<int64_t>(encode_segments(tok, chat.user_open()).size());
  const int64_t close = static_cast<int64_t>(encode_segments(tok, chat.user_close()).size());
  for (const QaSample& s : samples) {
    int64_t question = 0;
    for (const QaItem& item : s.items)
      question = std::max(question, static_cast<int64_t>(tok.encode(item.question).size()) + close);
    int64_t context = s.max_context_tokens;
    if (context <= 0 || context + question > context_tokens) {
      context = prefix + static_cast<int64_t>(tok.encode(s.context).size());
      if (s.max_context_tokens > 0) context = std::min(context, s.max_context_tokens);
    }
    if (context + question <= context_tokens) continue;
    const bool longbench = proto.at("source") == "longbench";
    KVB_FAIL(sample_origin(proto, s), ": the prompt is ", context + question, " tokens (context ",
             context, ", question ", question, "), longer than the context of ", model, " (",
             context_tokens, " tokens)",
             longbench ? "; set config.protocol.length to at most " +
                             std::to_string(std::max<int64_t>(0, context_tokens - question)) +
                             " to middle-truncate the context to it, as LongBench does"
                       : "; use a corpus of shorter stories");
  }
}

class QaRun : public ModelRun {
 public:
  explicit QaRun(const RunContext& ctx)
      : ModelRun(ctx), tok_(std::make_unique<Tokenizer>(model_->tokenizer_path)) {
    check_qa_length(proto_, model_->config.max_seq_len, model_->source);
    nlohmann::json p = proto_;
    p["seed"] = ctx.resolved["seed"];
    samples_ = qa_samples(*tok_, p, ctx.env.data_dir, ctx.env.cache_dir, &dataset_hash_);
    KVB_CHECK(!samples_.empty(), "config.protocol: the qa source '",
              proto_["source"].get<std::string>(), "' yields no samples");
    opts_.mode = proto_["mode"];
    opts_.prefill_chunk = proto_["prefill_chunk"];
    opts_.cache_dir = ctx.env.cache_dir;
    opts_.share_prefill = SharedPrefills::instance().enabled();
    opts_.record_eagerly = !ctx.env.grid.empty();  // the grid's other cells replay what it records
    opts_.progress = ctx.env.log;  // a long context's prefill prints its progress
    opts_.chat = resolve_chat_template(proto_["chat_template"], tok_->chat_template(),
                                       "config.protocol.chat_template");
    if (opts_.chat.active()) ctx.log("chat template: " + opts_.chat.describe());
    check_prompts_fit(*tok_, samples_, opts_.chat, model_->config.add_bos,
                      model_->config.max_seq_len, model_->source, proto_);
  }
  int64_t samples() const override { return static_cast<int64_t>(samples_.size()); }
  std::string sample_key(int64_t i) const override { return samples_[i].key; }

  SampleOutput run_sample(int64_t i, const StoredSamples&) override {
    QaSampleResult r = run_qa_sample(model_, *tok_, method_, method_params_, samples_[i], opts_);
    nlohmann::json j = r.to_json();
    j["meta"] = samples_[i].meta;
    j["dataset_hash"] = dataset_hash_;
    j["chat_template"] = opts_.chat.describe();
    double score = 0;
    for (const auto& it : r.items) score += it.score;
    return {j, "sample " + std::to_string(i + 1) + "/" + std::to_string(samples_.size()) +
                   ": score " + std::to_string(score / std::max<size_t>(1, r.items.size())) + " (" +
                   std::to_string(r.context_tokens) + " context tokens" +
                   (r.prefill_path == "shared" ? ", shared prefill" : "") + ")"};
  }
  std::vector<Metric> metrics(const StoredSamples& stored) const override {
    return qa_metrics(parsed<QaSampleResult>(stored), caps_.simulated);
  }

 private:
  std::unique_ptr<Tokenizer> tok_;
  std::vector<QaSample> samples_;
  std::string dataset_hash_;
  QaOptions opts_;
};

class QaProtocol : public PlannedProtocol<QaRun> {
 public:
  QaProtocol()
      : PlannedProtocol(
            "qa",
            "context then questions, greedy answers scored by the task metric and paired with "
            "the full cache's answers; query-agnostic (one compressed context, many questions) "
            "or query-aware",
            {string_param(
                 "source", "synthetic", {"synthetic", "recall", "longbench"},
                 "synthetic: RULER-style generated tasks; recall: story-recall questions on a "
                 "corpus (small models can do it); longbench: LongBench-format JSONL"),
             string_param("task", "niah_single_1", {}, "synthetic task name (source synthetic)"),
             int_param("length", 1024, 0, 1 << 24,
                       "target prompt tokens, question included (synthetic; at most the model's "
                       "context); longbench (required): the context's tokens at most, a longer "
                       "one middle-truncated to it as LongBench does; 0: not truncated. Either "
                       "way a prompt (context and question) longer than the model's context is "
                       "refused before the run"),
             int_param("num_samples", 4, 1, 1 << 20, "samples (per depth when depths are given)"),
             string_param("depths", "", {},
                          "comma-separated needle depths in [0, 1]; \"\": RULER's grid"),
             string_param("corpus", "", {},
                          "haystack corpus for synthetic tasks (\"\": the task default)"),
             string_param("dataset", "tinystories-valid-sample", {}, "corpus of the recall source"),
             int_param("questions", 2, 1, 64, "questions per story (recall)"),
             string_param("mode", "query_agnostic", {"query_agnostic", "query_aware"},
                          "compress the context before the question is seen, or with it"),
             string_param(
                 "chat_template", "auto", {"auto", "none", "chatml", "llama3", "mistral", "gemma"},
                 "wrap context + question in one user turn of an instruct model's template; auto: "
                 "the tokenizer's own (GGUF tokenizer.chat_template, tokenizer_config.json), else "
                 "none"),
             int_param("max_new_tokens", 0, 0, 1 << 16,
                       "answer length cap (0: the task's default)"),
             string_param("path", "", {}, "LongBench JSONL file (source longbench)"),
             string_param("tasks", "", {},
                          "LongBench per-task prompt/metric JSON (source longbench)"),
             bool_param("skip_bad_lines", false,
                        "longbench: skip (and count) malformed JSONL lines instead of failing on "
                        "the first"),
             int_param("prefill_chunk", 512, 1, 1 << 22, "tokens per prefill step")}) {
    info_.needs_tokenizer = true;
    ProtocolReport& r = info_.report;
    // The task score and the agreement with the full cache's answers are qa's own (not in the
    // table).
    r.sample_metrics = {{"accuracy", "fraction", Direction::kHigher, "", false},
                        {"agreement_with_full", "fraction", Direction::kHigher, "", false},
                        table_sample_metric("bytes_per_token"),
                        table_sample_metric("ttft_ms")};
    r.default_metric = "accuracy";
    // The query-time work beside accuracy (document reuse trades it), when every run recorded it.
    r.secondary_metrics = {"ttft_ms"};
    r.secondary_needs_all_runs = true;
    r.paired_in_sample = {
        {"accuracy", "full_accuracy"}};  // each item stores the full cache's score
  }

  // The parameters only one source reads: written for another source they are refused, and a
  // longbench config drops them (their defaults would only move its hash). Synthetic and recall
  // configs keep every default, so that the hashes of their stored runs stay valid.
  static const std::map<std::string, std::string>& source_only_params() {
    static const std::map<std::string, std::string> m = {
        {"task", "synthetic"},  {"depths", "synthetic"},        {"corpus", "synthetic"},
        {"dataset", "recall"},  {"questions", "recall"},        {"path", "longbench"},
        {"tasks", "longbench"}, {"skip_bad_lines", "longbench"}};
    return m;
  }

  // Whether `key` was written in a way this source refuses. Synthetic and recall configs keep every
  // default, so a stored run's config_json carries them and must resolve again to itself: those
  // sources accept another source's key at its default value. A longbench config drops them, so
  // it refuses them at any value.
  bool set_off_default(const nlohmann::json& given, const nlohmann::json& resolved,
                       const std::string& key) const {
    if (!given.contains(key)) return false;
    if (resolved.at("source") == "longbench") return true;
    for (const ParamSpec& p : info_.params)
      if (p.name == key) return resolved.at(key) != p.default_value;
    return true;
  }

  nlohmann::json finish_config(const nlohmann::json& given, nlohmann::json r) const override {
    const std::string src = r.at("source");
    for (const auto& [key, owner] : source_only_params())
      KVB_CHECK(owner == src || !set_off_default(given, r, key), "config.protocol.", key,
                ": applies to source '", owner, "' only, not to source '", src, "'");
    KVB_CHECK(src != "recall" || !set_off_default(given, r, "length"),
              "config.protocol.length: source 'recall' does not read it (a story sets its length)");
    if (src == "longbench") {
      // A silent default would middle-truncate every context to it.
      KVB_CHECK(given.contains("length"),
                "config.protocol.length: source 'longbench' needs it given: the context is "
                "middle-truncated to that many tokens, as LongBench does (0: not truncated)");
      for (const auto& [key, owner] : source_only_params())
        if (owner != src) r.erase(key);
    }
    return r;
  }

  int64_t expected_samples(const nlohmann::json& proto) const override {
    const int64_t n = proto.at("num_samples");
    if (proto.at("source") != "synthetic" || proto.at("depths").get<std::string>().empty())
      return n;
    const std::string depths = proto.at("depths");
    return n * static_cast<int64_t>(std::count(depths.begin(), depths.end(), ',') + 1);
  }

  // The data files a run reads, read once by the grid before its first run.
  void check_inputs(const nlohmann::json& proto, const std::string& data_dir,
                    const InputCheck& check) const override {
    const std::string src = proto.at("source");
    if (src == "longbench") {
      // Keyed by every setting the reading depends on (samples read, bad lines skipped).
      check("longbench:" + proto.dump(), [&] { check_longbench_inputs(proto); });
    } else if (src == "recall") {
      const std::string corpus = proto.at("dataset");
      check("corpus:" + corpus, [&] { load_corpus(corpus, resolve_data_dir(data_dir)); });
    }
  }

  // The length against the model's context, and a synthetic task's first sample generated with the
  // model's tokenizer (in memory): a length below the task's minimum fails here, before anything
  // runs. (The other samples differ in their random draws, not in the fixed text that sets the
  // minimum; a borderline length one of them misses still fails at its run's plan.)
  void check_model_inputs(const nlohmann::json& resolved, const ModelFacts& model,
                          const std::string& data_dir, const InputCheck& check) const override {
    const nlohmann::json& proto = resolved.at("protocol");
    check("qa length:" + model.spec + ":" + proto.dump(),
          [&] { check_qa_length(proto, model.context_tokens, model.spec); });
    if (proto.at("source") != "synthetic") {
      // The prompts as the run's plan reads them (the data files are small beside a run).
      // The seed picks a recall source's stories: part of what is checked.
      check("qa prompts:" + model.spec + ":" + resolved.at("seed").dump() + ":" + proto.dump(),
            [&] {
              if (model.tokenizer_path.empty() || model.context_tokens <= 0) return;
              const Tokenizer tok(model.tokenizer_path);
              nlohmann::json p = proto;
              p["seed"] = resolved.at("seed");
              std::string hash;
              const std::vector<QaSample> samples =
                  qa_samples(tok, p, data_dir, /*cache_dir=*/"", &hash);
              const ChatTemplate chat = resolve_chat_template(
                  proto.at("chat_template"), tok.chat_template(), "config.protocol.chat_template");
              check_prompts_fit(tok, samples, chat, model.add_bos, model.context_tokens, model.spec,
                                proto);
            });
      return;
    }
    nlohmann::json p = proto;
    p["seed"] = resolved.at("seed");
    p["num_samples"] = 1;
    const std::string depths = p.at("depths");
    p["depths"] = depths.substr(0, depths.find(','));
    check("qa task:" + model.tokenizer_path + ":" + p.dump(), [&] {
      KVB_CHECK(!model.tokenizer_path.empty(), model.spec, ": the qa protocol needs a tokenizer");
      const Tokenizer tok(model.tokenizer_path);
      std::string hash;
      qa_samples(tok, p, data_dir, /*cache_dir=*/"", &hash);
    });
  }

  // The task and length, recall:<corpus> or longbench:<file>.
  bool prompt_holds_question(const nlohmann::json& proto) const override {
    return proto.at("mode").get<std::string>() == "query_aware";
  }
  bool runs_context_pass(const nlohmann::json& proto) const override {
    return proto.at("mode").get<std::string>() == "query_agnostic";
  }
  bool hands_hindsight(const nlohmann::json& proto) const override {
    return runs_context_pass(proto);
  }
  std::string dataset_label(const nlohmann::json& proto) const override {
    const std::string src = proto.at("source");
    if (src == "synthetic")
      return proto.at("task").get<std::string>() + "@" +
             std::to_string(proto.at("length").get<int64_t>());
    if (src == "recall") return "recall:" + proto.at("dataset").get<std::string>();
    return "longbench:" + proto.at("path").get<std::string>();
  }

  void sample_sums(const nlohmann::json& j, const SampleSumSink& put) const override {
    double score = 0, full = 0, agree = 0, n = 0;
    if (j.contains("items") && j["items"].is_array())
      for (const auto& it : j["items"]) {
        score += sample_number(it, "score");
        full += sample_number(it, "full_score");
        agree += it.value("prediction", std::string()) ==
                 it.value("full_prediction", std::string("\x01"));
        n += 1;
      }
    put("accuracy", score, n);
    put("full_accuracy", full, n);
    put("agreement_with_full", agree, n);
    if (j.contains("timing") && j["timing"].is_object()) {  // rows stored before timings lack it
      const double c = sample_number(j["timing"], "context_s", -1),
                   q = sample_number(j["timing"], "question_s", -1);
      if (c >= 0 && q >= 0) put("ttft_ms", 1e3 * (c + q), 1);
    }
  }
};

}  // namespace
}  // namespace kvb

KVB_REGISTER_PROTOCOL(qa, kvb::QaProtocol);
