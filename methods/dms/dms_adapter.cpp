#include "methods/dms/dms_adapter.h"

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "harness/formats/safetensors.h"
#include "harness/formats/safetensors_writer.h"

namespace kvb::dms {

namespace {

std::string lname(int64_t l, const char* part) {
  return "layers." + std::to_string(l) + "." + part;
}

at::Tensor to_tensor(const StTensor& t, const std::string& path) {
  KVB_CHECK(t.dtype == StDtype::kF32, path, ": tensor '", t.name, "' is not F32");
  return at::from_blob(const_cast<uint8_t*>(t.data), t.shape, at::TensorOptions().dtype(at::kFloat))
      .clone();
}

double meta_number(const std::map<std::string, std::string>& m, const std::string& key,
                   const std::string& path) {
  auto it = m.find(key);
  KVB_CHECK(it != m.end(), path, ": DMS adapter metadata lacks '", key, "'");
  try {
    return std::stod(it->second);
  } catch (const std::exception&) {
    KVB_FAIL(path, ": DMS adapter metadata '", key, "' is not a number ('", it->second, "')");
  }
}

}  // namespace

Adapter Adapter::fresh(const ModelConfig& c, int64_t window) {
  Adapter a;
  a.window = window;
  a.norm_eps = c.norm_eps;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    a.norm.push_back(at::ones({c.dim}));
    a.weight.push_back(at::zeros({c.n_kv_heads, c.dim}));
    a.bias.push_back(at::zeros({c.n_kv_heads}));
  }
  return a;
}

Adapter Adapter::load(const std::string& path, const ModelConfig& c) {
  SafetensorsFile f(path);
  const auto& m = f.metadata();
  auto kind = m.find("kind");
  KVB_CHECK(kind != m.end() && kind->second == "dms-adapter", path,
            ": not a DMS adapter (metadata 'kind' is not 'dms-adapter')");
  Adapter a;
  a.window = static_cast<int64_t>(meta_number(m, "window", path));
  a.scale = meta_number(m, "scale", path);
  a.offset = meta_number(m, "offset", path);
  a.norm_eps = c.norm_eps;
  KVB_CHECK(static_cast<int64_t>(meta_number(m, "n_layers", path)) == c.n_layers &&
                static_cast<int64_t>(meta_number(m, "dim", path)) == c.dim &&
                static_cast<int64_t>(meta_number(m, "n_kv_heads", path)) == c.n_kv_heads,
            path, ": the DMS adapter was made for ", m.at("n_layers"), " layers, dim ", m.at("dim"),
            ", ", m.at("n_kv_heads"), " KV heads; the model ", c.name, " has ", c.n_layers, ", ",
            c.dim, ", ", c.n_kv_heads);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    a.norm.push_back(to_tensor(f.get(lname(l, "norm")), path));
    a.weight.push_back(to_tensor(f.get(lname(l, "weight")), path));
    a.bias.push_back(to_tensor(f.get(lname(l, "bias")), path));
    KVB_CHECK(a.norm.back().sizes() == at::IntArrayRef({c.dim}) &&
                  a.weight.back().sizes() == at::IntArrayRef({c.n_kv_heads, c.dim}) &&
                  a.bias.back().sizes() == at::IntArrayRef({c.n_kv_heads}),
              path, ": layer ", l, " tensors have the wrong shapes");
  }
  for (const auto& [k, v] : m) a.info[k] = v;
  return a;
}

void Adapter::save(const std::string& path, const std::map<std::string, std::string>& extra) const {
  std::vector<at::Tensor> keep;
  std::vector<StWriteEntry> entries;
  for (size_t l = 0; l < norm.size(); ++l)
    for (auto [part, t] : {std::pair<const char*, const at::Tensor*>{"norm", &norm[l]},
                           {"weight", &weight[l]},
                           {"bias", &bias[l]}}) {
      keep.push_back(t->detach().to(at::kCPU, at::kFloat).contiguous());
      StWriteEntry e;
      e.name = lname(static_cast<int64_t>(l), part);
      e.dtype = StDtype::kF32;
      e.shape = keep.back().sizes().vec();
      e.data = keep.back().data_ptr<float>();
      e.nbytes = static_cast<size_t>(keep.back().numel()) * sizeof(float);
      entries.push_back(e);
    }
  std::map<std::string, std::string> meta = extra;
  meta["kind"] = "dms-adapter";
  meta["window"] = std::to_string(window);
  meta["scale"] = std::to_string(scale);
  meta["offset"] = std::to_string(offset);
  meta["n_layers"] = std::to_string(norm.size());
  meta["dim"] = std::to_string(norm.empty() ? 0 : norm[0].size(0));
  meta["n_kv_heads"] = std::to_string(bias.empty() ? 0 : bias[0].size(0));
  write_safetensors(path, entries, meta);
}

at::Tensor Adapter::alpha(int64_t layer, const at::Tensor& x) const {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor h = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + norm_eps) * norm[layer];
  return at::linear(h, weight[layer], bias[layer]) * scale + offset;
}

}  // namespace kvb::dms
