#include "harness/train/train_config.h"

#include <algorithm>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/params.h"

namespace kvb {

namespace {

// The recipe's parameters, section by section, in the one parameter system (params.h): defaults
// come from TrainConfig's and ModelConfig's own, so they are written once.

std::vector<ParamSpec> top_specs() {
  const TrainConfig d;
  return {
      string_param("name", "", {}, "the model's name (and its exported directory's)"),
      string_param("description", "", {}, "free text"),
      int_param("seed", static_cast<int64_t>(d.seed), 0, std::nullopt, "seed of every draw"),
      section_param("model", "architecture"),
      section_param("tokenizer", "tokenizer file or spm_train settings"),
      section_param("data", "corpora and synthetic tasks"),
      section_param("optim", "AdamW and its schedule"),
      section_param("stages", "[{steps, seq_len, batch_size}, ...]"),
      string_param("device", d.device, {}, "cpu | cuda | cuda:N"),
      string_param("dtype", d.dtype, {"fp32", "bf16"}, "compute dtype (fp32 master weights)"),
      int_param("checkpoint_every", d.checkpoint_every, 1, std::nullopt, "steps"),
      int_param("log_every", d.log_every, 1, std::nullopt, "steps"),
      int_param("eval_every", d.eval_every, 1, std::nullopt, "steps"),
      int_param("eval_windows", d.eval_windows, 1, std::nullopt, "held-out windows"),
      string_param("init_from", d.init_from, {}, "a checkpoint to start from"),
  };
}

std::vector<ParamSpec> model_specs() {
  const ModelConfig d;
  const auto required = [](const char* name, const char* doc) {
    return int_param(name, 0, 1, std::nullopt, doc).unset_by_default();
  };
  // "auto" unless given: derived from the other sizes.
  const auto derived = [](const char* name, const char* doc) {
    ParamSpec p = int_param(name, 0, 1, std::nullopt, doc).or_auto();
    p.default_value = "auto";
    return p;
  };
  return {
      required("dim", "hidden size"),
      required("hidden_dim", "FFN intermediate size"),
      required("n_layers", "layers"),
      required("n_heads", "query heads"),
      derived("n_kv_heads", "KV heads (auto: n_heads)"),
      derived("head_dim", "per head (auto: dim / n_heads)"),
      required("max_seq_len", "trained context"),
      float_param("rope_theta", d.rope_theta, 0, std::nullopt, "RoPE base").above_min(),
      float_param("norm_eps", d.norm_eps, 0, std::nullopt, "RMSNorm epsilon").above_min(),
      bool_param("tied_embeddings", d.tied_embeddings, "output layer shares the embedding"),
  };
}

std::vector<ParamSpec> tokenizer_specs() {
  const TrainConfig d;
  return {
      string_param("path", d.tokenizer_path, {}, "a SentencePiece model; \"\": train one"),
      int_param("vocab_size", d.vocab_size, std::nullopt, std::nullopt, "pieces when trained"),
      string_list_param("spm_extra_args", d.spm_extra_args, "more spm_train flags"),
  };
}

std::vector<ParamSpec> data_specs() {
  const TrainConfig d;
  return {
      string_list_param("corpora", {}, "corpus names or .txt paths").unset_by_default(),
      float_param("heldout_fraction", d.heldout_fraction, 0, 0.5, "tail of each corpus held out")
          .above_min()
          .below_max(),
      float_param("synthetic_fraction", d.synthetic_fraction, 0, 1,
                  "probability that a row starts with a synthetic task"),
      int_param("min_task_tokens", d.min_task_tokens, std::nullopt, std::nullopt,
                "shortest task prompt"),
      section_param("tasks", "[{task, weight, params}, ...]"),
      float_param("answer_loss_weight", d.answer_loss_weight, 0, 1000,
                  "loss weight of retrieval answers")
          .above_min(),
  };
}

std::vector<ParamSpec> optim_specs() {
  const TrainConfig d;
  const auto number = [](const char* name, double def, const char* doc) {
    return float_param(name, def, std::nullopt, std::nullopt, doc);
  };
  return {
      float_param("lr", d.lr, 0, std::nullopt, "peak learning rate").above_min(),
      number("min_lr_ratio", d.min_lr_ratio, "final lr / peak lr"),
      number("weight_decay", d.weight_decay, "AdamW decay"),
      number("beta1", d.beta1, "AdamW beta1"),
      number("beta2", d.beta2, "AdamW beta2"),
      number("eps", d.eps, "AdamW epsilon"),
      int_param("warmup_steps", d.warmup_steps, 0, std::nullopt, "linear warm-up"),
      number("grad_clip", d.grad_clip, "max global L2 norm; <= 0 disables"),
      number("init_std", d.init_std, "initial weight std"),
  };
}

std::vector<ParamSpec> stage_specs() {
  const auto required = [](const char* name, const char* doc) {
    return int_param(name, 0, 1, std::nullopt, doc).unset_by_default();
  };
  return {
      required("steps", "optimiser steps"),
      required("seq_len", "tokens per row"),
      required("batch_size", "rows per step"),
      float_param("synthetic_fraction", 0, 0, 1, "this stage's mix (default: data's)")
          .unset_by_default(),
      section_param("tasks", "this stage's tasks (default: data's)"),
  };
}

std::vector<ParamSpec> task_mix_specs() {
  const TrainTaskMix d;
  return {
      string_param("task", "", {}, "a synthetic task").unset_by_default(),
      float_param("weight", d.weight, 0, std::nullopt, "relative draw probability").above_min(),
      section_param("params", "the task's parameters"),
  };
}

// The resolved section `key` of `obj`, all defaults when it is absent.
nlohmann::json section(const nlohmann::json& obj, const char* key,
                       const std::vector<ParamSpec>& specs, const std::string& owner) {
  return resolve_params(specs, obj.contains(key) ? obj.at(key) : nlohmann::json(), owner);
}

// The keys a table leaves out unless given, named when missing.
void require(const nlohmann::json& resolved, const std::vector<const char*>& keys,
             const std::string& src, const std::string& where) {
  for (const char* k : keys)
    KVB_CHECK(resolved.contains(k), src, ": missing '", where, ".", k, "'");
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
    const std::string w = where + "[" + std::to_string(i) + "]";
    const nlohmann::json r = resolve_params(task_mix_specs(), a[i], src + ": " + w);
    require(r, {"task"}, src, w);
    TrainTaskMix t;
    t.task = r.at("task");
    t.weight = r.at("weight");
    if (r.contains("params")) t.params = r.at("params");
    KVB_CHECK(!t.task.empty(), src, ": '", w, ".task' is required");
    out.push_back(t);
  }
  return out;
}

}  // namespace

TrainConfig parse_train_config(const nlohmann::json& j, const std::string& src) {
  TrainConfig c;
  const nlohmann::json top = resolve_params(top_specs(), j, src + ": ");
  c.name = top.at("name");
  KVB_CHECK(!c.name.empty() && c.name.find('/') == std::string::npos, src,
            ": 'name' must be a non-empty name without '/'");
  c.description = top.at("description");
  c.seed = top.at("seed").get<uint64_t>();
  c.device = top.at("device");
  c.init_from = top.at("init_from");
  c.dtype = top.at("dtype");
  for (const auto& [key, field] : {std::pair{"checkpoint_every", &TrainConfig::checkpoint_every},
                                   {"log_every", &TrainConfig::log_every},
                                   {"eval_every", &TrainConfig::eval_every},
                                   {"eval_windows", &TrainConfig::eval_windows}})
    c.*field = top.at(key).get<int64_t>();

  KVB_CHECK(j.contains("model"), src, ": missing 'model'");
  const nlohmann::json m = section(j, "model", model_specs(), src + ": model");
  require(m, {"dim", "hidden_dim", "n_layers", "n_heads", "max_seq_len"}, src, "model");
  ModelConfig& mc = c.model;
  mc.format = "hf";
  mc.name = c.name;
  mc.dim = m.at("dim");
  mc.hidden_dim = m.at("hidden_dim");
  mc.n_layers = m.at("n_layers");
  mc.n_heads = m.at("n_heads");
  mc.n_kv_heads = param_is_auto(m, "n_kv_heads") ? mc.n_heads : m.at("n_kv_heads").get<int64_t>();
  mc.head_dim =
      param_is_auto(m, "head_dim") ? mc.dim / mc.n_heads : m.at("head_dim").get<int64_t>();
  mc.max_seq_len = m.at("max_seq_len");
  mc.rope_theta = m.at("rope_theta");
  mc.norm_eps = m.at("norm_eps");
  mc.tied_embeddings = m.at("tied_embeddings");
  mc.rope_style = RopeStyle::kHalf;  // HF layout: exported weights need no permutation
  KVB_CHECK(mc.head_dim > 0, src, ": 'model.head_dim' must be positive (dim ", mc.dim,
            " / n_heads ", mc.n_heads, " is 0)");
  KVB_CHECK(mc.n_heads % mc.n_kv_heads == 0, src, ": 'model.n_heads' (", mc.n_heads,
            ") must be a multiple of 'model.n_kv_heads' (", mc.n_kv_heads, ")");
  KVB_CHECK(mc.head_dim % 2 == 0, src, ": 'model.head_dim' must be even (RoPE pairs)");

  const nlohmann::json t = section(j, "tokenizer", tokenizer_specs(), src + ": tokenizer");
  c.tokenizer_path = t.at("path");
  c.vocab_size = t.at("vocab_size");
  c.spm_extra_args = t.at("spm_extra_args").get<std::vector<std::string>>();
  KVB_CHECK(c.vocab_size >= 300, src, ": 'tokenizer.vocab_size' must be >= 300 (256 byte pieces + ",
            "specials + merges)");

  KVB_CHECK(j.contains("data"), src, ": missing 'data'");
  const nlohmann::json d = section(j, "data", data_specs(), src + ": data");
  if (d.contains("corpora")) c.corpora = d.at("corpora").get<std::vector<std::string>>();
  KVB_CHECK(!c.corpora.empty(), src, ": 'data.corpora' must name at least one corpus");
  c.heldout_fraction = d.at("heldout_fraction");
  c.synthetic_fraction = d.at("synthetic_fraction");
  c.min_task_tokens = d.at("min_task_tokens");
  c.answer_loss_weight = d.at("answer_loss_weight");
  if (d.contains("tasks")) c.tasks = parse_tasks(d.at("tasks"), src, "data.tasks");
  KVB_CHECK(c.synthetic_fraction == 0 || !c.tasks.empty(), src,
            ": 'data.synthetic_fraction' > 0 needs 'data.tasks'");

  const nlohmann::json o = section(j, "optim", optim_specs(), src + ": optim");
  for (const auto& [key, field] : {std::pair{"lr", &TrainConfig::lr},
                                   {"min_lr_ratio", &TrainConfig::min_lr_ratio},
                                   {"weight_decay", &TrainConfig::weight_decay},
                                   {"beta1", &TrainConfig::beta1},
                                   {"beta2", &TrainConfig::beta2},
                                   {"eps", &TrainConfig::eps},
                                   {"grad_clip", &TrainConfig::grad_clip},
                                   {"init_std", &TrainConfig::init_std}})
    c.*field = o.at(key).get<double>();
  c.warmup_steps = o.at("warmup_steps");

  KVB_CHECK(j.contains("stages") && j.at("stages").is_array() && !j.at("stages").empty(), src,
            ": 'stages' must be a non-empty array of {steps, seq_len, batch_size}");
  for (size_t i = 0; i < j.at("stages").size(); ++i) {
    const std::string w = "stages[" + std::to_string(i) + "]";
    const nlohmann::json sr = resolve_params(stage_specs(), j.at("stages")[i], src + ": " + w);
    require(sr, {"steps", "seq_len", "batch_size"}, src, w);
    TrainStage s;
    s.steps = sr.at("steps");
    s.seq_len = sr.at("seq_len");
    s.batch_size = sr.at("batch_size");
    if (sr.contains("synthetic_fraction")) s.synthetic_fraction = sr.at("synthetic_fraction");
    if (sr.contains("tasks")) {
      s.tasks = parse_tasks(sr.at("tasks"), src, w + ".tasks");
      KVB_CHECK(!s.tasks.empty(), src, ": '", w,
                ".tasks' is empty (leave it out to use 'data.tasks')");
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
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
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
