#pragma once
// Shared by the libFuzzer targets whose readers take a path: the input is written to one scratch
// file per process (overwritten each run), since those readers map or stream files rather than
// bytes.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kvb::fuzz {

inline std::string write_input(const uint8_t* data, size_t size, const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvb_fuzz_" +
                           std::to_string(::getpid()) + "_" + tag;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();  // the harness itself is broken, not the input
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace kvb::fuzz
