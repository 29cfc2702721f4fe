#include "trace_json.h"

#include <algorithm>

namespace fsdplab::internal {

std::string_view TypeText(od::value& v) {
  od::json_type t;
  if (v.type().get(t)) return "an unreadable value";
  switch (t) {
    case od::json_type::array: return "an array";
    case od::json_type::object: return "an object";
    case od::json_type::number: return "a number";
    case od::json_type::string: return "a string";
    case od::json_type::boolean: return "a boolean";
    case od::json_type::null: return "null";
  }
  return "a value";
}

// 1-based line and column of byte `offset` in `text`.
std::pair<std::size_t, std::size_t> LineColumn(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1;
  std::size_t col = 1;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

R JsonWalker::Fatal(simdjson::error_code err, const std::string& where) {
  fatal_ = true;
  if (err == simdjson::EMPTY) {
    Add("not valid JSON: the document is empty");
    return R::kFatal;
  }
  std::string loc;
  const char* p = nullptr;
  if (doc_ != nullptr && !doc_->current_location().get(p) && p != nullptr) {
    std::size_t offset = base_ + static_cast<std::size_t>(p - buf_begin_);
    auto [line, col] = LineColumn(text_, offset);
    loc = fmt::format(" at line {}, column {} (byte {})", line, col, offset);
  } else if (err == simdjson::TAPE_ERROR || err == simdjson::INCOMPLETE_ARRAY_OR_OBJECT ||
             err == simdjson::UNCLOSED_STRING) {
    loc = fmt::format(" at the end of the input (byte {}), which looks truncated", text_.size());
  }
  Add(fmt::format("{}not valid JSON{}: {}", where.empty() ? "" : where + ": ", loc,
                  simdjson::error_message(err)));
  return R::kFatal;
}

void JsonWalker::RootNotObject(od::document& doc, simdjson::error_code err,
                               std::string_view expected) {
  if (err != simdjson::INCORRECT_TYPE) {
    Fatal(err, "");
    return;
  }
  // Either valid JSON that is not an object, or not JSON at all (on-demand guesses a scalar's
  // type from its first byte: "this" looks like a boolean until it is read).
  od::json_type t;
  if (auto e = doc.type().get(t)) {
    Fatal(e, "");
    return;
  }
  std::string_view what;
  bool readable = false;
  switch (t) {
    case od::json_type::array:
      what = "an array";
      readable = true;
      break;
    case od::json_type::number: {
      double d = 0;
      readable = !doc.get_double().get(d);
      what = "a number";
      break;
    }
    case od::json_type::string: {
      std::string_view sv;
      readable = !doc.get_string().get(sv);
      what = "a string";
      break;
    }
    case od::json_type::boolean: {
      bool b = false;
      readable = !doc.get_bool().get(b);
      what = "a boolean";
      break;
    }
    case od::json_type::null: {
      bool n = false;
      readable = !doc.is_null().get(n) && n;
      what = "null";
      break;
    }
    case od::json_type::object: break;
  }
  fatal_ = true;
  if (readable) {
    Add(fmt::format("{}, but this document is {}", expected, what));
  } else {
    std::size_t first = text_.find_first_not_of(" \t\r\n");
    auto [line, col] = LineColumn(text_, first);
    Add(fmt::format("not valid JSON at line {}, column {} (byte {}): unexpected '{}'", line, col,
                    first, text_.substr(first, 1)));
  }
}

}  // namespace fsdplab::internal
