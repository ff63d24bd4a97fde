#include "harness/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard (not in ATen.h since LibTorch 2)
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "datasets/corpus.h"
#include "harness/common/error.h"
#include "harness/common/internal_error.h"
#include "harness/common/json_parse.h"
#include "harness/common/mapped_file.h"
#include "harness/common/progress_eta.h"
#include "harness/common/sha256.h"
#include "harness/common/strings.h"
#include "harness/engine/transformer.h"
#include "harness/formats/safetensors.h"
#include "harness/formats/safetensors_writer.h"
#include "harness/formats/tokenizer.h"
#include "harness/model/model.h"
#include "harness/train/train_data.h"

namespace fs = std::filesystem;

namespace kvb {

namespace {

constexpr const char* kCheckpointFormat = "kvbench-train-1";

std::string layer_name(int64_t l, const char* what) {
  return "layers." + std::to_string(l) + "." + what;
}

// RMSNorm for autograd (transformer.h's rms_norm works in place on an intermediate).
at::Tensor rms_norm_ag(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor inv = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (xf * inv * w).to(x.scalar_type());
}

// Rotates x [B, T, H, hd] by cos/sin [T, hd/2]: pairs (i, i + hd/2) in the HF half-split style (what
// the trainer's own models use), or adjacent pairs (2i, 2i + 1) for models loaded with interleaved
// RoPE (llama2.c checkpoints), whose frozen weights adapters are trained on.
at::Tensor rope_train(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeStyle style) {
  const int64_t half = x.size(3) / 2;
  at::Tensor c = cos.view({1, cos.size(0), 1, half}).to(x.scalar_type());
  at::Tensor s = sin.view({1, sin.size(0), 1, half}).to(x.scalar_type());
  if (style == RopeStyle::kInterleaved) {
    at::Tensor pairs = x.reshape({x.size(0), x.size(1), x.size(2), half, 2});
    at::Tensor a = pairs.select(4, 0), b = pairs.select(4, 1);
    return at::stack({a * c - b * s, a * s + b * c}, 4).reshape(x.sizes());
  }
  at::Tensor a = x.narrow(3, 0, half), b = x.narrow(3, half, half);
  return at::cat({a * c - b * s, b * c + a * s}, 3);
}

double lr_at(const TrainConfig& c, int64_t step) {
  const int64_t total = c.total_steps();
  if (c.warmup_steps > 0 && step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const double span = std::max<int64_t>(1, total - c.warmup_steps);
  const double t = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  const double min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * t));
}

StWriteEntry st_entry(const std::string& name, const at::Tensor& t) {
  StWriteEntry e;
  e.name = name;
  e.dtype = StDtype::kF32;
  e.shape = t.sizes().vec();
  e.data = t.data_ptr<float>();
  e.nbytes = static_cast<size_t>(t.numel()) * sizeof(float);
  return e;
}

at::Tensor st_to_f32(const StTensor& t, const std::string& path) {
  KVB_CHECK(t.dtype == StDtype::kF32, path, ": tensor '", t.name, "' is not F32");
  return at::from_blob(const_cast<uint8_t*>(t.data), t.shape, at::TensorOptions().dtype(at::kFloat))
      .clone();
}

// The config as it decides the trajectory: logging cadence may change across a resume.
std::string trajectory_hash(nlohmann::json j) {
  for (const char* k : {"description", "checkpoint_every", "log_every", "eval_every", "eval_windows"})
    j.erase(k);
  return sha256_hex(j.dump());
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%07lld.safetensors", static_cast<long long>(step));
  return dir + "/" + buf;
}

// Checkpoints in `dir`, sorted by step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (starts_with(n, "step-") && ends_with(n, ".safetensors"))
      out.emplace_back(std::stoll(n.substr(5, n.size() - 5 - 12)), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Trains a SentencePiece BPE tokenizer with the library's own trainer (spm_train) on the training
// split, with the options the engine's tokenizer reads (identity normalisation, byte fallback) and
// digits split, so numbers are copied digit by digit.
void train_tokenizer(const TrainConfig& cfg, const std::string& data_dir, const std::string& out) {
  const std::string text_path = out + "/tokenizer_train.txt";
  write_text_file_atomic(text_path, TrainData::training_text(cfg, data_dir));
  std::ostringstream cmd;
  cmd << "spm_train --input='" << text_path << "' --model_prefix='" << out << "/tokenizer'"
      << " --vocab_size=" << cfg.vocab_size
      << " --model_type=bpe --character_coverage=1.0 --split_digits=true --byte_fallback=true"
      << " --normalization_rule_name=identity --remove_extra_whitespaces=false"
      << " --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --input_sentence_size=0"
      << " --shuffle_input_sentence=false --max_sentence_length=65536 --num_threads=1";
  for (const auto& a : cfg.spm_extra_args) cmd << " '" << a << "'";
  cmd << " > '" << out << "/tokenizer_train.log' 2>&1";
  std::cerr << "kvbench train: training the tokenizer (spm_train, vocab " << cfg.vocab_size
            << ") -> " << out << "/tokenizer.model\n";
  const int rc = std::system(cmd.str().c_str());
  KVB_CHECK(rc == 0, "spm_train failed (exit ", rc, "); its log: ", out, "/tokenizer_train.log",
            " (is the Debian package 'sentencepiece' installed?)");
  fs::remove(out + "/tokenizer.vocab");
  fs::remove(text_path);
}

// An exclusive flock on OUT/.lock for the lifetime of a run (released by the OS if the process dies).
class OutDirLock {
 public:
  explicit OutDirLock(const std::string& out) {
    const std::string p = out + "/.lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT, 0644);
    KVB_CHECK(fd_ >= 0, p, ": cannot open: ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      KVB_FAIL(out, ": another `kvbench train` is running on this directory");
    }
  }
  ~OutDirLock() { ::close(fd_); }
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

 private:
  int fd_ = -1;
};

std::string log_path_of(const std::string& out) { return out + "/train_log.jsonl"; }

// TRAINING.md of an exported model: the recipe, what was seen, and the curve (about 20 rows of
// training loss, every held-out evaluation), all read back from the run's own log.
std::string training_summary(const TrainConfig& cfg, const ModelConfig& mc, const nlohmann::json& recipe,
                             const std::string& log_path, int64_t steps) {
  std::vector<nlohmann::json> train, held;
  if (fs::exists(log_path)) {
    std::istringstream in(read_text_file(log_path));
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      nlohmann::json j;
      if (!parse_json_if_valid(line, log_path, &j)) continue;
      (j.contains("loss") ? train : held).push_back(j);
    }
  }
  // Only what led to the exported weights: rows past the checkpoint (a run stopped or killed after
  // it) go, and a step logged twice (re-run after a resume) keeps its last row.
  auto trim = [steps](std::vector<nlohmann::json>& rows) {
    std::map<int64_t, nlohmann::json> by_step;
    for (auto& j : rows) {
      const int64_t st = j.value("step", int64_t{0});
      if (st <= steps) by_step[st] = std::move(j);
    }
    rows.clear();
    for (auto& [st, j] : by_step) rows.push_back(std::move(j));
  };
  trim(train);
  trim(held);
  int64_t tokens = 0;
  for (int64_t s = 0; s < steps; ++s) tokens += cfg.stage_at(s).batch_size * cfg.stage_at(s).seq_len;
  double seconds = 0;  // summed per invocation: elapsed_s restarts at each resume
  double prev = 0;
  for (const auto& j : train) {
    const double e = j.value("elapsed_s", 0.0);
    if (e < prev) seconds += prev;
    prev = e;
  }
  seconds += prev;
  std::ostringstream o;
  char buf[256];
  o << "# Training record: " << cfg.name << "\n\n"
    << "Written by `kvbench train` when the run finished; every number comes from the run's log.\n\n"
    << "- parameters: " << mc.parameter_count() << " (" << mc.n_layers << " layers, d_model " << mc.dim
    << ", " << mc.n_heads << " query / " << mc.n_kv_heads << " KV heads of " << mc.head_dim
    << ", FFN " << mc.hidden_dim << ", vocab " << mc.vocab_size << ", context " << mc.max_seq_len
    << ")\n- steps: " << steps << ", tokens seen: " << tokens << "\n";
  if (!cfg.init_from.empty())
    o << "- initialised from `" << cfg.init_from << "` (sha256 " << sha256_file_hex(cfg.init_from)
      << "); its own TRAINING record covers the steps before\n";
  std::snprintf(buf, sizeof buf, "- wall time: %.1f min (summed over invocations)\n", seconds / 60.0);
  o << buf << "\n## Curve\n\n| step | seq_len | train loss | lr | tok/s |\n|--:|--:|--:|--:|--:|\n";
  const size_t every = std::max<size_t>(1, train.size() / 20);
  for (size_t i = 0; i < train.size(); ++i) {
    if (i % every != 0 && i + 1 != train.size()) continue;
    const auto& j = train[i];
    std::snprintf(buf, sizeof buf, "| %lld | %lld | %.4f | %.2e | %.0f |\n",
                  static_cast<long long>(j.value("step", int64_t{0})),
                  static_cast<long long>(j.value("seq_len", int64_t{0})), j.value("loss", 0.0),
                  j.value("lr", 0.0), j.value("tok_per_s", 0.0));
    o << buf;
  }
  o << "\n## Held-out text (the last " << cfg.heldout_fraction * 100
    << "% of each corpus, never trained on) and the induction probe (NLL and top-1 on the second\n"
    << "copy of repeated random ids: ~ln(vocab) before induction heads form, ~0 after)\n\n"
    << "| step | loss | perplexity | induction nats | induction top-1 |\n|--:|--:|--:|--:|--:|\n";
  for (const auto& j : held) {
    std::snprintf(buf, sizeof buf, "| %lld | %.4f | %.2f |",
                  static_cast<long long>(j.value("step", int64_t{0})), j.value("heldout_loss", 0.0),
                  j.value("heldout_ppl", 0.0));
    o << buf;
    if (j.contains("induction_nll")) {
      std::snprintf(buf, sizeof buf, " %.3f | %.2f |\n", j.value("induction_nll", 0.0),
                    j.value("induction_top1", 0.0));
    } else {
      std::snprintf(buf, sizeof buf, " - | - |\n");
    }
    o << buf;
  }
  o << "\n## Recipe\n\n```json\n" << recipe.dump(2) << "\n```\n";
  return o.str();
}

struct Adam {
  std::vector<at::Tensor> m, v;
};

// Sequences of `n` distinct ids drawn uniformly from the vocabulary (never BOS/EOS/UNK), each written
// twice after BOS, from a fixed seed: the same rows at every evaluation of every run.
std::vector<std::vector<int64_t>> induction_rows(const Tokenizer& tok, int64_t n, int64_t rows) {
  std::mt19937_64 rng(0x696e64756374ull);
  std::vector<int64_t> pool;
  for (int64_t id = 0; id < tok.vocab_size(); ++id)
    if (id != tok.bos_id() && id != tok.eos_id() && id != tok.unk_id()) pool.push_back(id);
  n = std::min<int64_t>(n, static_cast<int64_t>(pool.size()));
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> ids = pool;
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<int64_t> row = {tok.bos_id()};
    for (int c = 0; c < 2; ++c) row.insert(row.end(), ids.begin(), ids.begin() + n);
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace

const at::Tensor& TrainWeights::at(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return tensors[i];
  KVB_UNREACHABLE("trainer", "no training weight '", name, "'");
}

TrainWeights init_train_weights(const ModelConfig& c, double std, uint64_t seed,
                                const std::string& device) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x747261696e000001ull);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const c10::Device dev = parse_device(device);
  TrainWeights w;
  auto add = [&](const std::string& name, at::Tensor t) {
    w.names.push_back(name);
    w.tensors.push_back(t.to(dev).requires_grad_(true));
  };
  auto normal = [&](std::vector<int64_t> shape, double s) {
    return at::normal(0.0, s, shape, gen, f32);
  };
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  const int64_t D = c.dim, Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim, V = c.vocab_size;
  add("embed", normal({V, D}, std));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    add(layer_name(l, "attn_norm"), at::ones({D}, f32));
    add(layer_name(l, "wqkv"), normal({Q + 2 * KV, D}, std));
    add(layer_name(l, "wo"), normal({D, Q}, out_std));
    add(layer_name(l, "ffn_norm"), at::ones({D}, f32));
    add(layer_name(l, "w13"), normal({2 * F, D}, std));
    add(layer_name(l, "w2"), normal({D, F}, out_std));
  }
  add("final_norm", at::ones({D}, f32));
  if (!c.tied_embeddings) add("lm_head", normal({V, D}, std));
  return w;
}

TrainWeights train_weights_from_model(const ModelWeights& m, const ModelConfig& c,
                                      const std::string& device) {
  TrainWeights w = init_train_weights(c, 0.02, 0, device);
  at::NoGradGuard ng;
  auto set = [&](size_t i, const at::Tensor& t) { w.tensors.at(i).copy_(t.to(at::kFloat)); };
  size_t i = 0;
  set(i++, m.embedding);
  for (const auto& l : m.layers) {
    KVB_CHECK(!l.bqkv.defined(), "train_weights_from_model: the trainer has no qkv bias");
    for (const at::Tensor* t : {&l.attn_norm, &l.wqkv, &l.wo, &l.ffn_norm, &l.w13, &l.w2}) set(i++, *t);
  }
  set(i++, m.final_norm);
  if (!c.tied_embeddings) set(i++, m.lm_head);
  KVB_ASSERT(i == w.tensors.size(), "trainer", "train_weights_from_model: ", i, " tensors for ",
             w.tensors.size());
  return w;
}

at::Tensor train_forward(const TrainWeights& w, const ModelConfig& c, const at::Tensor& tokens,
                         const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                         c10::ScalarType dt, const AttentionBiasFn& bias) {
  return train_forward_embeds(w, c, at::embedding(w.at("embed").to(dt), tokens), rope_cos, rope_sin,
                              dt, bias);
}

at::Tensor train_forward_embeds(const TrainWeights& w, const ModelConfig& c, const at::Tensor& embeds,
                                const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                                c10::ScalarType dt, const AttentionBiasFn& bias) {
  const int64_t B = embeds.size(0), T = embeds.size(1);
  const int64_t H = c.n_heads, KVH = c.n_kv_heads, HD = c.head_dim, Q = c.q_dim(), KV = c.kv_dim();
  const int64_t F = c.hidden_dim, G = c.group_size();
  auto W = [&](const std::string& n) { return w.at(n).to(dt); };
  at::Tensor cos = rope_cos.narrow(0, 0, T), sin = rope_sin.narrow(0, 0, T);
  at::Tensor x = embeds.to(dt);  // [B, T, D]
  at::Tensor causal = at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(embeds.device()))
                          .triu(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    at::Tensor h = rms_norm_ag(x, w.at(layer_name(l, "attn_norm")), c.norm_eps);
    at::Tensor qkv = at::linear(h, W(layer_name(l, "wqkv")));  // [B, T, Q + 2KV]
    at::Tensor q = rope_train(qkv.narrow(2, 0, Q).reshape({B, T, H, HD}), cos, sin, c.rope_style);
    at::Tensor k = rope_train(qkv.narrow(2, Q, KV).reshape({B, T, KVH, HD}), cos, sin, c.rope_style);
    at::Tensor v = qkv.narrow(2, Q + KV, KV).reshape({B, T, KVH, HD});
    q = q.transpose(1, 2);                                   // [B, H, T, HD]
    k = k.transpose(1, 2).repeat_interleave(G, 1);           // [B, H, T, HD]: query head h reads h / G
    v = v.transpose(1, 2).repeat_interleave(G, 1);
    at::Tensor s = at::matmul(q, k.transpose(2, 3)).to(at::kFloat).mul(scale);  // [B, H, T, T]
    if (bias) s = s + bias(l, x).repeat_interleave(G, 1);
    s = s.masked_fill(causal, -std::numeric_limits<float>::infinity());
    at::Tensor p = at::softmax(s, -1).to(dt);
    at::Tensor o = at::matmul(p, v).transpose(1, 2).reshape({B, T, Q});
    x = x + at::linear(o, W(layer_name(l, "wo")));
    h = rms_norm_ag(x, w.at(layer_name(l, "ffn_norm")), c.norm_eps);
    at::Tensor gu = at::linear(h, W(layer_name(l, "w13")));
    at::Tensor act = at::silu(gu.narrow(2, 0, F)) * gu.narrow(2, F, F);
    x = x + at::linear(act, W(layer_name(l, "w2")));
  }
  x = rms_norm_ag(x, w.at("final_norm"), c.norm_eps);
  return at::linear(x, W(c.tied_embeddings ? "embed" : "lm_head")).to(at::kFloat);
}

void export_hf_model(const TrainWeights& w, const ModelConfig& c, const std::string& tokenizer_path,
                     const std::string& dir) {
  fs::create_directories(dir);
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), F = c.hidden_dim;
  std::vector<std::pair<std::string, at::Tensor>> out;  // HF names, contiguous CPU fp32
  auto put = [&](const std::string& name, const at::Tensor& t) {
    out.emplace_back(name, t.detach().to(at::kCPU, at::kFloat).contiguous());
  };
  put("model.embed_tokens.weight", w.at("embed"));
  put("model.norm.weight", w.at("final_norm"));
  if (!c.tied_embeddings) put("lm_head.weight", w.at("lm_head"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const at::Tensor& qkv = w.at(layer_name(l, "wqkv"));
    const at::Tensor& w13 = w.at(layer_name(l, "w13"));
    put(p + "input_layernorm.weight", w.at(layer_name(l, "attn_norm")));
    put(p + "self_attn.q_proj.weight", qkv.narrow(0, 0, Q));
    put(p + "self_attn.k_proj.weight", qkv.narrow(0, Q, KV));
    put(p + "self_attn.v_proj.weight", qkv.narrow(0, Q + KV, KV));
    put(p + "self_attn.o_proj.weight", w.at(layer_name(l, "wo")));
    put(p + "post_attention_layernorm.weight", w.at(layer_name(l, "ffn_norm")));
    put(p + "mlp.gate_proj.weight", w13.narrow(0, 0, F));
    put(p + "mlp.up_proj.weight", w13.narrow(0, F, F));
    put(p + "mlp.down_proj.weight", w.at(layer_name(l, "w2")));
  }
  std::vector<StWriteEntry> entries;
  for (const auto& [n, t] : out) entries.push_back(st_entry(n, t));
  write_safetensors(dir + "/model.safetensors", entries, {{"format", "pt"}});
  nlohmann::json cj = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", c.dim},
      {"intermediate_size", c.hidden_dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_seq_len},
      {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.norm_eps},
      {"tie_word_embeddings", c.tied_embeddings},
      {"vocab_size", c.vocab_size},
      {"bos_token_id", c.bos_id},
      {"eos_token_id", c.eos_ids.empty() ? 2 : c.eos_ids[0]},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"torch_dtype", "float32"}};
  write_text_file_atomic(dir + "/config.json", cj.dump(2) + "\n");
  if (!tokenizer_path.empty()) {
    write_text_file_atomic(dir + "/tokenizer.model", read_text_file(tokenizer_path));
  }
}

namespace {

// One `kvbench train` invocation: the recipe and its output directory, the tokenizer, the weights
// and optimiser state (resumed from the newest checkpoint), then steps until the schedule, a stop
// option or the time limit ends it. Each phase is a method; run() is the order they run in.
class TrainingRun {
 public:
  explicit TrainingRun(const TrainOptions& opts) : opts_(opts) {}

  TrainSummary run() {
    read_recipe();
    OutDirLock lock(out_);  // one trainer per output directory: a second would interleave checkpoints
    start_output_dir();
    prepare_tokenizer();
    init_state();
    sum_.total_steps = total_;
    if (opts_.export_only) {
      KVB_CHECK(step_ > 0, out_, ": no checkpoint to export");
      sum_.steps_done = step_;
      export_model();
      return sum_;
    }
    data_ = std::make_unique<TrainData>(cfg_, tok_, data_dir_);
    if (!opts_.quiet) print_plan();
    if (opts_.show_rows > 0) {
      show_rows();
      return sum_;
    }
    open_log();
    heldout_ = data_->heldout_windows(cfg_.eval_windows, cfg_.stages.back().seq_len);
    probe_n_ = std::min<int64_t>({48, (cfg_.stages.front().seq_len - 1) / 2, tok_->vocab_size() - 3});
    probe_rows_ = induction_rows(*tok_, std::max<int64_t>(probe_n_, 0), 8);
    train_loop();
    sum_.steps_done = step_;
    if (step_ == total_) export_model();
    return sum_;
  }

 private:
  void read_recipe() {
    cj_ = parse_json(read_text_file(opts_.config_path), opts_.config_path);
    for (const auto& o : opts_.overrides) apply_train_override(cj_, o);
    cfg_ = parse_train_config(cj_, opts_.config_path);
    out_ = opts_.out_dir.empty() ? "runs/train/" + cfg_.name : opts_.out_dir;
    ckpt_dir_ = out_ + "/checkpoints";
    fs::create_directories(ckpt_dir_);
  }

  void start_output_dir() {
    data_dir_ = resolve_data_dir(opts_.data_dir);
    hash_ = trajectory_hash(cj_);
    if (opts_.fresh) {
      for (const auto& [s, p] : list_checkpoints(ckpt_dir_)) fs::remove(p);
      fs::remove(out_ + "/train_log.jsonl");
    }
    write_text_file_atomic(out_ + "/train_config.json", cj_.dump(2) + "\n");
  }

  void prepare_tokenizer() {
    tok_path_ = out_ + "/tokenizer.model";
    if (!cfg_.tokenizer_path.empty()) {
      write_text_file_atomic(tok_path_, read_text_file(cfg_.tokenizer_path));
    } else if (!fs::exists(tok_path_)) {
      train_tokenizer(cfg_, data_dir_, out_);
    }
    tok_ = std::make_shared<Tokenizer>(tok_path_);
    mc_ = cfg_.model;
    mc_.vocab_size = tok_->vocab_size();
    mc_.bos_id = tok_->bos_id();
    mc_.eos_ids = {tok_->eos_id()};
    mc_.validate(opts_.config_path);
  }

  // Weights, optimiser state, the step they are at, and the RoPE tables.
  void init_state() {
    dev_ = parse_device(cfg_.device);
    dt_ = cfg_.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    KVB_CHECK(dt_ == at::kFloat || dev_.is_cuda(), opts_.config_path,
              ": 'dtype' bf16 is for CUDA; the CPU trains in fp32");
    w_ = init_train_weights(mc_, cfg_.init_std, cfg_.seed, cfg_.device);
    for (const auto& t : w_.tensors) {
      adam_.m.push_back(at::zeros_like(t).detach());
      adam_.v.push_back(at::zeros_like(t).detach());
    }
    auto ckpts = list_checkpoints(ckpt_dir_);
    if (!ckpts.empty()) {
      resume_from(ckpts.back().second);
    } else if (!cfg_.init_from.empty()) {
      init_from(cfg_.init_from);
    }
    total_ = cfg_.total_steps();
    compute_rope_tables(mc_, cfg_.max_seq_len(), &rope_cos_, &rope_sin_);
    rope_cos_ = rope_cos_.to(dev_);
    rope_sin_ = rope_sin_.to(dev_);
  }

  void resume_from(const std::string& path) {
    SafetensorsFile f(path);
    const auto& md = f.metadata();
    KVB_CHECK(md.count("format") && md.at("format") == kCheckpointFormat, path,
              ": not a kvbench training checkpoint");
    KVB_CHECK(md.count("config_hash") && md.at("config_hash") == hash_, path,
              ": written under a different recipe (the config changed); run with --fresh to start over,",
              " or restore the config");
    at::NoGradGuard ng;
    for (size_t i = 0; i < w_.names.size(); ++i) {
      w_.tensors[i].copy_(st_to_f32(f.get("param/" + w_.names[i]), path));
      adam_.m[i].copy_(st_to_f32(f.get("adam_m/" + w_.names[i]), path));
      adam_.v[i].copy_(st_to_f32(f.get("adam_v/" + w_.names[i]), path));
    }
    step_ = std::stoll(md.at("step"));
    if (!opts_.quiet) std::cerr << "kvbench train: resuming from " << path << " (step " << step_ << ")\n";
  }

  void init_from(const std::string& path) {
    SafetensorsFile f(path);
    const auto& md = f.metadata();
    KVB_CHECK(md.count("format") && md.at("format") == kCheckpointFormat, path,
              ": 'init_from' is not a kvbench training checkpoint");
    at::NoGradGuard ng;
    for (size_t i = 0; i < w_.names.size(); ++i) {
      const std::string n = "param/" + w_.names[i];
      KVB_CHECK(f.has(n), path, ": no tensor '", n, "' (a different architecture?)");
      at::Tensor t = st_to_f32(f.get(n), path);
      KVB_CHECK(t.sizes() == w_.tensors[i].sizes(), path, ": tensor '", n, "' has shape ", t.sizes(),
                ", the recipe wants ", w_.tensors[i].sizes());
      w_.tensors[i].copy_(t);
    }
    if (!opts_.quiet)
      std::cerr << "kvbench train: weights from " << path << " (step "
                << (md.count("step") ? md.at("step") : "?") << ", sha256 "
                << sha256_file_hex(path).substr(0, 16) << "...)\n";
  }

  void save_checkpoint(int64_t s) {
    std::vector<at::Tensor> cpu;  // keep the copies alive while writing
    std::vector<StWriteEntry> e;
    for (size_t i = 0; i < w_.names.size(); ++i) {
      for (auto [prefix, t] : {std::pair<const char*, const at::Tensor*>{"param/", &w_.tensors[i]},
                               {"adam_m/", &adam_.m[i]}, {"adam_v/", &adam_.v[i]}}) {
        cpu.push_back(t->detach().to(at::kCPU).contiguous());
        e.push_back(st_entry(prefix + w_.names[i], cpu.back()));
      }
    }
    write_safetensors(checkpoint_path(ckpt_dir_, s), e,
                      {{"format", kCheckpointFormat}, {"step", std::to_string(s)},
                       {"config_hash", hash_}, {"name", cfg_.name}});
    auto all = list_checkpoints(ckpt_dir_);  // keep the two newest
    for (size_t i = 0; i + 2 < all.size(); ++i) fs::remove(all[i].second);
  }

  void export_model() {
    const std::string dir = out_ + "/model";
    ModelConfig ec = mc_;
    ec.max_seq_len = cfg_.max_seq_len();
    export_hf_model(w_, ec, tok_path_, dir);
    write_text_file_atomic(dir + "/TRAINING.md", training_summary(cfg_, ec, cj_, log_path_of(out_), step_));
    sum_.model_dir = dir;
    if (!opts_.quiet) std::cerr << "kvbench train: exported " << dir << "\n";
  }

  void print_plan() const {
    std::cerr << "kvbench train: " << cfg_.name << ": " << mc_.parameter_count() << " parameters, vocab "
              << mc_.vocab_size << ", " << data_->train_tokens() << " training / "
              << data_->heldout_tokens() << " held-out text tokens, " << total_ << " steps, "
              << at::get_num_threads() << " threads\n";
  }

  void show_rows() const {
    for (int64_t r = 0; r < opts_.show_rows; ++r) {
      const TrainStage& st = cfg_.stage_at(opts_.show_step);
      auto row = data_->row(opts_.show_step, r, st.seq_len);
      std::cout << "=== step " << opts_.show_step << " row " << r << " (" << row.tokens.size()
                << " tokens, task '" << row.task << "')\n"
                << tok_->decode(row.tokens) << "\n";
    }
  }

  // The log keeps only what the checkpoint covers (a crash after a log line but before the next
  // checkpoint would otherwise repeat steps).
  void open_log() {
    const std::string log_path = log_path_of(out_);
    std::string kept;
    if (fs::exists(log_path)) {
      std::istringstream in(read_text_file(log_path));
      std::string line;
      while (std::getline(in, line)) {
        if (line.empty()) continue;
        try {
          nlohmann::json j;
          if (!parse_json_if_valid(line, log_path, &j)) continue;  // a torn last line
          if (j.value("step", int64_t{0}) <= step_) kept += line + "\n";
        } catch (const nlohmann::json::exception&) {
          // a torn last line from a crash: dropped
        }
      }
    }
    write_text_file_atomic(log_path, kept);
    log_.open(log_path, std::ios::app);
    KVB_CHECK(log_.good(), log_path, ": cannot open for appending");
  }

  double evaluate() {
    at::NoGradGuard ng;
    double nll = 0;
    int64_t n = 0;
    for (const auto& win : heldout_) {
      at::Tensor ids = at::tensor(win, at::kLong).to(dev_).unsqueeze(0);
      const int64_t T = ids.size(1) - 1;
      at::Tensor logits = train_forward(w_, mc_, ids.narrow(1, 0, T), rope_cos_, rope_sin_, dt_);
      nll += at::cross_entropy_loss(logits.view({T, -1}), ids.narrow(1, 1, T).reshape({T}), {},
                                    at::Reduction::Sum)
                 .item<double>();
      n += T;
    }
    return nll / static_cast<double>(n);
  }

  // The induction probe: mean NLL and top-1 accuracy on the second copy of a repeated random id
  // sequence (first id of the copy excluded: it is not predictable). It falls from ~ln(vocab) to
  // ~0 when induction heads form -- the ability every retrieval task rests on -- so the log shows
  // when (and whether) that happened, long before retrieval accuracy moves. Its copy distance is
  // fixed (48), so a model trained only on repeats of that one length could pass it by position
  // alone (configs/models/README.md); repeat_drill varies the length, so a pass means matching.
  std::pair<double, double> induction_probe() {
    at::NoGradGuard ng;
    const int64_t n = probe_n_;
    at::Tensor ids = at::empty({static_cast<int64_t>(probe_rows_.size()), 2 * n + 1}, at::kLong);
    for (size_t r = 0; r < probe_rows_.size(); ++r)
      ids[static_cast<int64_t>(r)].copy_(at::tensor(probe_rows_[r], at::kLong));
    ids = ids.to(dev_);
    at::Tensor logits = train_forward(w_, mc_, ids.narrow(1, 0, 2 * n), rope_cos_, rope_sin_, dt_);
    // Targets of the second copy's ids 2..n: positions n + 1 .. 2n - 1 predict ids n + 2 .. 2n.
    at::Tensor lg = logits.narrow(1, n + 1, n - 1).reshape({-1, mc_.vocab_size});
    at::Tensor tg = ids.narrow(1, n + 2, n - 1).reshape({-1});
    const double nll = at::cross_entropy_loss(lg, tg).item<double>();
    const double top1 = lg.argmax(-1).eq(tg).to(at::kFloat).mean().item<double>();
    return std::make_pair(nll, top1);
  }

  // The step's batch as token ids [batch, seq_len + 1], and per-target loss weights when answers
  // are weighted (target t of a row predicts token t + 1; empty otherwise).
  at::Tensor batch(const TrainStage& st, std::vector<float>* tw) const {
    std::vector<int64_t> flat;
    flat.reserve(static_cast<size_t>(st.batch_size * (st.seq_len + 1)));
    const bool weighted = cfg_.answer_loss_weight != 1.0;
    if (weighted) tw->assign(static_cast<size_t>(st.batch_size * st.seq_len), 1.f);
    for (int64_t r = 0; r < st.batch_size; ++r) {
      auto row = data_->row(step_, r, st.seq_len);
      flat.insert(flat.end(), row.tokens.begin(), row.tokens.end());
      if (weighted && row.answer_begin >= 1)
        for (int64_t j = row.answer_begin; j < row.answer_end; ++j)
          (*tw)[static_cast<size_t>(r * st.seq_len + j - 1)] = static_cast<float>(cfg_.answer_loss_weight);
    }
    return at::tensor(flat, at::kLong).view({st.batch_size, st.seq_len + 1}).to(dev_);
  }

  // The loss to optimise and the unweighted mean (logged, so that it stays comparable across
  // recipes).
  std::pair<at::Tensor, at::Tensor> losses(const TrainStage& st, const at::Tensor& ids,
                                           const std::vector<float>& tw) {
    at::Tensor logits = train_forward(w_, mc_, ids.narrow(1, 0, st.seq_len), rope_cos_, rope_sin_, dt_);
    if (tw.empty()) {
      at::Tensor loss = at::cross_entropy_loss(logits.view({-1, mc_.vocab_size}),
                                               ids.narrow(1, 1, st.seq_len).reshape({-1}));
      return {loss, loss.detach()};
    }
    at::Tensor ce = at::cross_entropy_loss(logits.view({-1, mc_.vocab_size}),
                                           ids.narrow(1, 1, st.seq_len).reshape({-1}), {},
                                           at::Reduction::None);
    at::Tensor wt = at::tensor(tw, at::kFloat).to(dev_).to(ce.scalar_type());
    return {(ce * wt).sum() / wt.sum(), ce.detach().mean()};
  }

  // AdamW with global-norm clipping, on the gradients backward() left; returns the gradient norm.
  double adam_step() {
    at::NoGradGuard ng;
    at::Tensor sq = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(dev_));
    for (auto& t : w_.tensors) sq += t.grad().to(at::kDouble).pow(2).sum();
    const double gnorm = std::sqrt(sq.item<double>());
    const double clip = (cfg_.grad_clip > 0 && gnorm > cfg_.grad_clip) ? cfg_.grad_clip / (gnorm + 1e-6) : 1.0;
    const double lr = lr_at(cfg_, step_);
    const double t1 = static_cast<double>(step_ + 1);
    const double bc1 = 1.0 - std::pow(cfg_.beta1, t1), bc2 = 1.0 - std::pow(cfg_.beta2, t1);
    for (size_t i = 0; i < w_.tensors.size(); ++i) {
      at::Tensor g = w_.tensors[i].grad();
      if (clip != 1.0) g = g * clip;
      adam_.m[i].mul_(cfg_.beta1).add_(g, 1.0 - cfg_.beta1);
      adam_.v[i].mul_(cfg_.beta2).addcmul_(g, g, 1.0 - cfg_.beta2);
      at::Tensor denom = (adam_.v[i] / bc2).sqrt_().add_(cfg_.eps);
      at::Tensor& p = w_.tensors[i];
      if (p.dim() >= 2 && cfg_.weight_decay > 0) p.mul_(1.0 - lr * cfg_.weight_decay);
      p.addcdiv_(adam_.m[i], denom, -lr / bc1);
    }
    return gnorm;
  }

  // One optimiser step on the step's batch; returns the logged loss.
  double train_step(const TrainStage& st) {
    std::vector<float> tw;
    const at::Tensor ids = batch(st, &tw);
    auto [loss, plain] = losses(st, ids, tw);
    for (auto& t : w_.tensors) t.mutable_grad() = at::Tensor();
    loss.backward();
    const double loss_v = plain.item<double>();
    KVB_CHECK(std::isfinite(loss_v), "step ", step_, ": the loss is not finite (", loss_v,
              "); lower optim.lr or raise optim.warmup_steps. Checkpoints up to step ",
              step_ - step_ % cfg_.checkpoint_every, " are kept");
    gnorm_last_ = adam_step();
    return loss_v;
  }

  bool time_to_stop() const {
    if (opts_.stop_after > 0 && step_ - started_at_ >= opts_.stop_after) return true;
    return opts_.max_seconds > 0 && step_ > started_at_ &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count() >= opts_.max_seconds;
  }

  void log_progress(const TrainStage& st) {
    const auto now = std::chrono::steady_clock::now();
    const double dt_s = std::chrono::duration<double>(now - t_last_).count();
    const double elapsed = std::chrono::duration<double>(now - t0_).count();
    const double tps = tokens_since_ / std::max(1e-9, dt_s);
    // From this invocation's own steps: a resumed run's earlier steps took an unknown time.
    const double eta = eta_seconds(elapsed, static_cast<double>(step_ - started_at_),
                                   static_cast<double>(total_ - started_at_));
    sum_.last_loss = loss_sum_ / static_cast<double>(steps_since_);
    nlohmann::json j = {{"step", step_}, {"loss", sum_.last_loss}, {"lr", lr_at(cfg_, step_ - 1)},
                        {"grad_norm", gnorm_last_}, {"seq_len", st.seq_len},
                        {"batch_size", st.batch_size}, {"tok_per_s", tps},
                        {"elapsed_s", elapsed}};
    log_ << j.dump() << "\n" << std::flush;
    if (!opts_.quiet) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s  ETA %s\n",
                    static_cast<long long>(step_), static_cast<long long>(total_), sum_.last_loss,
                    lr_at(cfg_, step_ - 1), gnorm_last_, tps, format_duration(eta).c_str());
      std::cerr << buf;
    }
    loss_sum_ = 0;
    tokens_since_ = 0;
    steps_since_ = 0;
    t_last_ = std::chrono::steady_clock::now();
  }

  void log_evaluation() {
    sum_.heldout_loss = evaluate();
    const auto [ind_nll, ind_top1] =
        probe_n_ >= 4 ? induction_probe() : std::make_pair(std::nan(""), std::nan(""));
    nlohmann::json rec = {{"step", step_}, {"heldout_loss", sum_.heldout_loss},
                          {"heldout_ppl", std::exp(sum_.heldout_loss)}};
    if (probe_n_ >= 4) {
      rec["induction_nll"] = ind_nll;
      rec["induction_top1"] = ind_top1;
    }
    log_ << rec.dump() << "\n" << std::flush;
    if (!opts_.quiet)
      std::cerr << "step " << step_ << "  held-out loss " << sum_.heldout_loss << "  ppl "
                << std::exp(sum_.heldout_loss) << "  induction: repeat " << ind_nll << " nats, top-1 "
                << ind_top1 << "\n";
  }

  void train_loop() {
    t0_ = t_last_ = std::chrono::steady_clock::now();
    started_at_ = step_;
    while (step_ < total_) {
      if (time_to_stop()) break;
      const TrainStage& st = cfg_.stage_at(step_);
      const double loss_v = train_step(st);
      ++step_;
      loss_sum_ += loss_v;
      tokens_since_ += st.batch_size * st.seq_len;
      ++steps_since_;
      if (step_ % cfg_.log_every == 0 || step_ == total_) log_progress(st);
      if (step_ % cfg_.eval_every == 0 || step_ == total_) log_evaluation();
      if (step_ % cfg_.checkpoint_every == 0 || step_ == total_) save_checkpoint(step_);
    }
    if (step_ > started_at_ && step_ % cfg_.checkpoint_every != 0 && step_ != total_) save_checkpoint(step_);
  }

  const TrainOptions& opts_;
  nlohmann::json cj_;
  TrainConfig cfg_;
  std::string out_, ckpt_dir_, data_dir_, hash_, tok_path_;
  std::shared_ptr<Tokenizer> tok_;
  ModelConfig mc_;
  c10::Device dev_ = c10::Device(c10::kCPU);
  c10::ScalarType dt_ = at::kFloat;
  TrainWeights w_;
  Adam adam_;
  int64_t step_ = 0, total_ = 0;
  at::Tensor rope_cos_, rope_sin_;
  std::unique_ptr<TrainData> data_;
  std::ofstream log_;
  std::vector<std::vector<int64_t>> heldout_;
  int64_t probe_n_ = 0;
  std::vector<std::vector<int64_t>> probe_rows_;
  TrainSummary sum_;
  // The loop's running figures between two log lines.
  std::chrono::steady_clock::time_point t0_, t_last_;
  int64_t tokens_since_ = 0, steps_since_ = 0, started_at_ = 0;
  double loss_sum_ = 0, gnorm_last_ = 0;
};

}  // namespace

TrainSummary run_training(const TrainOptions& opts) { return TrainingRun(opts).run(); }

}  // namespace kvb
