#pragma once
// A read-only memory-mapped file (RAII). Model weights are mapped, not read, so that a 1 MB test model
// and a 16 GB checkpoint load the same way and pages are shared between processes.

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvb {

class MappedFile {
 public:
  // Throws kvb::Error naming the path when the file is missing, unreadable or not a regular file.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }  // [size()] bytes, read-only
  size_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Whole-file read for text files (configs, JSON, corpora). Throws kvb::Error naming the path when it is
// missing, not a regular file (a FIFO is refused at once, never waited on) or over `max_bytes`.
inline constexpr size_t kMaxTextFileBytes = size_t{256} << 20;
std::string read_text_file(const std::string& path, size_t max_bytes = kMaxTextFileBytes);
// Throws kvb::Error naming the path unless it is an existing regular file (before a stream opens it:
// opening a FIFO would block).
void check_regular_file(const std::string& path);
bool file_exists(const std::string& path);
bool dir_exists(const std::string& path);

}  // namespace kvb
