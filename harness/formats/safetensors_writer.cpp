#include "harness/formats/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/common/atomic_file.h"
#include "harness/common/error.h"

namespace kvb {

namespace {

// Writes all of `bytes` to `f`; throws naming `path` (a full disk shows up here or at fclose) after
// removing the temporary file.
void write_all(std::FILE* f, const void* bytes, size_t n, const std::string& path) {
  if (n == 0) return;
  if (std::fwrite(bytes, 1, n, f) != n) {
    const int err = errno;
    std::fclose(f);
    std::remove(atomic_temp_path(path).c_str());
    throw_write_error(path, "write failed", err);
  }
}

void finish(std::FILE* f, const std::string& path) {
  const std::string tmp = atomic_temp_path(path);
  const bool flushed = std::fflush(f) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !flushed) {
    const int close_err = errno;
    std::remove(tmp.c_str());
    throw_write_error(path, "write failed", flushed ? close_err : err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw_write_error(path, "cannot rename the temporary file into place", e);
  }
}

// The temporary file is this process's own, so two processes writing one path never collide.
std::FILE* open_tmp(const std::string& path) {
  std::FILE* f = std::fopen(atomic_temp_path(path).c_str(), "wb");
  if (f == nullptr) throw_write_error(path, "cannot open for writing", errno);
  return f;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StWriteEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  size_t offset = 0;
  for (const auto& e : entries) {
    KVB_CHECK(!e.name.empty() && e.name != "__metadata__", path, ": bad tensor name '", e.name, "'");
    KVB_CHECK(names.insert(e.name).second, path, ": tensor '", e.name, "' given twice");
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      KVB_CHECK(d >= 0, path, ": tensor '", e.name, "' has a negative dimension");
      numel *= d;
    }
    KVB_CHECK(static_cast<size_t>(numel) * st_dtype_size(e.dtype) == e.nbytes, path, ": tensor '",
              e.name, "': ", e.nbytes, " bytes do not match dtype x shape");
    header[e.name] = {{"dtype", st_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  uint8_t len[8];
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  std::FILE* f = open_tmp(path);
  write_all(f, len, 8, path);
  write_all(f, h.data(), h.size(), path);
  for (const auto& e : entries) write_all(f, e.data, e.nbytes, path);
  finish(f, path);
}

void write_text_file_atomic(const std::string& path, const std::string& text) {
  write_file_atomically(path, text);
}

}  // namespace kvb
