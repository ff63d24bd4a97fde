// The one parameter system (harness/common/params.h): defaults, enums from a name table, aliases,
// "auto" and null values, parameters without a default, comma-separated lists, and each error in
// its one style "<owner>.<parameter>: <what is wrong>; <what is allowed>".

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/common/enum_names.h"
#include "harness/common/params.h"
#include "tests/base/base_test_util.h"

namespace kvb {
namespace {

using nlohmann::json;
using ptest::expect_kvb_error;

enum class Shape { kRound, kSquare, kFlat };
const EnumName<Shape> kShapes[] = {
    {Shape::kRound, "round"}, {Shape::kSquare, "square"}, {Shape::kFlat, "flat"}};

const std::vector<ParamSpec>& specs() {
  static const std::vector<ParamSpec> s = {
      int_param("size", 16, 1, 4096, "tokens per block"),
      float_param("alpha", 2.0, 1.0, 10.0, "an exponent").above_min(),
      bool_param("few_shot", true, "an example first").or_auto(),
      enum_param("shape", kShapes, Shape::kSquare, "a shape").with_aliases({{"box", "square"}}),
      int_param("width", 0, 0, 100, "0 or unset").unset_by_default(),
      string_param("path", "", {}, "a file").or_null(),
  };
  return s;
}

TEST(Params, DefaultsFillTheResolvedObject) {
  const json r = resolve_params(specs(), json(), "method demo");
  // width has no default: left out for its owner to decide; path is nullable, its default kept.
  EXPECT_EQ(r.dump(), R"({"alpha":2.0,"few_shot":true,"path":"","shape":"square","size":16})");
  EXPECT_EQ(resolve_params(specs(), json::object(), "method demo"), r);
}

TEST(Params, GivenValuesAreCheckedAndNormalised) {
  const json r = resolve_params(specs(),
                                {{"size", 32.0},
                                 {"alpha", 3},
                                 {"few_shot", false},
                                 {"width", 7},
                                 {"shape", "flat"},
                                 {"path", nullptr}},
                                "method demo");
  EXPECT_TRUE(r["size"].is_number_integer());
  EXPECT_EQ(r["size"], 32);
  EXPECT_TRUE(r["alpha"].is_number_float());
  EXPECT_EQ(r["alpha"], 3.0);
  EXPECT_EQ(r["few_shot"], false);
  EXPECT_EQ(r["width"], 7);
  EXPECT_TRUE(r["path"].is_null());
  EXPECT_EQ(param_enum(r, "shape", kShapes), Shape::kFlat);
}

TEST(Params, EnumChoicesComeFromTheNameTable) {
  const ParamSpec p = enum_param("shape", kShapes, Shape::kFlat, "doc");
  EXPECT_EQ(p.choices, (std::vector<std::string>{"round", "square", "flat"}));
  EXPECT_EQ(p.default_value, "flat");
  // An alias resolves to its choice, so the resolved object (and any hash of it) holds the choice.
  const json r = resolve_params(specs(), {{"shape", "box"}}, "method demo");
  EXPECT_EQ(r["shape"], "square");
  EXPECT_EQ(param_enum(r, "shape", kShapes), Shape::kSquare);
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"shape", "rond"}}, "method demo");
      },
      {"method demo.shape: 'rond' is not one of round, square, flat", "did you mean 'round'"});
}

TEST(Params, AutoIsAValueOnlyWhereDeclared) {
  const json r = resolve_params(specs(), {{"few_shot", "auto"}}, "task vt");
  EXPECT_EQ(r["few_shot"], "auto");
  EXPECT_TRUE(param_is_auto(r, "few_shot"));
  EXPECT_FALSE(param_is_auto(r, "size"));
  EXPECT_FALSE(param_is_auto(r, "width"));  // absent
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"few_shot", "maybe"}}, "task vt");
      },
      {"task vt.few_shot: expected true or false or \"auto\", got \"maybe\""});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"size", "auto"}}, "task vt");
      },
      {"task vt.size: expected an integer, got \"auto\""});
}

TEST(Params, NullIsAValueOnlyWhereDeclared) {
  EXPECT_TRUE(resolve_params(specs(), {{"path", nullptr}}, "m")["path"].is_null());
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"size", nullptr}}, "m");
      },
      {"m.size: expected an integer, got null"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"width", nullptr}}, "m");
      },
      {"m.width: expected an integer, got null"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"path", 3}}, "m");
      },
      {"m.path: expected a string or null, got 3"});
}

TEST(Params, EachErrorNamesOwnerParameterAndWhatIsAllowed) {
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"sise", 3}}, "method demo");
      },
      {"method demo: unknown parameter 'sise'", "did you mean 'size'",
       "known: size, alpha, few_shot, shape, width, path"});
  expect_kvb_error(
      [] {
        resolve_params({}, {{"size", 3}}, "method full");
      },
      {"method full: unknown parameter 'size'; it takes no parameters"});
  expect_kvb_error([] { resolve_params(specs(), json::array(), "method demo"); },
                   {"method demo: expected an object of parameters, got []"});
  // Integer bounds print as integers; an open bound as "(".
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"size", 0}}, "method demo");
      },
      {"method demo.size: 0 is outside the allowed range [1, 4096]"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"size", 2.5}}, "method demo");
      },
      {"method demo.size: expected an integer, got 2.5"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"alpha", 1.0}}, "task fwe");
      },
      {"task fwe.alpha: 1 is outside the allowed range (1, 10]"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"alpha", 10.5}}, "task fwe");
      },
      {"task fwe.alpha: 10.5 is outside the allowed range (1, 10]"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"alpha", "two"}}, "task fwe");
      },
      {"task fwe.alpha: expected a number, got \"two\""});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"shape", 1}}, "m");
      },
      {"m.shape: expected a string, got 1"});
  expect_kvb_error(
      [] {
        resolve_params(specs(), {{"few_shot", 1}}, "m");
      },
      {"m.few_shot: expected true or false or \"auto\", got 1"});
  // The open bound itself is allowed just above it.
  EXPECT_EQ(resolve_params(specs(), {{"alpha", 1.0000001}}, "m")["alpha"], 1.0000001);
}

TEST(Params, ListingsShowOnlyTheExtrasInUse) {
  const json plain = param_spec_json(specs()[0]);
  EXPECT_EQ(plain.dump(),
            R"({"default":16,"doc":"tokens per block","max":4096.0,"min":1.0,"name":"size",)"
            R"("type":"int"})");
  const json fs = param_spec_json(specs()[2]);
  EXPECT_EQ(fs["auto"], true);
  EXPECT_FALSE(fs.contains("nullable"));
  EXPECT_EQ(param_spec_json(specs()[1])["min_open"], true);
  EXPECT_EQ(param_spec_json(specs()[3])["aliases"], (json{{"box", "square"}}));
  EXPECT_EQ(param_spec_json(specs()[5])["nullable"], true);
}

TEST(Params, RecipeShapes) {
  const std::vector<ParamSpec> recipe = {
      float_param("heldout", 0.02, 0, 0.5, "held out").above_min().below_max(),
      string_list_param("corpora", {"a"}, "corpus names"),
      section_param("optim", "a nested table"),
  };
  // A file alone as the owner: its keys read "<file>: <key>".
  const json r = resolve_params(recipe, {{"optim", {{"lr", 1}}}}, "recipe.json: ");
  EXPECT_EQ(r.dump(), R"({"corpora":["a"],"heldout":0.02,"optim":{"lr":1}})");
  EXPECT_FALSE(resolve_params(recipe, json::object(), "r: ").contains("optim"));  // no default
  expect_kvb_error(
      [&] {
        resolve_params(recipe, {{"heldout", 0.5}}, "recipe.json: ");
      },
      {"recipe.json: heldout: 0.5 is outside the allowed range (0, 0.5)"});
  expect_kvb_error(
      [&] {
        resolve_params(recipe, {{"corpora", {"a", 1}}}, "recipe.json: data");
      },
      {"recipe.json: data.corpora: expected a list of strings, got [\"a\",1]"});
  expect_kvb_error(
      [&] {
        resolve_params(recipe, {{"optim", 3}}, "recipe.json: ");
      },
      {"recipe.json: optim: expected an object or a list of objects, got 3"});
  expect_kvb_error(
      [&] {
        resolve_params(recipe, {{"optimm", 3}}, "recipe.json: ");
      },
      {"recipe.json: unknown parameter 'optimm' (did you mean 'optim'?)"});
}

TEST(ParamLists, IntegersInRange) {
  EXPECT_EQ(parse_int_list("512,2048", "--tokens", "context length", 3, 1 << 20),
            (std::vector<int64_t>{512, 2048}));
  EXPECT_EQ(parse_int_list("7", "k", "count", 0, 10), (std::vector<int64_t>{7}));
  // Repeats are allowed unless asked otherwise.
  EXPECT_EQ(parse_int_list("1,1", "k", "count", 0, 10), (std::vector<int64_t>{1, 1}));
  expect_kvb_error([] { parse_int_list("1,1", "--tokens", "context length", 0, 10, true); },
                   {"--tokens: 1 is given twice"});
  EXPECT_EQ(parse_int_list("1, 4", "k", "count", 0, 10), (std::vector<int64_t>{1, 4}));
  for (const char* bad :
       {"", "1,,2", "1, ", "1,x", "1.5", "1 ", "11", "-1", "99999999999999999999"})
    expect_kvb_error(
        [&] { parse_int_list(bad, "config.protocol.batch_sizes", "batch size", 0, 10); },
        {"config.protocol.batch_sizes: '", "' is not a batch size in [0, 10]",
         "(a comma-separated list)"});
}

TEST(ParamLists, NumbersInRange) {
  EXPECT_EQ(parse_float_list("0,0.25,1", "config.protocol.depths", "depth", 0, 1),
            (std::vector<double>{0, 0.25, 1}));
  EXPECT_EQ(parse_float_list("1e-1", "d", "depth", 0, 1), (std::vector<double>{0.1}));
  for (const char* bad : {"", "0.5,", "1.5", "nan", "inf", "0.5x", "-0.1"})
    expect_kvb_error([&] { parse_float_list(bad, "config.protocol.depths", "depth", 0, 1); },
                     {"config.protocol.depths: '", "' is not a depth in [0, 1]"});
}

}  // namespace
}  // namespace kvb
