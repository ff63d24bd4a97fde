#include "harness/train/train_config.h"

#include <algorithm>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/strings.h"

namespace kvb {

namespace {

// Checks that `obj` (at `where` in `source`) holds only `allowed` keys.
void check_keys(const nlohmann::json& obj, const std::vector<std::string>& allowed,
                const std::string& source, const std::string& where) {
  KVB_CHECK(obj.is_object(), source, ": ", where.empty() ? "the config" : "'" + where + "'",
            " must be a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      KVB_FAIL(source, ": unknown key '", where.empty() ? k : where + "." + k, "'",
               did_you_mean(k, allowed), " (known: ", join(allowed, ", "), ")");
    }
  }
}

template <typename T>
void get(const nlohmann::json& obj, const char* key, T* out, const std::string& source,
         const std::string& where) {
  if (!obj.contains(key)) return;
  try {
    *out = obj.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    KVB_FAIL(source, ": '", where.empty() ? std::string(key) : where + "." + key,
             "' has the wrong type (", obj.at(key).dump(), ")");
  }
}

void positive(int64_t v, const std::string& source, const std::string& key) {
  KVB_CHECK(v > 0, source, ": '", key, "' must be positive (got ", v, ")");
}

}  // namespace

int64_t TrainConfig::total_steps() const {
  int64_t n = 0;
  for (const auto& s : stages) n += s.steps;
  return n;
}

const TrainStage& TrainConfig::stage_at(int64_t step) const {
  int64_t end = 0;
  for (const auto& s : stages) {
    end += s.steps;
    if (step < end) return s;
  }
  return stages.back();
}

int64_t TrainConfig::max_seq_len() const {
  int64_t m = 0;
  for (const auto& s : stages) m = std::max(m, s.seq_len);
  return m;
}

namespace {

std::vector<TrainTaskMix> parse_tasks(const nlohmann::json& a, const std::string& src,
                                      const std::string& where) {
  KVB_CHECK(a.is_array(), src, ": '", where, "' must be an array");
  std::vector<TrainTaskMix> out;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& tj = a[i];
    const std::string w = where + "[" + std::to_string(i) + "]";
    check_keys(tj, {"task", "weight", "params"}, src, w);
    TrainTaskMix t;
    get(tj, "task", &t.task, src, w);
    get(tj, "weight", &t.weight, src, w);
    if (tj.contains("params")) t.params = tj.at("params");
    KVB_CHECK(!t.task.empty(), src, ": '", w, ".task' is required");
    KVB_CHECK(t.weight > 0, src, ": '", w, ".weight' must be positive");
    out.push_back(t);
  }
  return out;
}

}  // namespace

TrainConfig parse_train_config(const nlohmann::json& j, const std::string& src) {
  TrainConfig c;
  check_keys(j, {"name", "description", "seed", "model", "tokenizer", "data", "optim", "stages",
                 "device", "dtype", "checkpoint_every", "log_every", "eval_every", "eval_windows",
                 "init_from"},
             src, "");
  get(j, "name", &c.name, src, "");
  KVB_CHECK(!c.name.empty() && c.name.find('/') == std::string::npos, src,
            ": 'name' must be a non-empty name without '/'");
  get(j, "description", &c.description, src, "");
  get(j, "seed", &c.seed, src, "");
  get(j, "device", &c.device, src, "");
  get(j, "init_from", &c.init_from, src, "");
  get(j, "dtype", &c.dtype, src, "");
  KVB_CHECK(c.dtype == "fp32" || c.dtype == "bf16", src, ": 'dtype' must be fp32 or bf16 (got '",
            c.dtype, "')");
  get(j, "checkpoint_every", &c.checkpoint_every, src, "");
  get(j, "log_every", &c.log_every, src, "");
  get(j, "eval_every", &c.eval_every, src, "");
  get(j, "eval_windows", &c.eval_windows, src, "");
  positive(c.checkpoint_every, src, "checkpoint_every");
  positive(c.log_every, src, "log_every");
  positive(c.eval_every, src, "eval_every");
  positive(c.eval_windows, src, "eval_windows");

  KVB_CHECK(j.contains("model"), src, ": missing 'model'");
  const auto& m = j.at("model");
  check_keys(m, {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "max_seq_len",
                 "rope_theta", "norm_eps", "tied_embeddings"},
             src, "model");
  ModelConfig& mc = c.model;
  mc.format = "hf";
  mc.name = c.name;
  get(m, "dim", &mc.dim, src, "model");
  get(m, "hidden_dim", &mc.hidden_dim, src, "model");
  get(m, "n_layers", &mc.n_layers, src, "model");
  get(m, "n_heads", &mc.n_heads, src, "model");
  mc.n_kv_heads = mc.n_heads;
  get(m, "n_kv_heads", &mc.n_kv_heads, src, "model");
  mc.head_dim = mc.n_heads > 0 ? mc.dim / mc.n_heads : 0;
  get(m, "head_dim", &mc.head_dim, src, "model");
  get(m, "max_seq_len", &mc.max_seq_len, src, "model");
  get(m, "rope_theta", &mc.rope_theta, src, "model");
  get(m, "norm_eps", &mc.norm_eps, src, "model");
  get(m, "tied_embeddings", &mc.tied_embeddings, src, "model");
  mc.rope_style = RopeStyle::kHalf;  // HF layout: exported weights need no permutation
  for (const auto& [k, v] : {std::pair<const char*, int64_t>{"model.dim", mc.dim},
                             {"model.hidden_dim", mc.hidden_dim}, {"model.n_layers", mc.n_layers},
                             {"model.n_heads", mc.n_heads}, {"model.n_kv_heads", mc.n_kv_heads},
                             {"model.head_dim", mc.head_dim}, {"model.max_seq_len", mc.max_seq_len}})
    positive(v, src, k);
  KVB_CHECK(mc.n_heads % mc.n_kv_heads == 0, src, ": 'model.n_heads' (", mc.n_heads,
            ") must be a multiple of 'model.n_kv_heads' (", mc.n_kv_heads, ")");
  KVB_CHECK(mc.head_dim % 2 == 0, src, ": 'model.head_dim' must be even (RoPE pairs)");

  if (j.contains("tokenizer")) {
    const auto& t = j.at("tokenizer");
    check_keys(t, {"path", "vocab_size", "spm_extra_args"}, src, "tokenizer");
    get(t, "path", &c.tokenizer_path, src, "tokenizer");
    get(t, "vocab_size", &c.vocab_size, src, "tokenizer");
    get(t, "spm_extra_args", &c.spm_extra_args, src, "tokenizer");
    KVB_CHECK(c.vocab_size >= 300, src, ": 'tokenizer.vocab_size' must be >= 300 (256 byte pieces + ",
              "specials + merges)");
  }

  KVB_CHECK(j.contains("data"), src, ": missing 'data'");
  const auto& d = j.at("data");
  check_keys(d,
             {"corpora", "heldout_fraction", "synthetic_fraction", "min_task_tokens", "tasks",
              "answer_loss_weight"},
             src, "data");
  get(d, "corpora", &c.corpora, src, "data");
  KVB_CHECK(!c.corpora.empty(), src, ": 'data.corpora' must name at least one corpus");
  get(d, "heldout_fraction", &c.heldout_fraction, src, "data");
  KVB_CHECK(c.heldout_fraction > 0 && c.heldout_fraction < 0.5, src,
            ": 'data.heldout_fraction' must be in (0, 0.5)");
  get(d, "synthetic_fraction", &c.synthetic_fraction, src, "data");
  KVB_CHECK(c.synthetic_fraction >= 0 && c.synthetic_fraction <= 1, src,
            ": 'data.synthetic_fraction' must be in [0, 1]");
  get(d, "min_task_tokens", &c.min_task_tokens, src, "data");
  get(d, "answer_loss_weight", &c.answer_loss_weight, src, "data");
  KVB_CHECK(c.answer_loss_weight > 0 && c.answer_loss_weight <= 1000, src,
            ": 'data.answer_loss_weight' must be in (0, 1000]");
  if (d.contains("tasks")) c.tasks = parse_tasks(d.at("tasks"), src, "data.tasks");
  KVB_CHECK(c.synthetic_fraction == 0 || !c.tasks.empty(), src,
            ": 'data.synthetic_fraction' > 0 needs 'data.tasks'");

  if (j.contains("optim")) {
    const auto& o = j.at("optim");
    check_keys(o, {"lr", "min_lr_ratio", "weight_decay", "beta1", "beta2", "eps", "warmup_steps",
                   "grad_clip", "init_std"},
               src, "optim");
    get(o, "lr", &c.lr, src, "optim");
    get(o, "min_lr_ratio", &c.min_lr_ratio, src, "optim");
    get(o, "weight_decay", &c.weight_decay, src, "optim");
    get(o, "beta1", &c.beta1, src, "optim");
    get(o, "beta2", &c.beta2, src, "optim");
    get(o, "eps", &c.eps, src, "optim");
    get(o, "warmup_steps", &c.warmup_steps, src, "optim");
    get(o, "grad_clip", &c.grad_clip, src, "optim");
    get(o, "init_std", &c.init_std, src, "optim");
    KVB_CHECK(c.lr > 0, src, ": 'optim.lr' must be positive");
    KVB_CHECK(c.warmup_steps >= 0, src, ": 'optim.warmup_steps' must be >= 0");
  }

  KVB_CHECK(j.contains("stages") && j.at("stages").is_array() && !j.at("stages").empty(), src,
            ": 'stages' must be a non-empty array of {steps, seq_len, batch_size}");
  for (size_t i = 0; i < j.at("stages").size(); ++i) {
    const std::string w = "stages[" + std::to_string(i) + "]";
    const auto& sj = j.at("stages")[i];
    check_keys(sj, {"steps", "seq_len", "batch_size", "synthetic_fraction", "tasks"}, src, w);
    TrainStage s;
    get(sj, "steps", &s.steps, src, w);
    get(sj, "seq_len", &s.seq_len, src, w);
    get(sj, "batch_size", &s.batch_size, src, w);
    positive(s.steps, src, w + ".steps");
    positive(s.seq_len, src, w + ".seq_len");
    positive(s.batch_size, src, w + ".batch_size");
    if (sj.contains("synthetic_fraction")) {
      get(sj, "synthetic_fraction", &s.synthetic_fraction, src, w);
      KVB_CHECK(s.synthetic_fraction >= 0 && s.synthetic_fraction <= 1, src, ": '", w,
                ".synthetic_fraction' must be in [0, 1]");
    }
    if (sj.contains("tasks")) {
      s.tasks = parse_tasks(sj.at("tasks"), src, w + ".tasks");
      KVB_CHECK(!s.tasks.empty(), src, ": '", w, ".tasks' is empty (leave it out to use 'data.tasks')");
    }
    KVB_CHECK(c.synthetic_fraction_of(s) == 0 || !c.tasks_of(s).empty(), src, ": '", w,
              "' draws synthetic rows but neither it nor 'data' has tasks");
    KVB_CHECK(s.seq_len <= mc.max_seq_len, src, ": '", w, ".seq_len' (", s.seq_len,
              ") exceeds 'model.max_seq_len' (", mc.max_seq_len, ")");
    c.stages.push_back(s);
  }
  return c;
}

TrainConfig load_train_config(const std::string& path) {
  std::string text = read_text_file(path);
  return parse_train_config(parse_json(text, path), path);
}

void apply_train_override(nlohmann::json& j, const std::string& a) {
  const size_t eq = a.find('=');
  KVB_CHECK(eq != std::string::npos && eq > 0, "--set '", a, "': expected key.path=value");
  const std::string path = a.substr(0, eq), value = a.substr(eq + 1);
  nlohmann::json v;
  if (!parse_json_if_valid(value, "--set '" + a + "'", &v)) v = value;
  nlohmann::json* cur = &j;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur->is_array()) {
      size_t idx = 0;
      try {
        idx = std::stoul(key);
      } catch (...) {
        KVB_FAIL("--set '", a, "': '", key, "' is not an index of an array");
      }
      KVB_CHECK(idx < cur->size(), "--set '", a, "': index ", idx, " out of range");
      cur = &(*cur)[idx];
    } else {
      KVB_CHECK(cur->is_object(), "--set '", a, "': '", key, "' is not inside an object");
      cur = &(*cur)[key];  // new keys are allowed here; parse_train_config rejects unknown ones
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  *cur = v;
}

}  // namespace kvb
