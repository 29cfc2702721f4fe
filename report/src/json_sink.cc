#include "fsdplab/report/json_sink.h"

#include <utility>

namespace fsdplab {

using Json = nlohmann::ordered_json;

void EmitJson(const Json& v, JsonSink& sink) {
  switch (v.type()) {
    case Json::value_t::object:
      sink.BeginObject();
      for (const auto& [key, member] : v.get_ref<const Json::object_t&>()) {
        sink.Key(key);
        EmitJson(member, sink);
      }
      sink.EndObject();
      return;
    case Json::value_t::array:
      sink.BeginArray();
      for (const Json& item : v.get_ref<const Json::array_t&>()) EmitJson(item, sink);
      sink.EndArray();
      return;
    case Json::value_t::string: sink.String(v.get_ref<const Json::string_t&>()); return;
    case Json::value_t::boolean: sink.Bool(v.get<bool>()); return;
    case Json::value_t::number_integer: sink.Int(v.get<std::int64_t>()); return;
    case Json::value_t::number_unsigned: sink.Uint(v.get<std::uint64_t>()); return;
    case Json::value_t::number_float: sink.Double(v.get<double>()); return;
    case Json::value_t::binary: {
      const Json::binary_t& b = v.get_binary();
      sink.BeginObject();
      sink.Key("bytes");
      sink.BeginArray();
      for (std::uint8_t byte : b) sink.Uint(byte);
      sink.EndArray();
      sink.Key("subtype");
      if (b.has_subtype()) {
        sink.Uint(b.subtype());
      } else {
        sink.Null();
      }
      sink.EndObject();
      return;
    }
    case Json::value_t::null:
    case Json::value_t::discarded: break;
  }
  sink.Null();
}

Json* JsonValueSink::Put(Json v) {
  if (open_.empty()) {
    root_ = std::move(v);
    return &root_;
  }
  Json& top = *open_.back();
  if (top.is_array()) {
    auto& items = top.get_ref<Json::array_t&>();
    items.push_back(std::move(v));
    return &items.back();
  }
  // As doc[key] = v: a repeated key replaces the value in its place.
  Json& member = top[key_];
  member = std::move(v);
  return &member;
}

// A container's pointer stays valid while it is open: its parent gets no other member meanwhile.
void JsonValueSink::BeginObject() { open_.push_back(Put(Json::object())); }
void JsonValueSink::EndObject() { open_.pop_back(); }
void JsonValueSink::BeginArray() { open_.push_back(Put(Json::array())); }
void JsonValueSink::EndArray() { open_.pop_back(); }
void JsonValueSink::Key(std::string_view key) { key_.assign(key); }
void JsonValueSink::Null() { Put(nullptr); }
void JsonValueSink::Bool(bool b) { Put(b); }
void JsonValueSink::Int(std::int64_t i) { Put(i); }
void JsonValueSink::Uint(std::uint64_t u) { Put(u); }
void JsonValueSink::Double(double d) { Put(d); }
void JsonValueSink::String(std::string_view s) { Put(Json(std::string(s))); }

}  // namespace fsdplab
