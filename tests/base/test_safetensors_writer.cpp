// write_safetensors: what it writes reads back through the validating reader, value for value and
// with its metadata; bad entries and unwritable paths are refused naming the file; nothing is left
// under the final name when a write fails.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <vector>

#include "harness/common/atomic_file.h"
#include "harness/common/disk_full_error.h"
#include "harness/common/error.h"
#include "harness/common/mapped_file.h"
#include "harness/formats/safetensors.h"
#include "harness/formats/safetensors_writer.h"
#include "tests/base/formats_test_util.h"

namespace kvb {
namespace {

TEST(SafetensorsWriter, RoundTripsThroughTheReader) {
  const std::string dir = test::make_scratch_dir("stw");
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.f, 7.f, -0.5f};
  std::vector<uint16_t> b = {0x3c00, 0xbc00, 0x0001};  // odd byte count: the header pads, data do not
  std::vector<float> empty;
  const std::string path = dir + "/t.safetensors";
  write_safetensors(path,
                    {{"a", StDtype::kF32, {2, 3}, a.data(), a.size() * 4},
                     {"b.half", StDtype::kF16, {3}, b.data(), b.size() * 2},
                     {"empty", StDtype::kF32, {0, 4}, empty.data(), 0}},
                    {{"step", "42"}, {"format", "x"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("step"), "42");
  const StTensor& ta = f.get("a");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(ta.nbytes, 24u);
  const float* pa = reinterpret_cast<const float*>(ta.data);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(pa[i], a[i]);
  const StTensor& tb = f.get("b.half");
  EXPECT_EQ(tb.dtype, StDtype::kF16);
  EXPECT_EQ(reinterpret_cast<const uint16_t*>(tb.data)[2], 1);
  EXPECT_EQ(f.get("empty").numel(), 0);
  EXPECT_FALSE(file_exists(atomic_temp_path(path)));
}

TEST(SafetensorsWriter, RefusesBadEntriesAndPaths) {
  const std::string dir = test::make_scratch_dir("stw_bad");
  std::vector<float> a(4);
  const std::string path = dir + "/t.safetensors";
  auto expect = [&](const std::vector<StWriteEntry>& e, const std::string& p, const std::string& needle) {
    try {
      write_safetensors(p, e);
      ADD_FAILURE() << "no error";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find(p), std::string::npos) << err.what();
    }
  };
  expect({{"a", StDtype::kF32, {3}, a.data(), 16}}, path, "do not match");
  expect({{"a", StDtype::kF32, {4}, a.data(), 16}, {"a", StDtype::kF32, {4}, a.data(), 16}}, path,
         "given twice");
  expect({{"a", StDtype::kF32, {4}, a.data(), 16}}, dir + "/no/such/dir/t.safetensors", "cannot open");
  EXPECT_FALSE(file_exists(path));
  // /dev/full: every write fails with ENOSPC, as on a full disk. The error names the file and no
  // file is left under the final name.
  std::ifstream probe("/dev/full");
  if (probe.good()) {
    // Point the temporary file at /dev/full through a symlink.
    const std::string full = dir + "/full.safetensors";
    ASSERT_EQ(::symlink("/dev/full", atomic_temp_path(full).c_str()), 0);
    std::vector<float> big(1 << 16);
    expect({{"a", StDtype::kF32, {1 << 16}, big.data(), big.size() * 4}}, full, "write failed");
    EXPECT_FALSE(file_exists(atomic_temp_path(full)));  // the temporary is removed
    ASSERT_EQ(::symlink("/dev/full", atomic_temp_path(full).c_str()), 0);
    EXPECT_THROW(
        write_safetensors(full, {{"a", StDtype::kF32, {1 << 16}, big.data(), big.size() * 4}}),
        DiskFullError);
    EXPECT_FALSE(file_exists(full));
  }
}

}  // namespace
}  // namespace kvb
