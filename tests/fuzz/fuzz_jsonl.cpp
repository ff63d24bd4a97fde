// libFuzzer target for the line-oriented readers: generic JSONL, LongBench samples, Mooncake
// request traces (strict and skipping bad lines), and the LongBench task config (one JSON
// document). Any bytes give records or a kvb::Error, never a crash, a sanitizer report or a hang.

#include <cstddef>
#include <cstdint>

#include "harness/common/error.h"
#include "harness/formats/jsonl.h"
#include "harness/formats/longbench_jsonl.h"
#include "harness/formats/request_trace.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvb::fuzz::write_input(data, size, "data.jsonl");
  for (bool skip : {false, true}) {
    kvb::JsonlOptions jo;
    jo.skip_bad_lines = skip;
    try {
      kvb::read_jsonl(path, jo,
                      [](const nlohmann::json& r, size_t) { (void)kvb::json_string(r, "text"); });
    } catch (const kvb::Error&) {
    }
    try {
      const auto lb = kvb::read_longbench_jsonl(path, jo);
      for (const auto& s : lb.samples)
        (void)kvb::format_longbench_prompt("{context}\n{input}", s.context, s.input);
    } catch (const kvb::Error&) {
    }
    try {
      kvb::TraceReadOptions ro;
      ro.skip_bad_lines = skip;
      (void)kvb::read_request_trace(path, ro).requests.size();
    } catch (const kvb::Error&) {
    }
  }
  try {
    const auto tasks = kvb::load_longbench_tasks(path);
    for (const auto& [name, t] : tasks) (void)kvb::format_longbench_prompt(t.prompt, "ctx", "q");
  } catch (const kvb::Error&) {
  }
  return 0;
}
