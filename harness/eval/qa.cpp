#include "harness/eval/qa.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>

#include "datasets/corpus.h"
#include "datasets/recall_task.h"
#include "datasets/synthetic_tasks.h"
#include "harness/common/atomic_file.h"
#include "harness/common/error.h"
#include "harness/common/fast_hash.h"
#include "harness/common/internal_error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/params.h"
#include "harness/common/sha256.h"
#include "harness/common/strings.h"
#include "harness/engine/engine.h"
#include "harness/engine/prefill_replay.h"
#include "harness/eval/documents.h"
#include "harness/eval/shared_prefill.h"
#include "harness/formats/longbench_jsonl.h"
#include "harness/formats/tokenizer.h"
#include "harness/kv/baseline_method.h"
#include "harness/kv/context_pass.h"
#include "harness/kv/document_reuse.h"
#include "harness/kv/hindsight.h"
#include "harness/kv/method_registry.h"
#include "harness/kv/question_aware.h"
#include "harness/metrics/text_metrics.h"

namespace kvb {

namespace {

std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Greedy continuation of `seq` from `logits` ([1, vocab]); stops at EOS/BOS, max tokens, or a stop
// string. Returns the prediction text cut before the first stop string.
std::string greedy_answer(Engine& e, const Tokenizer& tok, int64_t seq, at::Tensor logits,
                          int64_t max_new, const std::vector<std::string>& stop) {
  const auto& c = e.model().config;
  std::vector<int64_t> out;
  std::string text;
  for (int64_t i = 0; i < max_new; ++i) {
    const int64_t t = logits.to(at::kCPU)[0].argmax().item<int64_t>();
    if (t == c.bos_id || std::find(c.eos_ids.begin(), c.eos_ids.end(), t) != c.eos_ids.end()) break;
    out.push_back(t);
    text = tok.decode(out);
    bool stopped = false;
    for (const auto& s : stop) {
      const size_t at = s.empty() ? std::string::npos : text.find(s);
      if (at != std::string::npos) {
        text = text.substr(0, at);
        stopped = true;
      }
    }
    if (stopped) return text;
    if (i + 1 < max_new) logits = e.decode({seq}, {t});
  }
  return text;
}

// How the context got into the store, for the sample's record, and the time a replay does not
// spend itself: the recorded prefill's model work, which the method's own prefill would have done.
struct ContextPrefill {
  int64_t seq = -1;
  std::string path;  // "shared": replayed; "recorded": prefilled and recorded; "own": prefilled
  std::string why;   // why an own prefill (empty when sharing is off)
  double replay_s = 0;  // the replay's own time (the store's attend calls)
  double model_s = 0;   // the recorded prefill's time outside the full cache's attend calls
};

struct Answers {
  ContextPrefill prefill;
  std::vector<std::string> predictions;
  LedgerEntry ledger;
  int64_t context_tokens = 0;
  QaTiming timing;
  std::map<std::string, double> counters;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The context a sample's questions follow: [BOS] [chat: system turn + user-turn opener] context,
// the context middle-truncated to the sample's cap.
struct ContextPrompt {
  std::vector<int64_t> ids;
  int64_t body_tokens = 0;  // of them, the context's own
};

ContextPrompt context_prompt(const Model& model, const Tokenizer& tok, const QaSample& s,
                             const QaOptions& opts) {
  ContextPrompt p;
  if (opts.chat.active() ? opts.chat.bos : model.config.add_bos) p.ids.push_back(model.config.bos_id);
  const std::vector<int64_t> open = encode_segments(tok, opts.chat.user_open());
  p.ids.insert(p.ids.end(), open.begin(), open.end());
  std::vector<int64_t> body = tok.encode(s.context);
  const int64_t room = s.max_context_tokens - static_cast<int64_t>(p.ids.size());
  if (s.max_context_tokens > 0 && static_cast<int64_t>(body.size()) > room) {
    KVB_CHECK(room > 0, "qa: max context ", s.max_context_tokens, " tokens leaves no room after the ",
              p.ids.size(), " tokens of BOS and chat template");
    body = truncate_middle(body, static_cast<size_t>(room));
  }
  p.ids.insert(p.ids.end(), body.begin(), body.end());
  p.body_tokens = static_cast<int64_t>(body.size());
  return p;
}

bool is_baseline(const std::string& method, const nlohmann::json& params) {
  return method == baseline_method() && params.empty();
}

// The full cache's store for `prompt`, recording its context prefill for the process's other runs
// (shared_prefill.h) when sharing is on, the prefill is not held yet and there is room for it.
std::unique_ptr<KvCache> maybe_recording(std::unique_ptr<KvCache> store, const Model& model,
                                         const std::vector<int64_t>& prompt, const QaOptions& opts,
                                         RecordingKvCache** recorder) {
  *recorder = nullptr;
  const SharedPrefills& shared = SharedPrefills::instance();
  if (!opts.share_prefill || opts.mode != "query_agnostic" ||
      shared.find(shared_prefill_key(model, opts.prefill_chunk, prompt)) ||
      !shared.has_room(recording_bytes_estimate(model, static_cast<int64_t>(prompt.size()))))
    return store;
  auto r = std::make_unique<RecordingKvCache>(std::move(store));
  *recorder = r.get();
  return r;
}

// Stores (method and parameters) that did not reproduce a recorded prefill in this process, with
// why: their later samples prefill at once instead of trying again. Trying again could only find
// more sharing, never another answer.
std::mutex unshared_mu;
std::map<std::string, std::string> unshared;

std::string unshared_reason(const std::string& store_key) {
  std::lock_guard<std::mutex> lock(unshared_mu);
  auto it = unshared.find(store_key);
  return it == unshared.end() ? "" : "did not reproduce an earlier prefill: " + it->second;
}

// The engine a sample runs on. When sharing is on and the process holds the full cache's prefill
// of the context, the context is replayed into the method's store (c->path "shared", c->seq its
// sequence); a store that does not reproduce it is dropped for a fresh one (c->why says where it
// differed), so nothing of the attempt reaches the sample. The full cache records the prefill
// when it can (*recorder).
std::unique_ptr<Engine> sample_engine(std::shared_ptr<Model> model, const std::string& method,
                                      const nlohmann::json& params, const EngineOptions& eo,
                                      const std::vector<int64_t>& ids, const QaOptions& opts,
                                      RecordingKvCache** recorder, ContextPrefill* c) {
  CacheContext ctx{model->config, model->device, model->dtype, model};
  auto make = [&] { return MethodRegistry::instance().create(method, ctx, params); };
  *recorder = nullptr;
  c->path = "own";
  if (!opts.share_prefill) return std::make_unique<Engine>(model, make(), eo);
  if (opts.mode != "query_agnostic") {
    c->why = "query-aware: each context is prefilled with its question";
    return std::make_unique<Engine>(model, make(), eo);
  }
  std::unique_ptr<KvCache> store = make();
  if (is_baseline(method, params)) store = maybe_recording(std::move(store), *model, ids, opts, recorder);
  auto e = std::make_unique<Engine>(model, std::move(store), eo);
  if (*recorder) return e;
  const std::string store_key = model->content_hash() + "|" + std::to_string(opts.prefill_chunk) +
                                "|" + method + params.dump();
  std::shared_ptr<const PrefillRecording> rec =
      SharedPrefills::instance().find(shared_prefill_key(*model, opts.prefill_chunk, ids));
  c->why = document_reuse_of(e->kv()) ? "document reuse prefills each document alone"
           : !rec                     ? "no recording of this context"
                                      : unshared_reason(store_key);
  if (!c->why.empty()) return e;
  const auto t0 = std::chrono::steady_clock::now();
  ReplayResult r = replay_prefill(*e, *rec);
  if (r.seq < 0) {
    c->why = r.mismatch;
    std::lock_guard<std::mutex> lock(unshared_mu);
    unshared.emplace(store_key, r.mismatch);
    return std::make_unique<Engine>(model, make(), eo);
  }
  c->seq = r.seq;
  c->path = "shared";
  c->replay_s = seconds_since(t0);
  c->model_s = rec->model_s;
  return e;
}

// Prefills the context into a new sequence of e's store, without the end-of-prefill compression,
// recording it with `recorder` when given; *record_s: the time the recording itself took (copies
// and hashes), which is no part of the full cache's own prefill.
int64_t prefill_context(Engine& e, const std::vector<int64_t>& ids, const QaOptions& opts,
                        RecordingKvCache* recorder, double* record_s = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  if (recorder) recorder->start();
  const int64_t seq = e.new_sequence();
  at::Tensor logits = e.prefill({seq}, {ids}, nullptr, /*call_end_prefill=*/false);
  if (recorder) {
    std::shared_ptr<PrefillRecording> rec = recorder->finish(logits, seconds_since(t0));
    if (record_s) *record_s = rec->record_s;
    SharedPrefills::instance().put(shared_prefill_key(e.model(), opts.prefill_chunk, ids), std::move(rec));
  }
  return seq;
}

// full: the full cache's answers, handed to an oracle store that compresses with hindsight of them
// (HindsightCache); null for every other method.
Answers answer_all(std::shared_ptr<Model> model, const Tokenizer& tok, const std::string& method,
                   const nlohmann::json& params, const QaSample& s, const QaOptions& opts,
                   const std::vector<std::string>* full = nullptr) {
  EngineOptions eo;
  eo.prefill_chunk = opts.prefill_chunk;
  eo.prefill_progress = prefill_progress_lines(opts.progress);
  const ContextPrompt prompt = context_prompt(*model, tok, s, opts);
  const std::vector<int64_t>& ctx_ids = prompt.ids;
  Answers a;
  RecordingKvCache* recorder = nullptr;
  std::unique_ptr<Engine> engine =
      sample_engine(model, method, params, eo, ctx_ids, opts, &recorder, &a.prefill);
  Engine& e = *engine;
  const std::vector<int64_t> close = encode_segments(tok, opts.chat.user_close());
  auto question_ids = [&](const std::string& q) { return concat(tok.encode(q), close); };
  a.context_tokens = static_cast<int64_t>(ctx_ids.size());
  // The full cache of `n` tokens (a model's window layers hold only their window, in it too).
  const int64_t elem = dtype_bytes(model->dtype);
  auto full_bytes = [&](int64_t n) { return model->config.full_kv_bytes(n, elem); };
  const DocumentReuse* reuse = document_reuse_of(e.kv());
  if (opts.mode == "query_agnostic" || reuse) {
    // With document reuse the documents never see the question, so both modes take this route.
    int64_t seq = 0;
    if (reuse) {
      const DocumentPrefill d = prefill_documents(e, *reuse, ctx_ids, tok);
      seq = d.seq;
      a.timing.documents = d.documents;
      a.timing.document_prefill_s = d.document_prefill_s;
      a.timing.context_s = d.splice_s;
    } else {
      auto t0 = std::chrono::steady_clock::now();
      double record_s = 0;
      seq = a.prefill.seq >= 0 ? a.prefill.seq : prefill_context(e, ctx_ids, opts, recorder, &record_s);
      if (recorder) a.prefill.path = "recorded";
      a.timing.prefill_tokens = a.context_tokens;
      if (auto* pass_cache = dynamic_cast<ContextPassCache*>(&e.kv())) {
        // The method's own pass over the context (KVzip's reconstruction) runs before the
        // context is compressed; its tokens and time are the context prefill's.
        ContextPass pass;
        pass.engine = &e;
        pass.seq = seq;
        pass.context = ctx_ids;
        pass.prefix_tokens = static_cast<int64_t>(ctx_ids.size()) - prompt.body_tokens;
        pass.turn_close = opts.chat.active() ? close : tok.encode("\n");
        pass.encode = [&tok](const std::string& text) { return tok.encode(text); };
        a.timing.prefill_tokens += pass_cache->run_context_pass(pass);
      } else if (auto* oracle = dynamic_cast<HindsightCache*>(&e.kv())) {
        // An oracle compresses the context knowing every question and the full cache's answer to
        // it; its pass is no work a deployment does, so it is not counted as prefill.
        KVB_ASSERT(full && full->size() == s.items.size(), "qa",
                   "an oracle store needs the full cache's answers first");
        HindsightPass pass;
        pass.engine = &e;
        pass.seq = seq;
        for (size_t i = 0; i < s.items.size(); ++i) {
          std::vector<int64_t> c = question_ids(s.items[i].question);
          pass.question_tokens.push_back(static_cast<int64_t>(c.size()));
          const std::vector<int64_t> answer = tok.encode((*full)[i]);
          c.insert(c.end(), answer.begin(), answer.end());
          pass.continuations.push_back(std::move(c));
        }
        oracle->run_hindsight_pass(pass);
      }
      e.kv().end_prefill(seq);  // the method compresses the context here
      // A replayed prefill: the store's own attend calls and compression, and the model's work
      // it shared (what the method's own prefill would have spent).
      a.timing.context_s = seconds_since(t0) - record_s + a.prefill.replay_s + a.prefill.model_s;
    }
    a.ledger.fp = e.kv().footprint();
    a.ledger.tokens_seen = a.context_tokens;
    a.ledger.baseline_bytes = full_bytes(a.context_tokens);
    for (const auto& item : s.items) {
      const auto q = question_ids(item.question);
      auto t0 = std::chrono::steady_clock::now();
      const int64_t f = e.fork(seq);
      at::Tensor logits = e.prefill({f}, {q}, nullptr, /*call_end_prefill=*/false);
      if (a.predictions.empty()) {
        a.timing.question_s = seconds_since(t0);
        a.timing.prefill_tokens += static_cast<int64_t>(q.size());
      }
      a.predictions.push_back(greedy_answer(e, tok, f, logits, s.max_new_tokens, s.stop));
      e.release(f);
    }
  } else {
    for (const auto& item : s.items) {
      const int64_t seq = e.new_sequence();
      const auto q = question_ids(item.question);
      const auto ids = concat(ctx_ids, q);
      if (auto* aware = dynamic_cast<QuestionAwareCache*>(&e.kv()))
        aware->set_question_tokens(seq, static_cast<int64_t>(q.size()));
      auto t0 = std::chrono::steady_clock::now();
      at::Tensor logits = e.prefill({seq}, {ids});
      if (a.predictions.empty()) {
        a.timing.context_s = 0;  // the context is prefilled with the question
        a.timing.question_s = seconds_since(t0);
        a.timing.prefill_tokens = static_cast<int64_t>(ids.size());
        a.ledger.fp = e.kv().footprint();
        a.ledger.tokens_seen = static_cast<int64_t>(ids.size());
        a.ledger.baseline_bytes = full_bytes(a.ledger.tokens_seen);
      }
      a.predictions.push_back(greedy_answer(e, tok, seq, logits, s.max_new_tokens, s.stop));
      e.release(seq);
    }
  }
  a.counters = e.kv().counters();
  a.ledger.baseline_bytes_16bit = model->config.full_kv_bytes(a.ledger.tokens_seen, 2);
  return a;
}

// The identity of the tokenizer `tok` (it decides the prompt's ids and the answers' text): the
// model's own file's hash, remembered with the model, else its file's.
std::string tokenizer_identity(const Model& model, const Tokenizer& tok) {
  if (tok.path() == model.tokenizer_path) return model.tokenizer_hash();
  return file_exists(tok.path()) ? fast_hash_file_hex(tok.path()) : "";
}

// Where the full-cache answers of a sample live in the baseline cache ("" when there is none):
// keyed by everything that decides them (the model's content, device, dtype, the tokenizer's
// content, mode, chunking, the sample, the decoding limits, the chat template), not by the method
// being compared nor by where the model's files are.
std::string baseline_path(const Model& model, const Tokenizer& tok, const QaSample& s,
                          const QaOptions& opts) {
  if (opts.cache_dir.empty()) return "";
  nlohmann::json key = {{"v", 2},
                        {"model", model.config.to_json()},
                        {"content", model.content_hash()},
                        {"tokenizer", tokenizer_identity(model, tok)},
                        {"device", model.device.str()},
                        {"dtype", dtype_name(model.dtype)},
                        {"mode", opts.mode},
                        {"chunk", opts.prefill_chunk},
                        {"sample", s.key},
                        {"max_new", s.max_new_tokens},
                        {"stop", s.stop},
                        {"max_ctx", s.max_context_tokens}};
  if (opts.chat.active()) key["chat"] = opts.chat.describe();
  return opts.cache_dir + "/qa-" + sha256_hex(key.dump()) + ".json";
}

// An entry is {"answers": [...], "check": FastHash of the answers' JSON}, so a file that was cut
// short or changed is told from a valid one.
std::string answers_check(const nlohmann::json& answers) { return fast_hash_hex(answers.dump()); }

void store_baseline(const std::string& path, const std::string& dir,
                    const std::vector<std::string>& predictions) {
  if (path.empty()) return;
  const nlohmann::json answers = predictions;
  make_directories(dir);
  write_file_atomically(
      path, nlohmann::json{{"answers", answers}, {"check", answers_check(answers)}}.dump());
}

// The entry's answers, or nothing when it is missing or fails its check (it is then recomputed and
// replaced).
std::optional<std::vector<std::string>> read_baseline(const std::string& path) {
  if (path.empty() || !file_exists(path)) return std::nullopt;
  try {
    const nlohmann::json j = parse_json(read_text_file(path), path);
    const nlohmann::json& answers = j.at("answers");
    if (j.at("check").get<std::string>() != answers_check(answers)) return std::nullopt;
    return answers.get<std::vector<std::string>>();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The full-cache answers a method's answers are paired with: from the baseline cache when a `full`
// run (or an earlier method's run) has put them there, else computed once and stored.
std::vector<std::string> full_answers(std::shared_ptr<Model> model, const Tokenizer& tok,
                                      const QaSample& s, const QaOptions& opts) {
  const std::string path = baseline_path(*model, tok, s, opts);
  if (auto cached = read_baseline(path)) return std::move(*cached);
  auto a = answer_all(model, tok, baseline_method(), nlohmann::json::object(), s, opts);
  store_baseline(path, opts.cache_dir, a.predictions);
  return a.predictions;
}

// Records the full cache's prefill of the sample's context for the process's runs (a prefill and
// nothing else) unless it is held or there is no room: a grid's first method whose full-cache
// answers came from the baseline cache pays it, the others replay it.
void record_context(std::shared_ptr<Model> model, const Tokenizer& tok, const QaSample& s,
                    const QaOptions& opts) {
  const ContextPrompt prompt = context_prompt(*model, tok, s, opts);
  RecordingKvCache* recorder = nullptr;
  CacheContext ctx{model->config, model->device, model->dtype, model};
  std::unique_ptr<KvCache> store = maybe_recording(
      MethodRegistry::instance().create(baseline_method(), ctx, nlohmann::json::object()), *model,
      prompt.ids, opts, &recorder);
  if (!recorder) return;
  EngineOptions eo;
  eo.prefill_chunk = opts.prefill_chunk;
  Engine e(model, std::move(store), eo);
  prefill_context(e, prompt.ids, opts, recorder);
}

// A baseline (`full`) run's answers are the baseline itself: they fill the cache for the methods
// compared with them, and check it. An entry that differs from them is wrong (decoding is
// deterministic), so it is named on stderr and replaced.
void check_baseline(const Model& model, const Tokenizer& tok, const QaSample& s,
                    const QaOptions& opts, const std::vector<std::string>& own) {
  const std::string path = baseline_path(model, tok, s, opts);
  if (path.empty()) return;
  const auto cached = read_baseline(path);
  if (cached && *cached == own) return;
  if (cached)
    std::cerr << "kvbench: warning: baseline cache entry " << path
              << " differs from the full cache's own answers; replaced with them\n";
  store_baseline(path, opts.cache_dir, own);
}

// The samples of a LongBench-format JSONL file with its task settings (the first num_samples
// lines).
std::vector<QaSample> longbench_samples(const nlohmann::json& p, std::string* dataset_hash) {
  std::vector<QaSample> out;
  const std::string file = p["path"], tasks_file = p["tasks"];
  KVB_CHECK(
      !file.empty() && !tasks_file.empty(),
      "config.protocol: source 'longbench' needs 'path' (JSONL) and 'tasks' (task config JSON)");
  JsonlOptions jo;
  jo.skip_bad_lines = p["skip_bad_lines"].get<bool>();
  auto lb = read_longbench_jsonl(file, jo);
  auto tasks = load_longbench_tasks(tasks_file);
  std::string h;
  for (const auto& x : lb.samples) {
    if (static_cast<int64_t>(out.size()) >= p["num_samples"].get<int64_t>()) break;
    auto it = tasks.find(x.dataset);
    KVB_CHECK(it != tasks.end(), file, ":", x.line, ": no task config for dataset '", x.dataset,
              "' in ", tasks_file);
    const LongBenchTask& t = it->second;
    // Query-agnostic needs the prompt split where the context ends: everything through {context}
    // is the context part, the rest (with {input}) is the question.
    const std::string& tmpl = t.prompt;
    const size_t at = tmpl.find("{context}");
    QaSample s;
    s.context = format_longbench_prompt(tmpl.substr(0, at + 9), x.context, x.input);
    QaItem item;
    item.question = format_longbench_prompt(tmpl.substr(at + 9), "", x.input);
    item.answers = x.answers;
    item.metric = t.metric;
    if (x.all_classes) item.all_classes = *x.all_classes;
    s.items.push_back(item);
    s.max_new_tokens = p["max_new_tokens"].get<int64_t>() > 0 ? p["max_new_tokens"].get<int64_t>()
                                                              : t.max_new_tokens;
    s.max_context_tokens = p["length"];
    s.stop = t.first_line_only ? std::vector<std::string>{"\n"} : std::vector<std::string>{};
    s.stop.insert(s.stop.end(), t.stop.begin(), t.stop.end());
    s.key = sha256_hex(s.context + "\x1f" + item.question);
    h += s.key;
    s.meta = {{"task", x.dataset},
              {"id", x.id},
              {"line", x.line},
              {"jsonl_bad_lines_skipped", lb.stats.bad_lines}};
    out.push_back(std::move(s));
  }
  *dataset_hash = sha256_hex(h);
  return out;
}

}  // namespace

void check_qa_length(const nlohmann::json& p, int64_t context_tokens, const std::string& model) {
  if (context_tokens <= 0) return;
  const std::string source = p.at("source");
  const int64_t length = p.at("length");
  if (source == "synthetic")
    KVB_CHECK(length <= context_tokens, "config.protocol.length: ", length,
              " tokens (the prompt, question included) is longer than the context of ", model, " (",
              context_tokens, " tokens)");
  else if (source == "longbench")
    KVB_CHECK(length <= context_tokens, "config.protocol.length: a context cap of ", length,
              " tokens is longer than the context of ", model, " (", context_tokens,
              " tokens); give at most ", context_tokens);
}

void check_longbench_inputs(const nlohmann::json& protocol) {
  std::string hash;
  KVB_CHECK(!longbench_samples(protocol, &hash).empty(), protocol.at("path").get<std::string>(),
            ": the qa source 'longbench' yields no samples from it");
}

QaSampleResult run_qa_sample(std::shared_ptr<Model> model, const Tokenizer& tok,
                             const std::string& method, const nlohmann::json& method_params,
                             const QaSample& s, const QaOptions& opts) {
  KVB_CHECK(opts.mode == "query_agnostic" || opts.mode == "query_aware", "qa: unknown mode '",
            opts.mode, "'");
  QaSampleResult r;
  auto t0 = std::chrono::steady_clock::now();
  // An oracle with hindsight compresses knowing the full cache's answers: they come first. So they
  // do where the context prefill is shared: computing them records the prefill the method replays.
  const bool hindsight = MethodRegistry::instance().has(method) &&
                         MethodRegistry::instance().info(method).caps.needs_hindsight;
  const bool is_full = is_baseline(method, method_params);
  const bool share = opts.share_prefill && !is_full && opts.mode == "query_agnostic";
  std::vector<std::string> full;
  double full_s = 0;
  if (hindsight || share) {
    full = full_answers(model, tok, s, opts);
    if (share && opts.record_eagerly) record_context(model, tok, s, opts);
    full_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
  }
  Answers mine =
      answer_all(model, tok, method, method_params, s, opts, hindsight ? &full : nullptr);
  mine.timing.answer_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  // A baseline (`full`) run is its own baseline, and leaves its answers in the baseline cache for the
  // methods compared with it (a grid's full-cache run is never repeated for them).
  if (is_full) check_baseline(*model, tok, s, opts, mine.predictions);
  if (!hindsight && !share) {
    full = is_full ? mine.predictions : full_answers(model, tok, s, opts);
    full_s = is_full ? 0.0 : seconds_since(t0);
  }
  mine.timing.full_answer_s = full_s;
  r.context_tokens = mine.context_tokens;
  r.ledger = mine.ledger;
  r.timing = mine.timing;
  r.counters = mine.counters;
  r.prefill_path = mine.prefill.path;
  r.prefill_why = mine.prefill.why;
  r.prefill_replay_s = mine.prefill.replay_s;
  r.prefill_shared_model_s = mine.prefill.model_s;
  for (size_t i = 0; i < s.items.size(); ++i) {
    const QaItem& it = s.items[i];
    QaItemResult x;
    x.prediction = mine.predictions[i];
    x.full_prediction = full[i];
    x.score = score_answer(it.metric, x.prediction, it.answers, it.all_classes);
    x.full_score = score_answer(it.metric, x.full_prediction, it.answers, it.all_classes);
    x.answers = it.answers;
    r.items.push_back(x);
  }
  return r;
}

nlohmann::json QaSampleResult::to_json() const {
  nlohmann::json items_j = nlohmann::json::array();
  for (const auto& i : items)
    items_j.push_back({{"prediction", i.prediction},
                       {"full_prediction", i.full_prediction},
                       {"score", i.score},
                       {"full_score", i.full_score},
                       {"answers", i.answers}});
  return {{"items", items_j},
          {"context_tokens", context_tokens},
          {"counters", counters},
          {"timing",
           {{"context_s", timing.context_s},
            {"question_s", timing.question_s},
            {"prefill_tokens", timing.prefill_tokens},
            {"documents", timing.documents},
            {"document_prefill_s", timing.document_prefill_s},
            {"answer_s", timing.answer_s},
            {"full_answer_s", timing.full_answer_s}}},
          {"ledger", ledger_to_json(ledger)},
          {"prefill",
           {{"path", prefill_path},
            {"why", prefill_why},
            {"replay_s", prefill_replay_s},
            {"shared_model_s", prefill_shared_model_s}}}};
}

QaSampleResult QaSampleResult::from_json(const nlohmann::json& j) {
  QaSampleResult r;
  for (const auto& i : j.at("items")) {
    QaItemResult x{i.at("prediction"), i.at("full_prediction"), i.at("score"), i.at("full_score"), {}};
    if (i.contains("answers")) x.answers = i.at("answers").get<std::vector<std::string>>();  // older rows lack it
    r.items.push_back(std::move(x));
  }
  r.context_tokens = j.at("context_tokens");
  r.counters = j.value("counters", std::map<std::string, double>{});
  if (j.contains("timing")) {  // rows stored before timings were recorded lack it
    const auto& t = j.at("timing");
    r.timing = {t.at("context_s"), t.at("question_s"), t.at("prefill_tokens"), t.at("documents"),
                t.at("document_prefill_s"), t.value("answer_s", -1.0), t.value("full_answer_s", -1.0)};
  }
  r.ledger = ledger_from_json(j.at("ledger"));
  if (j.contains("prefill") && j.at("prefill").is_object()) {  // rows stored before it lack it
    r.prefill_path = j.at("prefill").value("path", std::string());
    r.prefill_why = j.at("prefill").value("why", std::string());
    r.prefill_replay_s = j.at("prefill").value("replay_s", 0.0);
    r.prefill_shared_model_s = j.at("prefill").value("shared_model_s", 0.0);
  }
  return r;
}

std::vector<Metric> qa_metrics(const std::vector<QaSampleResult>& samples, bool declared_simulated) {
  using D = Direction;
  double score = 0, full = 0, agree = 0;
  int64_t n = 0;
  std::vector<LedgerEntry> ledger;
  for (const auto& s : samples) {
    for (const auto& i : s.items) {
      score += i.score;
      full += i.full_score;
      agree += i.prediction == i.full_prediction;
      ++n;
    }
    ledger.push_back(s.ledger);
  }
  if (n == 0) return {};
  std::vector<Metric> m = {{"accuracy", score / n, "", D::kHigher},
                           {"full_accuracy", full / n, "", D::kHigher},
                           {"agreement_with_full", agree / n, "", D::kHigher},
                           {"questions", static_cast<double>(n), "", D::kNone}};
  for (auto& x : m) x.n = n;
  double ttft = 0, tokens = 0, docs = 0, doc_s = 0, answer = 0, full_answer = 0;
  int64_t timed = 0, answer_timed = 0;
  for (const auto& s : samples) {
    if (s.timing.context_s < 0 || s.timing.question_s < 0) continue;
    ttft += s.timing.context_s + s.timing.question_s;
    tokens += static_cast<double>(s.timing.prefill_tokens);
    docs += static_cast<double>(s.timing.documents);
    doc_s += s.timing.document_prefill_s;
    ++timed;
    if (s.timing.answer_s >= 0 && s.timing.full_answer_s >= 0) {
      answer += s.timing.answer_s;
      full_answer += s.timing.full_answer_s;
      ++answer_timed;
    }
  }
  if (timed > 0) {
    const double k = 1.0 / static_cast<double>(timed);
    std::vector<Metric> t = {{"ttft_ms", 1e3 * ttft * k, "ms", D::kLower},
                             {"query_prefill_tokens", tokens * k, "", D::kLower}};
    if (docs > 0) {
      t.push_back({"documents", docs * k, "", D::kNone});
      t.push_back({"document_prefill_ms", 1e3 * doc_s * k, "ms", D::kNone});
    }
    for (auto& x : t) x.n = timed;
    m.insert(m.end(), t.begin(), t.end());
  }
  if (answer_timed > 0) {
    // Per sample: the method's own work, and the full-cache answers it was paired with when they had
    // to be computed (0 when the baseline cache held them).
    const double k = 1e3 / static_cast<double>(answer_timed);
    std::vector<Metric> t = {{"sample_ms", answer * k, "ms", D::kLower},
                             {"full_answer_ms", full_answer * k, "ms", D::kNone}};
    for (auto& x : t) x.n = answer_timed;
    m.insert(m.end(), t.begin(), t.end());
  }
  auto l = ledger_metrics(ledger, declared_simulated);
  m.insert(m.end(), l.begin(), l.end());
  return m;
}

std::vector<QaSample> qa_samples(const Tokenizer& tok, const nlohmann::json& p,
                                 const std::string& data_dir, const std::string& cache_dir,
                                 std::string* dataset_hash) {
  const std::string source = p["source"];
  std::vector<QaSample> out;
  if (source == "recall") {
    auto corpus = load_corpus(p["dataset"].get<std::string>(), resolve_data_dir(data_dir));
    auto rs = make_recall_samples(corpus->text, p["num_samples"], p["questions"], 6, p["seed"].get<int64_t>());
    std::string h;
    for (const auto& r : rs) {
      QaSample s;
      s.key = r.hash;
      h += r.hash;
      s.context = r.context;
      for (const auto& q : r.questions) s.items.push_back({q.question, {q.answer}, "exact_match", {}});
      s.max_new_tokens = p["max_new_tokens"].get<int64_t>() > 0 ? p["max_new_tokens"].get<int64_t>() : 4;
      // The answer is one word: stop at the first separator after it.
      s.stop = {" ", ".", ",", "!", "?", "\n"};
      s.meta = {{"task", "recall"}, {"story", r.index}};
      out.push_back(std::move(s));
    }
    *dataset_hash = sha256_hex(h);
  } else if (source == "synthetic") {
    TaskSpec spec;
    spec.task = p["task"];
    spec.target_tokens = p["length"];
    spec.num_samples = p["num_samples"];
    spec.seed = p["seed"].get<uint64_t>();
    const std::string depths = p["depths"];
    if (!depths.empty())
      spec.depths = parse_float_list(depths, "config.protocol.depths", "depth", 0, 1);
    spec.corpus = p["corpus"];
    spec.data_dir = data_dir.empty() ? "" : resolve_data_dir(data_dir);
    SampleSet set = cache_dir.empty() ? generate_task(tok, spec) : generate_task_cached(tok, spec, cache_dir + "/tasks");
    *dataset_hash = set.hash;
    for (const auto& t : set.samples) {
      QaSample s;
      s.key = t.hash;
      s.context = t.context_prompt();
      s.items.push_back({t.query_prompt(), t.answers, t.metric, {}});
      s.max_new_tokens = p["max_new_tokens"].get<int64_t>() > 0 ? p["max_new_tokens"].get<int64_t>() : t.max_new_tokens;
      if (!t.multiline_answer) s.stop = {"\n"};
      s.meta = {{"task", t.task}, {"target_tokens", t.target_tokens}, {"actual_tokens", t.actual_tokens}};
      if (t.depth) s.meta["depth"] = *t.depth;
      out.push_back(std::move(s));
    }
  } else if (source == "longbench") {
    out = longbench_samples(p, dataset_hash);
  } else {
    KVB_FAIL("config.protocol.source: unknown source '", source, "'");
  }
  return out;
}

}  // namespace kvb
