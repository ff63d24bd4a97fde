// The host demand-paged arena (kvb/kernels/virtual_memory.h): nothing is resident after the
// reservation, a commit makes exactly its pages resident as mincore reports them (in page_bytes
// steps, also for pages larger than the OS page), committed memory keeps its contents across
// further commits, a decommit gives the pages back, and misaligned, out-of-range and malformed
// requests are refused with a reason.

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kvb/kernels/virtual_memory.h"

namespace kvb::kernels {
namespace {

TEST(HostVirtualArena, ResidentBytesFollowCommitsPageByPage) {
  for (size_t page : {size_t{4} << 10, size_t{64} << 10}) {
    SCOPED_TRACE(page);
    std::string error;
    auto a = make_host_virtual_arena(64 * page, page, HugePages::kOff, &error);
    ASSERT_NE(a, nullptr) << error;
    EXPECT_STREQ(a->backend(), "host-mmap");
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->base()) % page, 0u);
    EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), 0);
    ASSERT_EQ(a->commit(0, page), "");
    EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), static_cast<int64_t>(page));
    ASSERT_EQ(a->commit(page, 3 * page), "");
    EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), static_cast<int64_t>(4 * page));
    EXPECT_EQ(a->resident_bytes(page, page), static_cast<int64_t>(page));
    EXPECT_EQ(a->resident_bytes(4 * page, 60 * page), 0);
    // Contents survive a second commit of the same pages.
    char* p = static_cast<char*>(a->base());
    std::memset(p, 0x5a, 4 * page);
    ASSERT_EQ(a->commit(0, 4 * page), "");
    EXPECT_EQ(p[0], 0x5a);
    EXPECT_EQ(p[4 * page - 1], 0x5a);
    ASSERT_EQ(a->decommit(2 * page, 2 * page), "");
    EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), static_cast<int64_t>(2 * page));
    // Recommitted pages come back zeroed: the old contents went with the pages.
    ASSERT_EQ(a->commit(2 * page, page), "");
    EXPECT_EQ(p[2 * page], 0);
    ASSERT_EQ(a->decommit(0, a->reserved_bytes()), "");
    EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), 0);
    EXPECT_EQ(a->commit_calls(), 6);
    EXPECT_GE(a->commit_seconds(), 0.0);
  }
}

TEST(HostVirtualArena, RefusesWhatItCannotDo) {
  std::string error;
  EXPECT_EQ(make_host_virtual_arena(1 << 20, 3 << 12, HugePages::kOff, &error), nullptr);
  EXPECT_NE(error.find("power of two"), std::string::npos) << error;
  EXPECT_EQ(make_host_virtual_arena(1 << 20, 1024, HugePages::kOff, &error), nullptr);
  EXPECT_NE(error.find("OS page"), std::string::npos) << error;
  auto a = make_host_virtual_arena(16 << 12, 4 << 10, HugePages::kOff, &error);
  ASSERT_NE(a, nullptr) << error;
  EXPECT_NE(a->commit(100, 4096).find("multiple"), std::string::npos);
  EXPECT_NE(a->commit(15 << 12, 2 << 12).find("outside"), std::string::npos);
  EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), 0);  // refused commits committed nothing
}

// 2 MiB pages: the commit faults all 512 OS pages in at once; whether the OS backs them with a
// huge page depends on its transparent-huge-page mode, and the arena reports what it got.
TEST(HostVirtualArena, TwoMegabytePagesCommitWhole) {
  const size_t page = size_t{2} << 20;
  std::string error;
  auto a = make_host_virtual_arena(4 * page, page, HugePages::kAuto, &error);
  ASSERT_NE(a, nullptr) << error;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->base()) % page, 0u);
  ASSERT_EQ(a->commit(page, page), "");
  EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), static_cast<int64_t>(page));
  const int64_t huge = a->huge_resident_bytes();
  EXPECT_TRUE(huge == 0 || huge == static_cast<int64_t>(page)) << huge;
  if (host_transparent_hugepages_mode() == "never") {
    EXPECT_EQ(huge, 0);
  }
  RecordProperty("thp_mode", host_transparent_hugepages_mode());
  RecordProperty("huge_resident_bytes", std::to_string(huge));
  ASSERT_EQ(a->decommit(page, page), "");
  EXPECT_EQ(a->resident_bytes(0, a->reserved_bytes()), 0);
  EXPECT_EQ(a->huge_resident_bytes(), 0);
}

}  // namespace
}  // namespace kvb::kernels
