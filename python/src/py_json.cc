#include "py_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fsdplab::python {
namespace {

namespace nb = nanobind;
using Json = nlohmann::ordered_json;

PyObject* NewRef(PyObject* o) {
  Py_INCREF(o);
  return o;
}

// A dict for `n` keys, allocated at its size once instead of grown as keys arrive (a report's
// ops have 10 to 12 keys: two resizes each otherwise; about 50 K of the 0.4 M instructions
// gpt_small's report takes). _PyDict_NewPresized is in CPython's headers up to 3.12; from 3.13
// on, where it is not, the dict grows.
PyObject* NewDict(std::size_t n) {
#if PY_VERSION_HEX < 0x030D0000
  return _PyDict_NewPresized(static_cast<Py_ssize_t>(n));
#else
  (void)n;
  return PyDict_New();
#endif
}

struct TextHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// The str objects of short strings, kept from call to call: the keys of the documents are a
// fixed vocabulary ("step_time_us", "kind", ...) and short values repeat (unit names, op kinds),
// so each is decoded and hashed once, not once per call. Used with the GIL held; emptied when
// it reaches kMaxEntries (a caller's own names do not grow it without bound).
class StringCache final {
 public:
  static constexpr std::size_t kMaxLength = 64;  // longer strings are messages: seldom repeated
  static constexpr std::size_t kMaxEntries = 8192;

  // A new reference, or nullptr with the Python error set.
  PyObject* Get(std::string_view s) {
    if (s.size() > kMaxLength) return Decode(s);
    auto it = map_.find(s);
    if (it == map_.end()) {
      if (map_.size() >= kMaxEntries) Clear();
      PyObject* str = Decode(s);
      if (str == nullptr) return nullptr;
      it = map_.emplace(std::string(s), str).first;
    }
    return NewRef(it->second);
  }

 private:
  static PyObject* Decode(std::string_view s) {
    return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
  }
  void Clear() {
    for (auto& entry : map_) Py_DECREF(entry.second);
    map_.clear();
  }
  std::unordered_map<std::string, PyObject*, TextHash, std::equal_to<>> map_;
};

StringCache& Strings() {
  static StringCache* cache = new StringCache();  // never destroyed: it holds Python objects
  return *cache;
}

// A document's values as Python objects, strings from Strings(). The objects of a list's
// elements mostly have the same keys in the same order, so each depth remembers the keys of the
// last object seen there and a key equal to the one at its position is taken without a lookup.
class Converter final {
 public:
  Converter() = default;
  Converter(const Converter&) = delete;
  Converter& operator=(const Converter&) = delete;

  // A new reference, or nullptr with the Python error set.
  PyObject* Value(const Json& v, std::size_t depth) {
    switch (v.type()) {
      case Json::value_t::object: return Object(v.get_ref<const Json::object_t&>(), depth);
      case Json::value_t::array: {
        const auto& items = v.get_ref<const Json::array_t&>();
        PyObject* list = PyList_New(static_cast<Py_ssize_t>(items.size()));
        if (list == nullptr) return nullptr;
        for (std::size_t i = 0; i < items.size(); ++i) {
          PyObject* item = Value(items[i], depth + 1);
          if (item == nullptr) {
            Py_DECREF(list);
            return nullptr;
          }
          PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);  // steals the reference
        }
        return list;
      }
      case Json::value_t::string: return String(v.get_ref<const Json::string_t&>());
      case Json::value_t::boolean: return NewRef(v.get<bool>() ? Py_True : Py_False);
      case Json::value_t::number_integer:
        return PyLong_FromLongLong(*v.get_ptr<const Json::number_integer_t*>());
      case Json::value_t::number_unsigned:
        return PyLong_FromUnsignedLongLong(*v.get_ptr<const Json::number_unsigned_t*>());
      case Json::value_t::number_float: {
        const double d = *v.get_ptr<const Json::number_float_t*>();
        return std::isfinite(d) ? PyFloat_FromDouble(d) : NewRef(Py_None);  // dump: null
      }
      case Json::value_t::binary: {
        // As dump() writes it: {"bytes": [...], "subtype": n or null}.
        const Json::binary_t& b = v.get_binary();
        Json as_written{{"bytes", Json::array()},
                        {"subtype", b.has_subtype() ? Json(b.subtype()) : Json(nullptr)}};
        for (std::uint8_t byte : b) as_written["bytes"].push_back(byte);
        return Value(as_written, depth);
      }
      case Json::value_t::null:
      case Json::value_t::discarded: break;
    }
    return NewRef(Py_None);
  }

 private:
  // A key of the last object at a depth: its text (alive while the document is) and its str
  // (held by this converter).
  struct SeenKey {
    const std::string* text;
    PyObject* str;
  };

  PyObject* Object(const Json::object_t& members, std::size_t depth) {
    if (depth >= seen_.size()) seen_.resize(depth + 1);
    PyObject* dict = NewDict(members.size());
    if (dict == nullptr) return nullptr;
    std::size_t i = 0;
    for (const auto& [key, member] : members) {
      // seen_ is indexed afresh for each key: the members below may grow it.
      std::vector<SeenKey>& seen = seen_[depth];
      PyObject* k = nullptr;
      if (i < seen.size() && *seen[i].text == key) {
        k = NewRef(seen[i].str);
      } else {
        k = String(key);
        if (k != nullptr && i <= seen.size()) {
          held_.push_back(nb::borrow(k));
          if (i < seen.size()) {
            seen[i] = {&key, k};
          } else {
            seen.push_back({&key, k});
          }
        }
      }
      // The member is made after the key is remembered: it may hold objects one level down.
      PyObject* m = k == nullptr ? nullptr : Value(member, depth + 1);
      const int set = m == nullptr ? -1 : PyDict_SetItem(dict, k, m);
      Py_XDECREF(k);
      Py_XDECREF(m);
      if (set < 0) {
        Py_DECREF(dict);
        return nullptr;
      }
      ++i;
    }
    return dict;
  }

  static PyObject* String(const std::string& s) { return Strings().Get(s); }

  std::vector<std::vector<SeenKey>> seen_;  // by depth
  std::vector<nb::object> held_;            // the strs seen_ points to
};

// The Python objects of a JsonSink's calls. Each open container's items wait on one stack (an
// object's as key, value, key, ...) and become a list or a dict of their number when it ends.
// The first failure (a string that is not UTF-8, no memory) is kept; later calls do nothing.
class ObjectSink final : public JsonSink {
 public:
  ObjectSink() = default;
  ObjectSink(const ObjectSink&) = delete;
  ObjectSink& operator=(const ObjectSink&) = delete;
  ~ObjectSink() override {
    for (PyObject* o : items_) Py_XDECREF(o);
    Py_XDECREF(root_);
  }

  void BeginObject() override { open_.push_back(items_.size()); }
  void BeginArray() override { open_.push_back(items_.size()); }
  void EndObject() override {
    if (failed_) return;
    const std::size_t start = open_.back();
    open_.pop_back();
    PyObject* dict = NewDict((items_.size() - start) / 2);
    for (std::size_t i = start; dict != nullptr && i < items_.size(); i += 2) {
      if (PyDict_SetItem(dict, items_[i], items_[i + 1]) < 0) Py_CLEAR(dict);
    }
    for (std::size_t i = start; i < items_.size(); ++i) Py_DECREF(items_[i]);
    items_.resize(start);
    Put(dict);
  }
  void EndArray() override {
    if (failed_) return;
    const std::size_t start = open_.back();
    open_.pop_back();
    PyObject* list = PyList_New(static_cast<Py_ssize_t>(items_.size() - start));
    for (std::size_t i = start; i < items_.size(); ++i) {
      if (list != nullptr) {
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i - start), items_[i]);  // steals
      } else {
        Py_DECREF(items_[i]);
      }
    }
    items_.resize(start);
    Put(list);
  }
  void Key(std::string_view key) override { Put(Strings().Get(key)); }
  void Null() override { Put(NewRef(Py_None)); }
  void Bool(bool b) override { Put(NewRef(b ? Py_True : Py_False)); }
  void Int(std::int64_t i) override { Put(PyLong_FromLongLong(i)); }
  void Uint(std::uint64_t u) override { Put(PyLong_FromUnsignedLongLong(u)); }
  void Double(double d) override {
    Put(std::isfinite(d) ? PyFloat_FromDouble(d) : NewRef(Py_None));  // dump: null
  }
  void String(std::string_view s) override { Put(Strings().Get(s)); }

  // The document, or nullptr with the Python error set.
  PyObject* Take() {
    if (failed_) return nullptr;
    PyObject* root = root_;
    root_ = nullptr;
    return root;
  }

 private:
  // Takes a new reference (nullptr: the Python error is set).
  void Put(PyObject* o) {
    if (failed_ || o == nullptr) {
      Py_XDECREF(o);
      failed_ = true;
      return;
    }
    if (open_.empty()) {
      root_ = o;
    } else {
      items_.push_back(o);
    }
  }

  std::vector<PyObject*> items_;   // new references
  std::vector<std::size_t> open_;  // where each open container's items start in items_
  PyObject* root_ = nullptr;
  bool failed_ = false;
};

// Python values written as JSON text. A value JSON cannot hold stops the walk: `what_` says why
// and `path_` where (innermost first, filled in as the walk returns).
class Writer final {
 public:
  static constexpr int kMaxDepth = 1000;  // below the trace reader's 1,024 levels

  bool Value(PyObject* o, int depth) {
    if (o == Py_None) {
      out_ += "null";
    } else if (o == Py_True) {
      out_ += "true";
    } else if (o == Py_False) {
      out_ += "false";
    } else if (PyUnicode_Check(o)) {
      return String(o);
    } else if (PyLong_Check(o)) {
      return Int(o);
    } else if (PyFloat_Check(o)) {
      return Float(PyFloat_AS_DOUBLE(o));
    } else if (PyDict_Check(o)) {
      return Dict(o, depth);
    } else if (PyList_Check(o) || PyTuple_Check(o)) {
      return List(o, depth);
    } else {
      what_ = fmt::format("a {} is not JSON", Py_TYPE(o)->tp_name);
      return false;
    }
    return true;
  }

  std::string& out() { return out_; }
  // `root` and the path to the value, its outermost steps only when it is long (a container
  // that holds itself is a thousand steps deep).
  std::string Where(std::string_view root) const {
    constexpr std::size_t kShown = 8;
    std::string where(root);
    std::size_t shown = 0;
    for (auto it = path_.rbegin(); it != path_.rend() && shown < kShown; ++it, ++shown) {
      where += *it;
    }
    if (path_.size() > kShown) where += fmt::format("...({} levels more)", path_.size() - kShown);
    return where;
  }
  const std::string& what() const { return what_; }

 private:
  bool Deeper(int depth) {
    if (depth < kMaxDepth) return true;
    what_ =
        fmt::format("nested more than {} levels deep (does a container hold itself?)", kMaxDepth);
    return false;
  }

  bool Dict(PyObject* o, int depth) {
    if (!Deeper(depth)) return false;
    out_ += '{';
    Py_ssize_t pos = 0;
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    bool first = true;
    while (PyDict_Next(o, &pos, &key, &value)) {
      if (!first) out_ += ", ";
      first = false;
      if (!PyUnicode_Check(key)) {
        what_ =
            fmt::format("a key of type {} is not JSON (keys are strings)", Py_TYPE(key)->tp_name);
        return false;
      }
      const std::size_t key_start = out_.size();
      if (!String(key)) return false;
      const std::size_t key_end = out_.size();
      out_ += ": ";
      if (!Value(value, depth + 1)) {
        path_.push_back("[" + out_.substr(key_start, key_end - key_start) + "]");
        return false;
      }
    }
    out_ += '}';
    return true;
  }

  bool List(PyObject* o, int depth) {
    if (!Deeper(depth)) return false;
    out_ += '[';
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (i > 0) out_ += ", ";
      if (!Value(items[i], depth + 1)) {
        path_.push_back(fmt::format("[{}]", i));
        return false;
      }
    }
    out_ += ']';
    return true;
  }

  bool String(PyObject* o) {
    Py_ssize_t size = 0;
    const char* s = PyUnicode_AsUTF8AndSize(o, &size);
    if (s == nullptr) {
      PyErr_Clear();
      what_ = "a string that is not valid Unicode (a lone surrogate) is not JSON";
      return false;
    }
    out_ += '"';
    const char* run = s;  // bytes not yet copied, none of them escaped
    const char* end = s + size;
    for (const char* p = s; p < end; ++p) {
      const auto c = static_cast<unsigned char>(*p);
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      out_.append(run, p);
      run = p + 1;
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        case '\b': out_ += "\\b"; break;
        case '\f': out_ += "\\f"; break;
        default: fmt::format_to(std::back_inserter(out_), "\\u{:04x}", c);
      }
    }
    out_.append(run, end);
    out_ += '"';
    return true;
  }

  bool Int(PyObject* o) {
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
      char digits[24];
      out_.append(digits, fmt::format_to(digits, "{}", x));
      return true;
    }
    // Beyond 64 bits: the digits, as json.dumps writes them (int's own repr, not a subclass's).
    PyObject* digits = PyLong_Type.tp_repr(o);
    Py_ssize_t size = 0;
    const char* s = digits == nullptr ? nullptr : PyUnicode_AsUTF8AndSize(digits, &size);
    if (s == nullptr) {
      Py_XDECREF(digits);
      PyErr_Clear();
      what_ = "an int that cannot be written";
      return false;
    }
    out_.append(s, static_cast<std::size_t>(size));
    Py_DECREF(digits);
    return true;
  }

  bool Float(double d) {
    if (!std::isfinite(d)) {
      what_ = fmt::format("float {} is not JSON", std::isnan(d) ? "nan" : d > 0 ? "inf" : "-inf");
      return false;
    }
    // The shortest text that reads back as the same double; a float stays one ("2.0", not "2").
    char text[32];
    char* end = fmt::format_to(text, "{}", d);
    out_.append(text, end);
    if (std::find_if(text, end, [](char c) { return c == '.' || c == 'e'; }) == end) out_ += ".0";
    return true;
  }

  std::string out_;
  std::string what_;
  std::vector<std::string> path_;
};

}  // namespace

nb::object ToPython(const nlohmann::ordered_json& value) {
  Converter converter;
  PyObject* o = converter.Value(value, 0);
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

nb::object ToPython(const std::function<void(JsonSink&)>& emit) {
  ObjectSink sink;
  emit(sink);
  PyObject* o = sink.Take();
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

StatusOr<std::string> ToJsonText(nb::handle value, std::string_view root) {
  Writer w;
  w.out().reserve(16384);
  if (!w.Value(value.ptr(), 0)) return InvalidInput(w.Where(root) + ": " + w.what());
  return std::move(w.out());
}

}  // namespace fsdplab::python
