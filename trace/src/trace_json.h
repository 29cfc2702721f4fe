// Reading JSON with simdjson's on-demand API while collecting problems that name the field and
// its position: the machinery under the trace reader (private to the trace room).
//
//   class Reader final : public internal::JsonWalker { ... R r = Str(v, out, where); ... };
//
// A value reader returns kOk, kBad (a problem was recorded, reading goes on) or kFatal (the text
// is not readable JSON: the walk stops where simdjson stopped).
#pragma once

#include <fmt/format.h>
#include <simdjson.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdplab/core/status.h"

namespace fsdplab::internal {

namespace od = simdjson::ondemand;

// The outcome of reading one value: fine, a problem already recorded (keep going), or the JSON
// itself is unreadable (stop).
enum class R { kOk, kBad, kFatal };

// "an array", "a number", ...: the type of `v`, for messages.
std::string_view TypeText(od::value& v);
// 1-based line and column of byte `offset` in `text`.
std::pair<std::size_t, std::size_t> LineColumn(std::string_view text, std::size_t offset);
// Errors after which the walk can go on: the value was not consumed and is skipped.
inline bool Recoverable(simdjson::error_code err) {
  return err == simdjson::INCORRECT_TYPE || err == simdjson::NUMBER_ERROR ||
         err == simdjson::NUMBER_OUT_OF_RANGE;
}

// The text of a string that holds no escape, straight from the document, or nullopt.
inline std::optional<std::string_view> PlainString(const char* p, const char* end) {
  const char* q = p;
  while (q < end && *q != '"' && *q != '\\') ++q;
  if (q < end && *q == '"') return std::string_view(p, static_cast<std::size_t>(q - p));
  return std::nullopt;
}

// Problems recorded (at most kMaxProblems, then counted) and the typed readers of values.
class JsonWalker {
 protected:
  static constexpr std::size_t kMaxProblems = 1000;

  // `capacity`: bytes readable from text.data() (at least text.size()); with SIMDJSON_PADDING
  // to spare the text is parsed in place, else it is copied into a padded buffer.
  JsonWalker(std::string_view text, std::size_t capacity) : text_(text), capacity_(capacity) {}

  // Reports a root that is not an object: valid JSON of another type ("<expected>, but this
  // document is an array"), or not JSON at all.
  void RootNotObject(od::document& doc, simdjson::error_code err, std::string_view expected);
  void Add(std::string msg) {
    if (problems_.size() >= kMaxProblems) {
      ++overflow_;
      return;
    }
    problems_.push_back(InvalidInput(std::move(msg)));
  }
  // Records that the document is not readable JSON where the walk stopped.
  R Fatal(simdjson::error_code err, const std::string& where);

  template <typename Where>
  R Str(od::value& v, std::string_view& out, Where&& where);
  template <typename Where>
  R Double(od::value& v, double& out, Where&& where);
  template <typename Where>
  R Int(od::value& v, std::int64_t& out, Where&& where);
  template <typename Where>
  R Obj(od::value& v, od::object& out, Where&& where);
  template <typename Where>
  R Arr(od::value& v, od::array& out, Where&& where);
  // Calls `fn(key, value)` for each field of `obj`; stops at a fatal error.
  template <typename Where, typename Fn>
  R Fields(od::object& obj, Where&& where, Fn&& fn);
  // Calls `fn(index, value)` for each element of `arr`; stops at a fatal error.
  template <typename Where, typename Fn>
  R Items(od::array& arr, Where&& where, Fn&& fn);

  std::string_view text_;
  std::size_t capacity_ = 0;
  od::document* doc_ = nullptr;      // the document being walked (for error locations)
  const char* buf_begin_ = nullptr;  // start of its padded copy
  const char* buf_end_ = nullptr;    // end of the document in that copy
  std::size_t base_ = 0;             // offset of that document within text_
  bool fatal_ = false;
  std::vector<Status> problems_;
  std::size_t overflow_ = 0;
};

template <typename Where>
R JsonWalker::Str(od::value& v, std::string_view& out, Where&& where) {
  // Most strings (ops, unit names) have no escapes: view them in place instead of unescaping a
  // copy into the parser's buffer. The view lives as long as the walk.
  std::string_view tok = v.raw_json_token();
  if (!tok.empty() && tok.front() == '"') {
    if (auto plain = PlainString(tok.data() + 1, tok.data() + tok.size())) {
      out = *plain;
      return R::kOk;
    }
  }
  auto err = v.get_string().get(out);
  if (!err) return R::kOk;
  if (err == simdjson::INCORRECT_TYPE) {
    Add(fmt::format("{}: expected a string, got {}", where(), TypeText(v)));
    return R::kBad;
  }
  return Fatal(err, where());
}

template <typename Where>
R JsonWalker::Double(od::value& v, double& out, Where&& where) {
  auto err = v.get_double().get(out);
  if (!err) return R::kOk;
  if (err == simdjson::INCORRECT_TYPE) {
    Add(fmt::format("{}: expected a number, got {}", where(), TypeText(v)));
    return R::kBad;
  }
  if (Recoverable(err)) {
    std::string_view raw = v.raw_json_token();
    Add(fmt::format("{}: '{}' is not a finite number", where(),
                    raw.substr(0, raw.find_last_not_of(" \t\r\n") + 1)));
    return R::kBad;
  }
  return Fatal(err, where());
}

template <typename Where>
R JsonWalker::Int(od::value& v, std::int64_t& out, Where&& where) {
  od::number n;
  auto err = v.get_number().get(n);
  if (err == simdjson::INCORRECT_TYPE) {
    Add(fmt::format("{}: expected an integer, got {}", where(), TypeText(v)));
    return R::kBad;
  }
  if (err) {
    if (!Recoverable(err)) return Fatal(err, where());
    std::string_view raw = v.raw_json_token();
    Add(fmt::format("{}: '{}' is not an integer", where(),
                    raw.substr(0, raw.find_last_not_of(" \t\r\n") + 1)));
    return R::kBad;
  }
  switch (n.get_number_type()) {
    case od::number_type::signed_integer: out = n.get_int64(); return R::kOk;
    case od::number_type::floating_point_number: {
      double d = n.get_double();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
        out = static_cast<std::int64_t>(d);
        return R::kOk;
      }
      Add(fmt::format("{}: expected an integer, got {}", where(), d));
      return R::kBad;
    }
    default: Add(fmt::format("{}: {} is too large", where(), n.get_uint64())); return R::kBad;
  }
}

template <typename Where>
R JsonWalker::Obj(od::value& v, od::object& out, Where&& where) {
  auto err = v.get_object().get(out);
  if (!err) return R::kOk;
  if (err == simdjson::INCORRECT_TYPE) {
    Add(fmt::format("{}: expected an object, got {}", where(), TypeText(v)));
    return R::kBad;
  }
  return Fatal(err, where());
}

template <typename Where>
R JsonWalker::Arr(od::value& v, od::array& out, Where&& where) {
  auto err = v.get_array().get(out);
  if (!err) return R::kOk;
  if (err == simdjson::INCORRECT_TYPE) {
    Add(fmt::format("{}: expected an array, got {}", where(), TypeText(v)));
    return R::kBad;
  }
  return Fatal(err, where());
}

template <typename Where, typename Fn>
R JsonWalker::Fields(od::object& obj, Where&& where, Fn&& fn) {
  bool bad = false;
  for (auto fr : obj) {
    od::field f;
    if (auto err = std::move(fr).get(f)) return Fatal(err, where());
    // Keys are read in place unless they hold an escape. The raw key is inside a string that
    // stage 1 saw closed, so the scan stops at its closing quote.
    std::string_view key;
    const char* raw = reinterpret_cast<const char*>(f.key().raw());
    if (auto plain = PlainString(raw, buf_end_)) {
      key = *plain;
    } else if (auto err = f.unescaped_key().get(key)) {
      return Fatal(err, where());
    }
    R r = fn(key, f.value());
    if (r == R::kFatal) return r;
    bad = bad || r == R::kBad;
  }
  return bad ? R::kBad : R::kOk;
}

template <typename Where, typename Fn>
R JsonWalker::Items(od::array& arr, Where&& where, Fn&& fn) {
  bool bad = false;
  std::size_t i = 0;
  for (auto er : arr) {
    od::value v;
    if (auto err = std::move(er).get(v)) return Fatal(err, fmt::format("{}[{}]", where(), i));
    R r = fn(i, v);
    if (r == R::kFatal) return r;
    bad = bad || r == R::kBad;
    ++i;
  }
  return bad ? R::kBad : R::kOk;
}

}  // namespace fsdplab::internal
