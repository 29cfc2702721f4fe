// The streaming form of a JSON document (json_sink.h): a value walked into the sink that builds
// values comes back equal, number types, key order and all.
#include "fsdplab/report/json_sink.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace fsdplab {
namespace {

using Json = nlohmann::ordered_json;

Json RoundTrip(const Json& v) {
  JsonValueSink sink;
  EmitJson(v, sink);
  return sink.Take();
}

TEST(JsonSinkTest, EveryTypeComesBackWithItsNumberTypeAndKeyOrder) {
  // Keys out of alphabetical order ("z" first), a negative int, an unsigned beyond int64's
  // range (2^63 + 1), a float, nested empty containers, null and bools.
  const Json v = Json::parse(
      R"({"z": -3, "big": 9223372036854775809, "f": 1.5, "list": [true, false, null, "s"],)"
      R"( "empty": {}, "none": [], "nested": {"b": [1, {"a": 2}]}})");
  const Json back = RoundTrip(v);
  EXPECT_EQ(back, v);
  EXPECT_EQ(back.dump(2), v.dump(2));  // same text: order and number forms
  EXPECT_TRUE(back["z"].is_number_integer());
  EXPECT_TRUE(back["big"].is_number_unsigned());
  EXPECT_TRUE(back["f"].is_number_float());
  EXPECT_EQ(back.begin().key(), "z");
}

TEST(JsonSinkTest, NonFiniteFloatStaysAFloatThatDumpWritesAsNull) {
  const Json v = {{"x", std::numeric_limits<double>::quiet_NaN()}};
  const Json back = RoundTrip(v);
  EXPECT_TRUE(std::isnan(back["x"].get<double>()));
  EXPECT_EQ(back.dump(), R"({"x":null})");
}

TEST(JsonSinkTest, BinaryIsWalkedAsDumpWritesIt) {
  // dump() writes a binary value as {"bytes": [...], "subtype": null} (no subtype set).
  const Json v = Json::binary({1, 2});
  EXPECT_EQ(RoundTrip(v), Json::parse(R"({"bytes": [1, 2], "subtype": null})"));
}

TEST(JsonSinkTest, ScalarAtTheTopIsTheWholeDocument) {
  EXPECT_EQ(RoundTrip(Json("text")), Json("text"));
  EXPECT_EQ(RoundTrip(Json(7)), Json(7));
}

}  // namespace
}  // namespace fsdplab
