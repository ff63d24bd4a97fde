#include "methods/kv_packet/packet_train.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h since LibTorch 2)

#include <algorithm>
#include <random>

#include "datasets/corpus.h"
#include "datasets/synthetic_tasks.h"
#include "harness/common/error.h"
#include "harness/engine/engine.h"
#include "harness/eval/documents.h"
#include "harness/formats/tokenizer.h"
#include "harness/metrics/portable_random.h"
#include "harness/metrics/text_metrics.h"
#include "harness/model/model.h"
#include "harness/train/adapter_adam.h"
#include "harness/train/trainer.h"
#include "methods/common/adapter_training.h"
#include "methods/kv_packet/packet_adapter.h"

namespace kvb::kv_packet {

namespace {

struct Sample {
  std::vector<std::vector<int64_t>> docs;  // the context after the BOS, cut into documents
  std::vector<int64_t> query;              // question + answer prefix, then answer[:-1]
  int64_t answer_len = 0;
  at::Tensor teacher_logp;  // [answer_len, vocab] fp32
};

// The teacher's greedy answer to [BOS, context, question] with the full cache, its stop token (EOS
// or a newline) included, and its log-probs at every answer position.
std::vector<int64_t> teacher_answer(const std::shared_ptr<Model>& model, const Tokenizer& tok,
                                    const std::vector<int64_t>& prompt, int64_t max_new,
                                    at::Tensor* logp) {
  Engine e(model, make_default_kv(*model));
  const int64_t seq = e.new_sequence();
  at::Tensor logits = e.prefill({seq}, {prompt});
  const auto& c = model->config;
  std::vector<int64_t> out;
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < max_new; ++i) {
    at::Tensor row = logits.to(at::kCPU)[0];
    rows.push_back(at::log_softmax(row, -1));
    const int64_t t = row.argmax().item<int64_t>();
    out.push_back(t);
    const bool stop = t == c.bos_id ||
                      std::find(c.eos_ids.begin(), c.eos_ids.end(), t) != c.eos_ids.end() ||
                      tok.piece(t) == "<0x0A>";
    if (stop || i + 1 == max_new) break;
    logits = e.decode({seq}, {t});
  }
  *logp = at::stack(rows);
  return out;
}

}  // namespace

at::Tensor student_query_logits(const TrainWeights& w, const ModelConfig& c,
                                const at::Tensor& header, const at::Tensor& trailer,
                                const std::vector<std::vector<int64_t>>& docs,
                                const std::vector<int64_t>& query, const at::Tensor& rope_cos,
                                const at::Tensor& rope_sin) {
  const at::Tensor& emb = w.at("embed");
  auto embed = [&](const std::vector<int64_t>& ids) {
    return emb.index_select(0, at::tensor(ids, at::kLong).to(emb.device()));
  };
  // Rows and their segments: 0 the BOS, d + 1 document d (with its header and trailer), -1 the
  // query (it sees everything).
  std::vector<at::Tensor> rows = {embed({c.bos_id})};
  std::vector<int64_t> seg = {0};
  const int64_t wrap = header.size(0) + trailer.size(0);
  for (size_t d = 0; d < docs.size(); ++d) {
    rows.push_back(header);
    rows.push_back(embed(docs[d]));
    rows.push_back(trailer);
    seg.insert(seg.end(), docs[d].size() + wrap, static_cast<int64_t>(d) + 1);
  }
  rows.push_back(embed(query));
  seg.insert(seg.end(), query.size(), -1);
  const int64_t T = static_cast<int64_t>(seg.size());
  at::Tensor x = at::cat(rows, 0).unsqueeze(0);  // [1, T, D]
  at::Tensor sg = at::tensor(seg, at::kLong);
  at::Tensor allowed = sg.unsqueeze(1).eq(sg.unsqueeze(0)).logical_or(sg.unsqueeze(1).eq(-1));
  at::Tensor mask = at::zeros({T, T})
                        .masked_fill(allowed.logical_not(), -1e9)
                        .to(emb.device())
                        .view({1, 1, T, T})
                        .expand({1, c.n_kv_heads, T, T});
  AttentionBiasFn bias = [&](int64_t, const at::Tensor&) { return mask; };
  at::Tensor logits = train_forward_embeds(w, c, x, rope_cos, rope_sin, at::kFloat, bias)[0];
  return logits.narrow(0, T - static_cast<int64_t>(query.size()),
                       static_cast<int64_t>(query.size()));
}

namespace {

void check_options(const Model& model, const TrainOptions& o) {
  KVB_CHECK(model.device.is_cpu(), "packet-train: runs on the CPU so far");
  KVB_CHECK(!model.tokenizer_path.empty(), "packet-train: model ", model.config.name,
            " has no tokenizer");
  KVB_CHECK(!o.tasks.empty(), "packet-train: no tasks given");
  KVB_CHECK(o.steps >= 1 && o.batch >= 1 && o.samples >= 1,
            "packet-train: steps, batch and samples must be >= 1");
  KVB_CHECK(!o.doc_tokens.empty(), "packet-train: no document size given");
  for (int64_t d : o.doc_tokens)
    KVB_CHECK(d >= 0, "packet-train: --doc-tokens ", d, " is negative");
}

// The samples of o.tasks at o.length from o.seed, cut into documents, with the teacher's answers.
std::vector<Sample> make_samples(const std::shared_ptr<Model>& model, const Tokenizer& tok,
                                 const TrainOptions& o, double* teacher_right) {
  const ModelConfig& c = model->config;
  std::vector<Sample> data;
  *teacher_right = 0;
  for (size_t ti = 0; ti < o.tasks.size(); ++ti) {
    TaskSpec spec;
    spec.task = o.tasks[ti];
    spec.target_tokens = o.length;
    spec.num_samples = o.samples;
    spec.seed = o.seed + 7919 * ti;
    spec.data_dir = resolve_data_dir(o.data_dir);
    SampleSet set = o.cache_dir.empty() ? generate_task(tok, spec)
                                        : generate_task_cached(tok, spec, o.cache_dir + "/tasks");
    for (const auto& t : set.samples) {
      std::vector<int64_t> ctx = tok.encode(t.context_prompt());
      ctx.insert(ctx.begin(), c.bos_id);
      Sample s;
      const int64_t doc_tokens = o.doc_tokens[data.size() % o.doc_tokens.size()];
      s.docs = split_documents(std::vector<int64_t>(ctx.begin() + 1, ctx.end()), doc_tokens, tok);
      s.query = tok.encode(t.query_prompt());
      std::vector<int64_t> prompt = ctx;
      prompt.insert(prompt.end(), s.query.begin(), s.query.end());
      const auto ans = teacher_answer(model, tok, prompt, std::max<int64_t>(1, t.max_new_tokens),
                                      &s.teacher_logp);
      *teacher_right += score_answer(t.metric, tok.decode(ans), t.answers, {});
      s.answer_len = static_cast<int64_t>(ans.size());
      s.query.insert(s.query.end(), ans.begin(), ans.end() - 1);
      data.push_back(std::move(s));
    }
    if (o.log)
      o.log("task " + spec.task + ": " + std::to_string(set.samples.size()) +
            " samples, teacher answers ready");
  }
  *teacher_right /= static_cast<double>(std::max<size_t>(1, data.size()));
  return data;
}

int64_t max_rows(const std::vector<Sample>& data, int64_t wrap) {
  int64_t max_len = 0;
  for (const auto& s : data) {
    int64_t len = 1 + static_cast<int64_t>(s.query.size());
    for (const auto& d : s.docs) len += static_cast<int64_t>(d.size()) + wrap;
    max_len = std::max(max_len, len);
  }
  return max_len;
}

// KL(teacher || student) per answer token of one sample, and whether the student's argmax matches
// the teacher's answer at every position.
at::Tensor sample_kl(const TrainWeights& w, const ModelConfig& c, const Sample& s,
                     const at::Tensor& header, const at::Tensor& trailer, const at::Tensor& cos,
                     const at::Tensor& sin, bool* argmax_agrees) {
  const int64_t Q = static_cast<int64_t>(s.query.size());
  at::Tensor logits = student_query_logits(w, c, header, trailer, s.docs, s.query, cos, sin);
  // Query row Q - answer_len predicts the first answer token (the question's last row).
  at::Tensor logp_s = at::log_softmax(logits.narrow(0, Q - s.answer_len, s.answer_len), -1);
  if (argmax_agrees)
    *argmax_agrees = logp_s.argmax(-1).eq(s.teacher_logp.argmax(-1)).all().item<bool>();
  return (s.teacher_logp.exp() * (s.teacher_logp - logp_s)).sum(-1).mean();
}

}  // namespace

TrainResult train_adapter(const std::shared_ptr<Model>& model, const TrainOptions& o) {
  const ModelConfig& c = model->config;
  check_options(*model, o);
  const Tokenizer tok(model->tokenizer_path);
  double teacher_right = 0;
  std::vector<Sample> data = make_samples(model, tok, o, &teacher_right);
  const int64_t N = static_cast<int64_t>(data.size());

  TrainWeights w = train_weights_from_model(model->weights, c, "cpu");
  for (auto& t : w.tensors) t.requires_grad_(false);
  Adapter a = Adapter::fresh(c, o.header_rows, o.trailer_rows, o.init_std, o.seed);
  std::vector<at::Tensor*> params = {&a.header, &a.trailer};
  at::Tensor cos, sin;
  compute_rope_tables(c, max_rows(data, o.header_rows + o.trailer_rows), &cos, &sin);

  std::mt19937_64 rng(o.seed);
  std::vector<int64_t> order(N);
  for (int64_t i = 0; i < N; ++i) order[i] = i;
  for (int64_t i = N - 1; i > 0; --i) std::swap(order[i], order[uniform_index(rng, i + 1)]);

  TrainResult res;
  res.samples = N;
  res.teacher_answers_correct = teacher_right;
  bool first_interval = true;
  // Per step: the batch's mean KL per answer token; the learning rate decays linearly to 0.
  auto train_step = [&](int64_t step, AdapterAdam& adam) -> std::vector<double> {
    double kl_step = 0;
    for (int64_t r = 0; r < o.batch; ++r) {
      const Sample& s = data[order[(step * o.batch + r) % N]];
      at::Tensor kl = sample_kl(w, c, s, a.header, a.trailer, cos, sin, nullptr);
      (kl / static_cast<double>(o.batch)).backward();
      kl_step += kl.item<double>() / static_cast<double>(o.batch);
    }
    adam.step(o.lr * (1.0 - static_cast<double>(step) / static_cast<double>(o.steps)), step);
    return {kl_step};
  };
  auto interval = [&](const std::vector<double>& means, std::ostream& line) {
    const double kl = means[0];
    if (first_interval) res.kl_first = kl;
    first_interval = false;
    res.kl_last = kl;
    line << "KL " << kl << " nats per answer token";
  };
  train_adapter_tensors(params, {o.steps, o.log_every, o.log}, train_step, interval);
  res.steps = o.steps;
  std::string tasks, docs;
  for (const auto& t : o.tasks) tasks += (tasks.empty() ? "" : ",") + t;
  for (int64_t d : o.doc_tokens) docs += (docs.empty() ? "" : ",") + std::to_string(d);
  a.save(o.out, trained_adapter_metadata(
                    c.name, o.steps,
                    {{"tasks", tasks},
                     {"length", std::to_string(o.length)},
                     {"doc_tokens", docs},
                     {"samples", std::to_string(N)},
                     {"batch", std::to_string(o.batch)},
                     {"lr", std::to_string(o.lr)},
                     {"seed", std::to_string(o.seed)},
                     {"kl_first", std::to_string(res.kl_first)},
                     {"kl_last", std::to_string(res.kl_last)},
                     {"teacher_answers_correct", std::to_string(res.teacher_answers_correct)}}));
  return res;
}

EvalResult evaluate_wrap(const std::shared_ptr<Model>& model, const TrainOptions& o,
                         const at::Tensor& header, const at::Tensor& trailer) {
  const ModelConfig& c = model->config;
  check_options(*model, o);
  const Tokenizer tok(model->tokenizer_path);
  EvalResult r;
  std::vector<Sample> data = make_samples(model, tok, o, &r.teacher_answers_correct);
  TrainWeights w = train_weights_from_model(model->weights, c, "cpu");
  at::Tensor cos, sin;
  compute_rope_tables(c, max_rows(data, header.size(0) + trailer.size(0)), &cos, &sin);
  at::NoGradGuard ng;
  double kl = 0, agree = 0;
  for (const auto& s : data) {
    bool same = false;
    kl += sample_kl(w, c, s, header, trailer, cos, sin, &same).item<double>();
    agree += same ? 1 : 0;
  }
  r.samples = static_cast<int64_t>(data.size());
  r.kl = kl / static_cast<double>(r.samples);
  r.argmax_agreement = agree / static_cast<double>(r.samples);
  return r;
}

}  // namespace kvb::kv_packet
