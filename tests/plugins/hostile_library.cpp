// A shared library that announces being loaded: its constructor creates the file named by
// $KVB_HOSTILE_MARKER. Placed under the name of one of kvbench's libraries in the working directory,
// it tells whether the dynamic loader searched there (test_library_paths.cpp).
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

__attribute__((constructor)) static void kvb_hostile_library_loaded() {
  const char* marker = std::getenv("KVB_HOSTILE_MARKER");
  if (marker == nullptr) return;
  const int fd = ::open(marker, O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) ::close(fd);
}
