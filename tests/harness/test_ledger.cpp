// The ledger's simulated flag: full-size payload behind a small logical size is simulated; real
// metadata that eats the savings is not.

#include <gtest/gtest.h>

#include "harness/eval/ledger.h"

namespace kvb {
namespace {

TEST(Ledger, SimulatedMeansFullPayloadBehindASmallLogicalSize) {
  LedgerEntry e;
  e.baseline_bytes = 1000;
  e.fp.logical_bytes = 250;
  e.fp.device_payload_bytes = 1000;  // a mask over a full buffer
  EXPECT_TRUE(looks_simulated(e));
  e.fp.device_payload_bytes = 250;
  e.fp.device_metadata_bytes = 700;  // a sketch / buckets: physical, just costly
  EXPECT_FALSE(looks_simulated(e));
  e.fp.logical_bytes = 1000;  // nothing claimed
  e.fp.device_payload_bytes = 1000;
  EXPECT_FALSE(looks_simulated(e));
}

}  // namespace
}  // namespace kvb
