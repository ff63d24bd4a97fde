#include "methods/dms/dms_adapter.h"

#include <ATen/ATen.h>

#include "harness/common/error.h"
#include "methods/common/adapter_file.h"

namespace kvb::dms {

namespace {

std::string lname(int64_t l, const char* part) {
  return "layers." + std::to_string(l) + "." + part;
}

const char* const kKind = "dms-adapter";  // the file's metadata 'kind'

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
  const SafetensorsFile f = open_adapter(path, kKind, "DMS");
  const auto& m = f.metadata();
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
    a.norm.push_back(adapter_tensor(f, lname(l, "norm")));
    a.weight.push_back(adapter_tensor(f, lname(l, "weight")));
    a.bias.push_back(adapter_tensor(f, lname(l, "bias")));
    KVB_CHECK(a.norm.back().sizes() == at::IntArrayRef({c.dim}) &&
                  a.weight.back().sizes() == at::IntArrayRef({c.n_kv_heads, c.dim}) &&
                  a.bias.back().sizes() == at::IntArrayRef({c.n_kv_heads}),
              path, ": layer ", l, " tensors have the wrong shapes");
  }
  for (const auto& [k, v] : m) a.info[k] = v;
  return a;
}

void Adapter::save(const std::string& path, const std::map<std::string, std::string>& extra) const {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (size_t l = 0; l < norm.size(); ++l) {
    const auto layer = static_cast<int64_t>(l);
    tensors.emplace_back(lname(layer, "norm"), norm[l]);
    tensors.emplace_back(lname(layer, "weight"), weight[l]);
    tensors.emplace_back(lname(layer, "bias"), bias[l]);
  }
  std::map<std::string, std::string> meta = extra;
  meta["window"] = std::to_string(window);
  meta["scale"] = std::to_string(scale);
  meta["offset"] = std::to_string(offset);
  meta["n_layers"] = std::to_string(norm.size());
  meta["dim"] = std::to_string(norm.empty() ? 0 : norm[0].size(0));
  meta["n_kv_heads"] = std::to_string(bias.empty() ? 0 : bias[0].size(0));
  write_adapter(path, kKind, tensors, std::move(meta));
}

at::Tensor Adapter::alpha(int64_t layer, const at::Tensor& x) const {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor h = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + norm_eps) * norm[layer];
  return at::linear(h, weight[layer], bias[layer]) * scale + offset;
}

}  // namespace kvb::dms
