// A JSON document written as a stream of calls (begin an object, a key, a value, ...) to a sink
// that builds what its caller needs: the nlohmann value the commands print (JsonValueSink), or
// the Python objects the Python API returns (python/src/py_json.h), so that a document's layout
// is written once (report.h's EmitReport) and no intermediate value is built for Python.
//
//   JsonValueSink sink;
//   EmitReport(report, sink);               // or EmitJson(value, sink)
//   nlohmann::ordered_json doc = sink.Take();
//
// Calls nest: an object's members are Key() then one value (a scalar or a whole container).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

namespace fsdplab {

class JsonSink {
 public:
  virtual ~JsonSink() = default;
  virtual void BeginObject() = 0;
  virtual void EndObject() = 0;
  virtual void BeginArray() = 0;
  virtual void EndArray() = 0;
  virtual void Key(std::string_view key) = 0;
  virtual void Null() = 0;
  virtual void Bool(bool b) = 0;
  virtual void Int(std::int64_t i) = 0;
  virtual void Uint(std::uint64_t u) = 0;
  virtual void Double(double d) = 0;  // non-finite as JSON writes it: null
  virtual void String(std::string_view s) = 0;
};

// A value's calls, in its key order (a binary value as dump() writes it: {"bytes", "subtype"}).
void EmitJson(const nlohmann::ordered_json& value, JsonSink& sink);

// Builds the nlohmann value of the calls (number types as given: Int signed, Uint unsigned).
class JsonValueSink final : public JsonSink {
 public:
  void BeginObject() override;
  void EndObject() override;
  void BeginArray() override;
  void EndArray() override;
  void Key(std::string_view key) override;
  void Null() override;
  void Bool(bool b) override;
  void Int(std::int64_t i) override;
  void Uint(std::uint64_t u) override;
  void Double(double d) override;
  void String(std::string_view s) override;
  nlohmann::ordered_json Take() { return std::move(root_); }

 private:
  nlohmann::ordered_json* Put(nlohmann::ordered_json v);
  nlohmann::ordered_json root_;
  std::vector<nlohmann::ordered_json*> open_;  // the containers not yet ended, innermost last
  std::string key_;                            // the key of the next member of an object
};

}  // namespace fsdplab
