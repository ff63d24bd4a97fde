#pragma once
// write_file_atomically: a file appears whole or not at all. The bytes go to a temporary file
// beside `path` (named for this process, so that two processes writing one cache entry do not
// collide), every write and the close are checked, and the temporary is renamed over `path`. On any
// failure the temporary is removed before the error is thrown, so a full disk leaves nothing
// behind: DiskFullError (disk_full_error.h) for no room, kvb::Error otherwise, both naming `path`.

#include <cstddef>
#include <string>

namespace kvb {

void write_file_atomically(const std::string& path, const void* bytes, size_t size);
inline void write_file_atomically(const std::string& path, const std::string& bytes) {
  write_file_atomically(path, bytes.data(), bytes.size());
}

// The temporary name write_file_atomically uses for `path` in this process (for tests and for
// writers that must produce the file through a library call: write there, then rename).
std::string atomic_temp_path(const std::string& path);

// mkdir -p: creates every missing directory of `dir` (existing ones are fine); throws naming the
// directory that cannot be created (DiskFullError for no room).
void make_directories(const std::string& dir);

// Throws the error write_file_atomically would for errno `err` while writing `path`.
[[noreturn]] void throw_write_error(const std::string& path, const std::string& what, int err);

}  // namespace kvb
