#include "harness/model/model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/common/asset_cache.h"
#include "harness/common/error.h"
#include "harness/common/fast_hash.h"
#include "harness/common/internal_error.h"
#include "harness/common/mapped_file.h"
#include "harness/common/strings.h"
#include "harness/formats/finite_check.h"
#include "harness/formats/gguf.h"
#include "harness/formats/llama2c_format.h"
#include "harness/formats/model_family.h"
#include "harness/formats/safetensors.h"
#include "harness/model/huge_page_weights.h"
#include "harness/model/model_files.h"
#include "harness/model/synthetic_presets.h"

namespace kvb {

c10::Device parse_device(const std::string& s) {
  if (s == "cpu") return c10::Device(c10::kCPU);
  if (s == "cuda" || starts_with(s, "cuda:")) {
    KVB_CHECK(at::hasCUDA(), "--device ", s,
              ": this LibTorch build has no CUDA (build against a CUDA LibTorch, see README)");
    int index = 0;
    if (s.size() > 5) {
      char* end = nullptr;
      long v = std::strtol(s.c_str() + 5, &end, 10);
      KVB_CHECK(end && *end == '\0' && v >= 0, "--device ", s, ": bad device index");
      index = static_cast<int>(v);
    }
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  KVB_FAIL("--device '", s, "' is not one of cpu, cuda, cuda:N");
}

c10::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return c10::kFloat;
  if (s == "bf16" || s == "bfloat16") return c10::kBFloat16;
  if (s == "fp16" || s == "float16") return c10::kHalf;
  KVB_FAIL("--dtype '", s, "' is not one of fp32, bf16, fp16");
}

std::string dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return "fp32";
    case c10::kBFloat16:
      return "bf16";
    case c10::kHalf:
      return "fp16";
    default:
      return c10::toString(t);
  }
}

int64_t dtype_bytes(c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

std::vector<std::string> model_search_dirs(const std::string& models_dir) {
  std::vector<std::string> dirs;
  if (!models_dir.empty()) dirs.push_back(models_dir);
  if (const char* env = std::getenv("KVBENCH_MODELS"); env && *env) dirs.push_back(env);
  dirs.push_back("./models");
#ifdef KVB_REPO_MODELS_DIR
  // The models shipped in the repository (models/kvb-testbed), found from any working directory.
  if (std::string(KVB_REPO_MODELS_DIR) != "./models") dirs.push_back(KVB_REPO_MODELS_DIR);
#endif
  dirs.push_back("../shared/models");
  if (const std::string cache = kvb_asset_cache_dir(); !cache.empty()) dirs.push_back(cache + "/models");
  return dirs;
}

std::string resolve_model_path(const std::string& spec, const std::string& models_dir) {
  if (starts_with(spec, "synthetic:")) return spec;
  if (file_exists(spec) || dir_exists(spec)) return spec;
  const bool looks_like_path = spec.find('/') != std::string::npos;
  std::vector<std::string> dirs = model_search_dirs(models_dir);
  if (!looks_like_path) {
    for (const auto& d : dirs) {
      std::string p = d + "/" + spec;
      if (file_exists(p) || dir_exists(p)) return p;
    }
  }
  KVB_FAIL("model '", spec, "' not found", looks_like_path ? "" : " (searched " + join(dirs, ", ") + ")");
}

namespace {

std::vector<std::string> list_dir(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (ends_with(n, suffix)) out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string dir_of(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? "." : path.substr(0, pos);
}

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto pos = p.find_last_of('/');
  return pos == std::string::npos ? p : p.substr(pos + 1);
}

// Refuses a tensor holding NaN or Inf, naming it: a damaged checkpoint otherwise loads and yields NaN
// logits (or, through a softmax that masks them, a plausible but wrong score) far from the cause.
void check_finite(const void* data, int64_t numel, FloatBits bits, const std::string& file,
                  const std::string& name) {
  const int64_t at = first_nonfinite(data, numel, bits);
  KVB_CHECK(at < 0, file, ": tensor '", name, "' holds NaN or Inf (first at flat element ", at,
            " of ", numel, "); the checkpoint is damaged");
}

std::string shape_str(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A view of one safetensors tensor as an at::Tensor in `dtype` on `device` (a copy).
at::Tensor st_to_tensor(const StTensor& t, const std::string& file, at::IntArrayRef want,
                        c10::ScalarType dtype, c10::Device device) {
  c10::ScalarType src;
  FloatBits bits;
  switch (t.dtype) {
    case StDtype::kF32:
      src = c10::kFloat;
      bits = FloatBits::kF32;
      break;
    case StDtype::kF16:
      src = c10::kHalf;
      bits = FloatBits::kF16;
      break;
    case StDtype::kBF16:
      src = c10::kBFloat16;
      bits = FloatBits::kBF16;
      break;
    default:
      KVB_FAIL(file, ": tensor '", t.name, "' has dtype ", st_dtype_name(t.dtype),
               "; weights must be F32, F16 or BF16");
  }
  KVB_CHECK(at::IntArrayRef(t.shape) == want, file, ": tensor '", t.name, "' has shape ",
            shape_str(t.shape), " but config.json implies ", shape_str(want));
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  check_finite(t.data, numel, bits, file, t.name);
  at::Tensor view = at::from_blob(const_cast<uint8_t*>(t.data), t.shape,
                                  at::TensorOptions().dtype(src).device(c10::kCPU));
  return view.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
}

void finish_weights(Model& m) {
  // Norm weights stay fp32: RMSNorm runs in fp32 whatever the model dtype.
  auto& w = m.weights;
  w.final_norm = w.final_norm.to(at::kFloat);
  for (auto& L : w.layers) {
    L.attn_norm = L.attn_norm.to(at::kFloat);
    L.ffn_norm = L.ffn_norm.to(at::kFloat);
    for (at::Tensor* t : {&L.q_norm, &L.k_norm, &L.post_attn_norm, &L.post_ffn_norm})
      if (t->defined()) *t = t->to(at::kFloat);
  }
  if (m.device.is_cpu()) place_weights_in_huge_pages(w);
  // A fixed 8192 positions up front (8192 x head_dim floats, twice), not the declared context: a
  // config may declare millions of positions, and transformer_forward grows the tables on demand.
  m.ensure_rope_len(8192);
}

std::string find_tokenizer(const std::string& dir, int64_t vocab) {
  std::string p = dir + "/tokenizer.model";
  if (file_exists(p)) return p;
  p = dir + "/tok" + std::to_string(vocab) + ".model";
  if (file_exists(p)) return p;
  auto models = list_dir(dir, ".model");
  if (models.size() == 1) return dir + "/" + models[0];
  // A Hugging Face tokenizer.json when there is no SentencePiece model (Llama 3, Qwen2, SmolLM2).
  p = dir + "/tokenizer.json";
  if (file_exists(p)) return p;
  return "";
}

void load_hf(Model& m, const std::string& dir, const LoadOptions& opts) {
  m.config = load_hf_config(dir + "/config.json");
  m.config.name = base_name(dir);
  const ModelConfig& c = m.config;
  SafetensorsSet st(dir);
  const auto dt = m.dtype;
  const auto dev = m.device;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    return st_to_tensor(st.get(name), st.file_of(name), shape, dt, dev);
  };
  // Norm weights in fp32; Gemma's RMSNorm multiplies by (1 + w), computed in fp32 as it does.
  const bool plus_one = family_of(c).gemma_block;
  auto norm = [&](const std::string& name, int64_t n) {
    at::Tensor w = st_to_tensor(st.get(name), st.file_of(name), {n}, at::kFloat, dev);
    return plus_one ? w.add_(1.0) : w;
  };
  const int64_t D = c.dim, F = c.hidden_dim, Q = c.q_dim(), KV = c.kv_dim(), V = c.vocab_size;
  const int64_t HD = c.head_dim;
  m.weights.embedding = get("model.embed_tokens.weight", {V, D});
  m.weights.final_norm = norm("model.norm.weight", D);
  if (c.tied_embeddings) {
    m.weights.lm_head = m.weights.embedding;
  } else {
    m.weights.lm_head = get("lm_head.weight", {V, D});
  }
  const bool fused = family_of(c).fused_projections;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = norm(p + "input_layernorm.weight", D);
    // Phi-3 stores q/k/v and gate/up fused, in the engine's row order already.
    if (fused) {
      L.wqkv = get(p + "self_attn.qkv_proj.weight", {Q + 2 * KV, D});
    } else {
      L.wqkv = at::cat({get(p + "self_attn.q_proj.weight", {Q, D}),
                        get(p + "self_attn.k_proj.weight", {KV, D}),
                        get(p + "self_attn.v_proj.weight", {KV, D})});
    }
    if (c.qkv_bias) {
      L.bqkv = at::cat({get(p + "self_attn.q_proj.bias", {Q}), get(p + "self_attn.k_proj.bias", {KV}),
                        get(p + "self_attn.v_proj.bias", {KV})});
    }
    if (c.qk_norm) {
      L.q_norm = norm(p + "self_attn.q_norm.weight", HD);
      L.k_norm = norm(p + "self_attn.k_norm.weight", HD);
    }
    L.wo = get(p + "self_attn.o_proj.weight", {D, Q});
    if (c.post_norms) {
      // Gemma 3: post_attention_layernorm is on the attention output; the feed-forward's input
      // norm is pre_feedforward_layernorm.
      L.post_attn_norm = norm(p + "post_attention_layernorm.weight", D);
      L.ffn_norm = norm(p + "pre_feedforward_layernorm.weight", D);
      L.post_ffn_norm = norm(p + "post_feedforward_layernorm.weight", D);
    } else {
      L.ffn_norm = norm(p + "post_attention_layernorm.weight", D);
    }
    if (fused) {
      L.w13 = get(p + "mlp.gate_up_proj.weight", {2 * F, D});
    } else {
      L.w13 = at::cat({get(p + "mlp.gate_proj.weight", {F, D}), get(p + "mlp.up_proj.weight", {F, D})});
    }
    L.w2 = get(p + "mlp.down_proj.weight", {D, F});
    m.weights.layers.push_back(std::move(L));
  }
  m.tokenizer_path = find_tokenizer(dir, c.vocab_size);
}

void load_llama2c(Model& m, const std::string& path) {
  MappedFile file(path);
  Llama2cLayout L = parse_llama2c_header(file.data(), file.size(), path);
  m.config = L.config;
  std::string stem = base_name(path);
  if (ends_with(stem, ".bin")) stem = stem.substr(0, stem.size() - 4);
  m.config.name = stem;
  const float* base = reinterpret_cast<const float*>(file.data() + 28);
  auto arr = [&](const std::string& name) -> at::Tensor {
    for (const auto& a : L.arrays) {
      if (a.name == name) {
        int64_t numel = 1;
        for (int64_t d : a.shape) numel *= d;
        check_finite(base + a.offset_floats, numel, FloatBits::kF32, path, name);
        at::Tensor v = at::from_blob(const_cast<float*>(base + a.offset_floats), a.shape,
                                     at::TensorOptions().dtype(at::kFloat));
        return v.to(m.device, m.dtype, false, /*copy=*/true);
      }
    }
    KVB_UNREACHABLE("model", path, ": no array '", name, "'");
  };
  auto& w = m.weights;
  w.embedding = arr("token_embedding");
  w.final_norm = arr("rms_final");
  w.lm_head = L.shared_classifier ? w.embedding : arr("wcls");
  at::Tensor rms_att = arr("rms_att"), wq = arr("wq"), wk = arr("wk"), wv = arr("wv"),
             wo = arr("wo"), rms_ffn = arr("rms_ffn"), w1 = arr("w1"), w2 = arr("w2"),
             w3 = arr("w3");
  for (int64_t l = 0; l < m.config.n_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = rms_att[l].clone();
    lw.wqkv = at::cat({wq[l], wk[l], wv[l]});
    lw.wo = wo[l].clone();
    lw.ffn_norm = rms_ffn[l].clone();
    lw.w13 = at::cat({w1[l], w3[l]});
    lw.w2 = w2[l].clone();
    w.layers.push_back(std::move(lw));
  }
  m.tokenizer_path = find_tokenizer(dir_of(path), m.config.vocab_size);
}

// A GGUF checkpoint (llama.cpp's format, usually quantized): every tensor is dequantized to fp32
// one at a time, then cast to the load dtype and fused as load_hf fuses, so that the peak is the
// model in its load dtype plus one layer's fp32 temporaries (the file itself is mapped, not read).
void load_gguf(Model& m, const std::string& path) {
  GgufFile f(path);
  m.config = gguf_model_config(f);
  std::string stem = base_name(path);
  if (ends_with(stem, ".gguf")) stem = stem.substr(0, stem.size() - 5);
  m.config.name = stem;
  const ModelConfig& c = m.config;
  std::set<std::string> used;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    const GgufTensor& t = f.tensor(name);
    KVB_CHECK(t.shape() == shape, path, ": tensor '", name, "' has shape ", shape_str(t.shape()),
              " but the metadata implies ", shape_str(shape));
    used.insert(name);
    at::Tensor out = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
    gguf_dequantize(t, out.data_ptr<float>());
    check_finite(out.data_ptr<float>(), out.numel(), FloatBits::kF32, path, name);
    return out.to(m.device, m.dtype);
  };
  const int64_t D = c.dim, F = c.hidden_dim, Q = c.q_dim(), KV = c.kv_dim(), V = c.vocab_size;
  const int64_t HD = c.head_dim;
  auto& w = m.weights;
  // Norm weights as stored: llama.cpp's converter has already added Gemma's 1 to every
  // "*norm.weight" (its RMSNorm multiplies by w), so nothing is folded here as load_hf folds it.
  w.embedding = get("token_embd.weight", {V, D});
  w.final_norm = get("output_norm.weight", {D});
  w.lm_head = c.tied_embeddings ? w.embedding : get("output.weight", {V, D});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights L;
    L.attn_norm = get(p + "attn_norm.weight", {D});
    // Phi-3's converter keeps qkv_proj fused (attn_qkv, q rows then k then v: the engine's
    // layout); the others write q, k and v apart. llama.cpp accepts either for every family.
    if (f.has_tensor(p + "attn_qkv.weight")) {
      L.wqkv = get(p + "attn_qkv.weight", {Q + 2 * KV, D});
    } else {
      L.wqkv = at::cat({get(p + "attn_q.weight", {Q, D}), get(p + "attn_k.weight", {KV, D}),
                        get(p + "attn_v.weight", {KV, D})});
    }
    if (c.qkv_bias) {
      if (f.has_tensor(p + "attn_qkv.bias")) {
        L.bqkv = get(p + "attn_qkv.bias", {Q + 2 * KV});
      } else {
        L.bqkv = at::cat({get(p + "attn_q.bias", {Q}), get(p + "attn_k.bias", {KV}),
                          get(p + "attn_v.bias", {KV})});
      }
    }
    if (c.qk_norm) {
      L.q_norm = get(p + "attn_q_norm.weight", {HD});
      L.k_norm = get(p + "attn_k_norm.weight", {HD});
    }
    L.wo = get(p + "attn_output.weight", {D, Q});
    // Gemma 3: ffn_norm is the feed-forward's input norm (pre_feedforward_layernorm), and the
    // sublayer outputs have their own norms.
    L.ffn_norm = get(p + "ffn_norm.weight", {D});
    if (c.post_norms) {
      L.post_attn_norm = get(p + "post_attention_norm.weight", {D});
      L.post_ffn_norm = get(p + "post_ffw_norm.weight", {D});
    }
    // Phi-3's gate_up_proj stays fused as ffn_up [2F, D], gate rows first (llama.cpp's SwiGLU
    // halves it so): the engine's w13 as it is.
    if (!f.has_tensor(p + "ffn_gate.weight") && family_of(c).fused_projections) {
      L.w13 = get(p + "ffn_up.weight", {2 * F, D});
    } else {
      L.w13 = at::cat({get(p + "ffn_gate.weight", {F, D}), get(p + "ffn_up.weight", {F, D})});
    }
    L.w2 = get(p + "ffn_down.weight", {D, F});
    w.layers.push_back(std::move(L));
  }
  // RoPE frequency factors were read into the config (gguf_model_config).
  for (const char* t :
       {"rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"})
    if (f.has_tensor(t)) used.insert(t);
  // A tensor the mapping did not read is a part of the model the engine would leave out (a bias,
  // a norm, a rerank head): refuse the file rather than run something else.
  for (const GgufTensor& t : f.tensors()) {
    KVB_CHECK(used.count(t.name) != 0, path, ": tensor '", t.name, "' is not part of the ",
              f.get_string("general.architecture"),
              " model kvbench computes (general.architecture's tensors), so it is not supported");
  }
  // The tokenizer is in the file's metadata (tokenizer.ggml.*).
  m.tokenizer_path = path;
}

void load_synthetic(Model& m, const std::string& preset, const LoadOptions& opts) {
  m.config = synthetic_preset(preset);
  const ModelConfig& c = m.config;
  // Weights come from one CPU generator whatever the device, so a preset + seed gives the same
  // weights on every machine. Init keeps activations O(1): N(0, 1/fan_in) for inputs, and the two
  // residual-writing projections scaled down by sqrt(2 * n_layers) so the stream grows slowly.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(opts.synthetic_seed ^ 0x6b76626e63680001ull);
  auto randn = [&](std::vector<int64_t> shape, double std) {
    at::Tensor t = at::normal(0.0, std, shape, gen, at::TensorOptions().dtype(at::kFloat));
    return t.to(m.device, m.dtype);
  };
  const int64_t D = c.dim, F = c.hidden_dim, Q = c.q_dim(), KV = c.kv_dim(), V = c.vocab_size;
  const double in_std = 1.0 / std::sqrt(static_cast<double>(D));
  const double res_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  auto& w = m.weights;
  w.embedding = randn({V, D}, 1.0);
  w.final_norm = at::ones({D}, at::TensorOptions().dtype(at::kFloat).device(m.device));
  w.lm_head = c.tied_embeddings ? w.embedding : randn({V, D}, in_std);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerWeights L;
    L.attn_norm = at::ones({D}, at::TensorOptions().dtype(at::kFloat).device(m.device));
    L.ffn_norm = L.attn_norm.clone();
    L.wqkv = randn({Q + 2 * KV, D}, in_std);
    if (c.qkv_bias) L.bqkv = randn({Q + 2 * KV}, 0.02);
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(m.device);
    if (c.qk_norm) {
      L.q_norm = at::ones({c.head_dim}, f32);
      L.k_norm = at::ones({c.head_dim}, f32);
    }
    if (c.post_norms) {
      L.post_attn_norm = at::ones({D}, f32);
      L.post_ffn_norm = at::ones({D}, f32);
    }
    L.wo = randn({D, Q}, res_scale / std::sqrt(static_cast<double>(Q)));
    L.w13 = randn({2 * F, D}, in_std);
    L.w2 = randn({D, F}, res_scale / std::sqrt(static_cast<double>(F)));
    w.layers.push_back(std::move(L));
  }
}

struct ModelFiles {
  std::string format;  // hf | llama2c | gguf
  std::string path;    // the HF directory, or the .bin / .gguf file
};

// Which checkpoint a (resolved, non-synthetic) path is. A directory: Hugging Face (config.json +
// safetensors), else one llama2.c .bin, else one .gguf. A GGUF download often comes with the upstream
// config.json and tokenizer.json but no safetensors, so config.json alone does not make it a Hugging
// Face directory.
ModelFiles locate_model_files(const std::string& path) {
  if (file_exists(path)) return {ends_with(path, ".gguf") ? "gguf" : "llama2c", path};
  KVB_CHECK(dir_exists(path), path, ": neither a file nor a directory");
  const std::vector<std::string> ggufs = list_dir(path, ".gguf");
  const bool safetensors = file_exists(path + "/model.safetensors") ||
                           file_exists(path + "/model.safetensors.index.json");
  // A llama2.c model directory also holds tokenizer exports (tok512.bin, tokenizer.bin): skip them.
  std::vector<std::string> bins;
  for (const auto& b : list_dir(path, ".bin"))
    if (!starts_with(b, "tok")) bins.push_back(b);
  if (file_exists(path + "/config.json") && (safetensors || ggufs.empty())) return {"hf", path};
  if (!bins.empty() || ggufs.empty()) {
    KVB_CHECK(bins.size() == 1, path, ": no config.json, and ",
              bins.empty() ? "no llama2.c .bin file and no .gguf file"
                           : "several .bin files (name one)");
    return {"llama2c", path + "/" + bins[0]};
  }
  KVB_CHECK(ggufs.size() == 1, path, ": several .gguf files (", join(ggufs, ", "), "): name one");
  return {"gguf", path + "/" + ggufs[0]};
}

}  // namespace

namespace {
void refuse_switching_rope(const ModelConfig& c) {
  KVB_CHECK(!c.rope_scaling.switches(), c.name, ": RoPE scaling '", c.rope_scaling.type,
            "' switches between two frequency sets with the sequence length, so rotating keys "
            "outside the engine (re-rotation, splicing, calibration) is not supported on it");
}
}  // namespace

RopeFactors rope_factors_for_length(const ModelConfig& c, int64_t length) {
  return c.rope_scaling.switches() && length > c.rope_scaling.original_max_position_embeddings
             ? RopeFactors::kLong
             : RopeFactors::kShort;
}

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  refuse_switching_rope(c);
  return rope_inv_freq(c, RopeFactors::kShort);
}

std::vector<double> rope_inv_freq(const ModelConfig& c, RopeFactors set) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / c.head_dim);
  }
  const auto& rs = c.rope_scaling;
  if (rs.type == "llama3") {
    // Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
    const double old_len = static_cast<double>(rs.original_max_position_embeddings);
    const double low_wavelen = old_len / rs.low_freq_factor;
    const double high_wavelen = old_len / rs.high_freq_factor;
    for (auto& f : inv_freq) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f = f / rs.factor;
      } else {
        const double smooth =
            (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
    }
  } else if (rs.type == "linear") {
    for (auto& f : inv_freq) f /= rs.factor;
  } else if (rs.type == "factors" || rs.type == "longrope") {
    // One divisor per frequency: a GGUF's rope_freqs (llama.cpp divides theta by it), or
    // LongRoPE's short / long set (transformers: 1 / (factor * base^(2i/d))).
    const std::vector<double>& d =
        set == RopeFactors::kLong && rs.type == "longrope" ? rs.long_factors : rs.factors;
    KVB_ASSERT(static_cast<int64_t>(d.size()) == half, "rope", "frequency factors of size ",
               d.size(), " for head_dim ", c.head_dim);
    for (int64_t i = 0; i < half; ++i) inv_freq[i] /= d[i];
  }
  return inv_freq;
}

void compute_rope_tables(const ModelConfig& c, int64_t n_pos, at::Tensor* cos, at::Tensor* sin) {
  refuse_switching_rope(c);
  compute_rope_tables(c, n_pos, RopeFactors::kShort, cos, sin);
}

void compute_rope_tables(const ModelConfig& c, int64_t n_pos, RopeFactors set, at::Tensor* cos,
                         at::Tensor* sin) {
  const int64_t half = c.head_dim / 2;
  const std::vector<double> inv_freq = rope_inv_freq(c, set);
  // LongRoPE's attention factor scales cos and sin (so q and k) in both regimes, as transformers'
  // rotary embedding and llama.cpp's rope attn_factor do.
  const double scale = c.rope_scaling.switches() ? c.rope_scaling.attention_factor : 1.0;
  at::Tensor cs = at::empty({n_pos, half}, at::kFloat), sn = at::empty({n_pos, half}, at::kFloat);
  float* pc = cs.data_ptr<float>();
  float* ps = sn.data_ptr<float>();
  for (int64_t p = 0; p < n_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * inv_freq[i];
      pc[p * half + i] = static_cast<float>(scale * std::cos(a));
      ps[p * half + i] = static_cast<float>(scale * std::sin(a));
    }
  }
  *cos = cs;
  *sin = sn;
}

ModelConfig local_rope_config(const ModelConfig& c) {
  ModelConfig l = c;
  l.rope_theta = c.rope_local_theta;
  l.rope_scaling = RopeScaling{};
  return l;
}

void Model::ensure_rope_len(int64_t n) {
  if (weights.rope_cos.defined() && weights.rope_positions() >= n) return;
  const int64_t len = std::max<int64_t>(n, std::max<int64_t>(2 * weights.rope_positions(), 1024));
  at::Tensor c, s;
  if (config.rope_scaling.switches()) {
    // Both of LongRoPE's tables, one after the other (ModelWeights::rope_long_row).
    at::Tensor cl, sl;
    compute_rope_tables(config, len, RopeFactors::kShort, &c, &s);
    compute_rope_tables(config, len, RopeFactors::kLong, &cl, &sl);
    c = at::cat({c, cl});
    s = at::cat({s, sl});
    weights.rope_long_row = len;
  } else {
    compute_rope_tables(config, len, &c, &s);
  }
  weights.rope_cos = c.to(device);
  weights.rope_sin = s.to(device);
  if (config.rope_local_theta > 0 && config.n_window_layers() > 0) {
    compute_rope_tables(local_rope_config(config), len, &c, &s);
    weights.rope_cos_local = c.to(device);
    weights.rope_sin_local = s.to(device);
  }
}

int64_t Model::weight_bytes() const {
  int64_t b = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined()) b += t.numel() * static_cast<int64_t>(t.element_size());
  };
  add(weights.embedding);
  add(weights.final_norm);
  if (!config.tied_embeddings) add(weights.lm_head);
  for (const auto& L : weights.layers) {
    add(L.attn_norm);
    add(L.wqkv);
    add(L.bqkv);
    add(L.wo);
    add(L.ffn_norm);
    add(L.w13);
    add(L.w2);
    add(L.q_norm);
    add(L.k_norm);
    add(L.post_attn_norm);
    add(L.post_ffn_norm);
  }
  return b;
}

LazyString& LazyString::operator=(const LazyString&) {
  std::lock_guard<std::mutex> lock(mu_);
  value_.clear();
  done_ = false;
  return *this;
}

namespace {

void hash_tensor(FastHash& h, const char* name, const at::Tensor& t) {
  h.update_field(name);
  if (!t.defined()) {
    h.update_field("undefined");
    return;
  }
  h.update_field(c10::toString(t.scalar_type()));
  for (int64_t s : t.sizes()) h.update(&s, sizeof(s));
  const at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
  h.update(c.data_ptr(), static_cast<size_t>(c.nbytes()));
}

}  // namespace

std::string Model::content_hash() const {
  return content_hash_.get([this] {
    nlohmann::json cfg = config.to_json();
    cfg.erase("name");  // the directory's name does not change what the model computes
    FastHash h;
    h.update_field(cfg.dump());
    h.update_field(dtype_name(dtype));
    hash_tensor(h, "embedding", weights.embedding);
    hash_tensor(h, "final_norm", weights.final_norm);
    // A tied head shares the embedding's storage (and the config says it is tied).
    if (!config.tied_embeddings) hash_tensor(h, "lm_head", weights.lm_head);
    for (const LayerWeights& L : weights.layers) {
      hash_tensor(h, "attn_norm", L.attn_norm);
      hash_tensor(h, "wqkv", L.wqkv);
      hash_tensor(h, "bqkv", L.bqkv);
      hash_tensor(h, "wo", L.wo);
      hash_tensor(h, "ffn_norm", L.ffn_norm);
      hash_tensor(h, "w13", L.w13);
      hash_tensor(h, "w2", L.w2);
      hash_tensor(h, "q_norm", L.q_norm);
      hash_tensor(h, "k_norm", L.k_norm);
      hash_tensor(h, "post_attn_norm", L.post_attn_norm);
      hash_tensor(h, "post_ffn_norm", L.post_ffn_norm);
    }
    return h.hex_digest();
  });
}

std::string Model::tokenizer_hash() const {
  return tokenizer_hash_.get([this] {
    return tokenizer_path.empty() ? std::string() : fast_hash_file_hex(tokenizer_path);
  });
}

std::shared_ptr<Model> load_model(const std::string& spec, const LoadOptions& opts) {
  auto m = std::make_shared<Model>();
  m->device = parse_device(opts.device);
  m->dtype = parse_dtype(opts.dtype);
  if (m->device.is_cpu() && m->dtype == c10::kHalf) {
    // Older CPU LibTorch builds (Debian's 1.13) have no fp16 matmul: say so up front, not mid-run.
    try {
      at::Tensor a = at::ones({2, 2}, at::TensorOptions().dtype(c10::kHalf));
      (void)at::mm(a, a);
    } catch (const std::exception&) {
      KVB_FAIL("--dtype fp16: this LibTorch has no fp16 matmul on the CPU; use bf16 or fp32 on the "
               "CPU (fp16 runs on CUDA)");
    }
  }
  const std::string path = resolve_model_path(spec, opts.models_dir);
  m->source = path;
  if (starts_with(path, "synthetic:")) {
    load_synthetic(*m, path.substr(10), opts);
  } else {
    const ModelFiles f = locate_model_files(path);
    m->source = f.path;
    if (f.format == "hf") load_hf(*m, f.path, opts);
    else if (f.format == "gguf") load_gguf(*m, f.path);
    else load_llama2c(*m, f.path);
  }
  if (opts.rope_table_len > 0) m->ensure_rope_len(opts.rope_table_len);
  finish_weights(*m);
  return m;
}

namespace {

void add_file_identity(FastHash& h, const std::string& path) {
  struct stat st {};
  KVB_CHECK(::stat(path.c_str(), &st) == 0, path, ": cannot stat: ", std::strerror(errno));
  h.update_field(path);
  for (const int64_t v : {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_ino),
                          static_cast<int64_t>(st.st_mtim.tv_sec), static_cast<int64_t>(st.st_mtim.tv_nsec),
                          static_cast<int64_t>(st.st_ctim.tv_sec), static_cast<int64_t>(st.st_ctim.tv_nsec)})
    h.update(&v, sizeof v);
}

}  // namespace

std::string model_files_identity(const std::string& spec, const std::string& models_dir) {
  const std::string path = resolve_model_path(spec, models_dir);
  if (starts_with(path, "synthetic:")) return "";
  const ModelFiles f = locate_model_files(path);
  FastHash h;
  if (f.format == "hf") {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(f.path))
      if (e.is_regular_file()) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) add_file_identity(h, n);
  } else {
    add_file_identity(h, f.path);
    const std::string tok = resolve_tokenizer_path(spec, models_dir);
    if (tok != f.path) add_file_identity(h, tok);
  }
  return h.hex_digest();
}

std::string resolve_tokenizer_path(const std::string& spec, const std::string& models_dir) {
  // The same dispatch as load_model, reading only config.json or the llama2.c header for the vocab.
  const std::string path = resolve_model_path(spec, models_dir);
  KVB_CHECK(!starts_with(path, "synthetic:"), path, ": a synthetic model has no tokenizer");
  const ModelFiles f = locate_model_files(path);
  if (f.format == "gguf") return f.path;  // the GGUF carries its vocabulary
  std::string tok;
  if (f.format == "hf") {
    tok = find_tokenizer(f.path, load_hf_config(f.path + "/config.json").vocab_size);
  } else {
    MappedFile file(f.path);
    const Llama2cLayout L = parse_llama2c_header(file.data(), file.size(), f.path);
    tok = find_tokenizer(dir_of(f.path), L.config.vocab_size);
  }
  KVB_CHECK(!tok.empty(), path, ": no tokenizer.model or tokenizer.json found beside the model");
  return tok;
}

ModelConfig read_model_config(const std::string& spec, const std::string& models_dir) {
  // The same dispatch as load_model, reading only the parts that hold the config.
  const std::string path = resolve_model_path(spec, models_dir);
  if (starts_with(path, "synthetic:")) return synthetic_preset(path.substr(10));
  const ModelFiles f = locate_model_files(path);
  if (f.format == "hf") return load_hf_config(f.path + "/config.json");
  if (f.format == "gguf") return gguf_model_config(GgufFile(f.path));
  MappedFile file(f.path);
  return parse_llama2c_header(file.data(), file.size(), f.path).config;
}

}  // namespace kvb
