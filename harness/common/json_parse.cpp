#include "harness/common/json_parse.h"

#include "harness/common/error.h"

namespace kvb {

namespace {

// The callback sees each object/array start with its depth before anything deeper is built.
nlohmann::json::parser_callback_t depth_limit(const std::string& source, int max_depth) {
  return [&source, max_depth](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start ||
         event == nlohmann::json::parse_event_t::array_start) &&
        depth >= max_depth)
      KVB_FAIL(source, ": JSON nested deeper than ", max_depth, " levels");
    return true;
  };
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source, int max_depth) {
  try {
    return nlohmann::json::parse(text.begin(), text.end(), depth_limit(source, max_depth));
  } catch (const nlohmann::json::parse_error& e) {
    KVB_FAIL(source, ": not valid JSON: ", e.what());
  } catch (const nlohmann::json::exception& e) {
    // out_of_range: a number too large for a double (1e400), found by fuzz_hf_config; it is not a
    // parse_error, so it used to escape as an internal error.
    KVB_FAIL(source, ": not valid JSON: ", e.what());
  }
}

bool parse_json_if_valid(std::string_view text, const std::string& source, nlohmann::json* out,
                         int max_depth) {
  try {
    *out = nlohmann::json::parse(text.begin(), text.end(), depth_limit(source, max_depth));
    return true;
  } catch (const nlohmann::json::exception&) {  // syntax errors and numbers out of range alike
    return false;
  }
}

}  // namespace kvb
