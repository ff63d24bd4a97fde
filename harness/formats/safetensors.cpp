#include "harness/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "harness/common/error.h"
#include "harness/common/json_parse.h"

namespace kvb {

namespace {

struct DtypeEntry {
  const char* name;
  StDtype dtype;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {"F32", StDtype::kF32, 4}, {"F16", StDtype::kF16, 2}, {"BF16", StDtype::kBF16, 2},
    {"F64", StDtype::kF64, 8}, {"I64", StDtype::kI64, 8}, {"I32", StDtype::kI32, 4},
    {"I16", StDtype::kI16, 2}, {"I8", StDtype::kI8, 1},   {"U8", StDtype::kU8, 1},
    {"BOOL", StDtype::kBool, 1},
};

// A header larger than this is not a real checkpoint header (the largest real ones are a few MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

}  // namespace

const char* st_dtype_name(StDtype d) {
  for (const auto& e : kDtypes)
    if (e.dtype == d) return e.name;
  return "?";
}

size_t st_dtype_size(StDtype d) {
  for (const auto& e : kDtypes)
    if (e.dtype == d) return e.size;
  return 0;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : file_(std::make_shared<MappedFile>(path)) {
  const size_t size = file_->size();
  KVB_CHECK(size >= 8, path, ": truncated safetensors file (", size,
            " bytes; the 8-byte header length is missing)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_->data()[i];
  KVB_CHECK(header_len <= size - 8, path, ": header length ", header_len,
            " goes beyond the end of the file (", size, " bytes)");
  KVB_CHECK(header_len <= kMaxHeaderBytes, path, ": header length ", header_len,
            " is implausibly large");
  const char* header = reinterpret_cast<const char*>(file_->data() + 8);
  const nlohmann::json j = parse_json(std::string_view(header, header_len), path + ": header");
  KVB_CHECK(j.is_object(), path, ": header is not a JSON object");

  const uint8_t* data_start = file_->data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      KVB_CHECK(v.is_object(), path, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        KVB_CHECK(m.value().is_string(), path, ": __metadata__ value '", m.key(),
                  "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    KVB_CHECK(v.is_object(), path, ": tensor '", name, "': entry is not an object");
    KVB_CHECK(v.contains("dtype") && v["dtype"].is_string(), path, ": tensor '", name,
              "': missing or non-string 'dtype'");
    KVB_CHECK(v.contains("shape") && v["shape"].is_array(), path, ": tensor '", name,
              "': missing or non-array 'shape'");
    KVB_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() &&
                  v["data_offsets"].size() == 2,
              path, ": tensor '", name, "': 'data_offsets' must be [begin, end]");

    StTensor t;
    t.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    const DtypeEntry* entry = nullptr;
    for (const auto& e : kDtypes)
      if (dt == e.name) entry = &e;
    KVB_CHECK(entry != nullptr, path, ": tensor '", name, "': unknown dtype '", dt, "'");
    t.dtype = entry->dtype;

    uint64_t numel = 1;
    for (const auto& s : v["shape"]) {
      KVB_CHECK(s.is_number_unsigned() || (s.is_number_integer() && s.get<int64_t>() >= 0), path,
                ": tensor '", name, "': shape entries must be non-negative integers");
      uint64_t d = s.get<uint64_t>();
      KVB_CHECK(d == 0 || numel <= std::numeric_limits<uint64_t>::max() / d / 8, path,
                ": tensor '", name, "': shape overflows");
      numel *= d;
      t.shape.push_back(static_cast<int64_t>(d));
    }
    for (const auto& o : v["data_offsets"])
      KVB_CHECK(o.is_number_unsigned() || (o.is_number_integer() && o.get<int64_t>() >= 0), path,
                ": tensor '", name, "': data_offsets must be non-negative integers");
    const uint64_t begin = v["data_offsets"][0].get<uint64_t>();
    const uint64_t end = v["data_offsets"][1].get<uint64_t>();
    KVB_CHECK(begin <= end, path, ": tensor '", name, "': data_offsets [", begin, ", ", end,
              "] are reversed");
    KVB_CHECK(end <= data_size, path, ": tensor '", name, "': data_offsets [", begin, ", ", end,
              "] are out of range (data section is ", data_size, " bytes)");
    const uint64_t want = numel * entry->size;
    KVB_CHECK(end - begin == want, path, ": tensor '", name, "': ", dt, " x ", v["shape"].dump(),
              " needs ", want, " bytes but data_offsets span ", end - begin);
    t.data = data_start + begin;
    t.nbytes = static_cast<size_t>(want);
    auto [pos, inserted] = tensors_.emplace(name, std::move(t));
    (void)inserted;  // JSON object keys are unique after parsing
    ranges.push_back({begin, end, &pos->first});
  }

  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    KVB_CHECK(ranges[i].begin >= ranges[i - 1].end, path, ": tensors '", *ranges[i - 1].name,
              "' and '", *ranges[i].name, "' overlap");
  }
}

const StTensor& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  KVB_CHECK(it != tensors_.end(), path(), ": missing tensor '", name, "'");
  return it->second;
}

SafetensorsSet::SafetensorsSet(const std::string& model_dir) : dir_(model_dir) {
  const std::string single = model_dir + "/model.safetensors";
  const std::string index = model_dir + "/model.safetensors.index.json";
  if (file_exists(index)) {
    const nlohmann::json j = parse_json(read_text_file(index), index);
    KVB_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index,
              ": missing 'weight_map' object");
    std::map<std::string, const SafetensorsFile*> by_file;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      KVB_CHECK(it.value().is_string(), index, ": weight_map['", it.key(), "'] is not a string");
      const std::string shard = it.value().get<std::string>();
      KVB_CHECK(shard.find('/') == std::string::npos, index, ": shard name '", shard,
                "' must be a file name in the model directory");
      auto f = by_file.find(shard);
      if (f == by_file.end()) {
        files_.push_back(std::make_shared<SafetensorsFile>(model_dir + "/" + shard));
        f = by_file.emplace(shard, files_.back().get()).first;
      }
      KVB_CHECK(f->second->has(it.key()), f->second->path(), ": missing tensor '", it.key(),
                "' (listed in ", index, ")");
      where_[it.key()] = f->second;
    }
  } else if (file_exists(single)) {
    files_.push_back(std::make_shared<SafetensorsFile>(single));
    for (const auto& [name, t] : files_.back()->tensors()) where_[name] = files_.back().get();
  } else {
    KVB_FAIL(model_dir, ": no model.safetensors or model.safetensors.index.json");
  }
}

const StTensor& SafetensorsSet::get(const std::string& name) const {
  auto it = where_.find(name);
  KVB_CHECK(it != where_.end(), dir_, ": missing tensor '", name, "'");
  return it->second->get(name);
}

const std::string& SafetensorsSet::file_of(const std::string& name) const {
  auto it = where_.find(name);
  KVB_CHECK(it != where_.end(), dir_, ": missing tensor '", name, "'");
  return it->second->path();
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

}  // namespace kvb
