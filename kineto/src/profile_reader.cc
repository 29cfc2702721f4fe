// Reads Kineto's Chrome-trace JSON a chunk at a time: a small scanner walks the top-level object
// and cuts the `traceEvents` array into its elements; each element is parsed with simdjson's
// on-demand API and reduced to a ProfileEvent. Memory is the reduced events, not the file.
#include <fmt/format.h>
#include <simdjson.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "fsdplab/kineto/kineto.h"
#include "internal/vocabulary.h"

namespace fsdplab::kineto {
namespace {

namespace od = simdjson::ondemand;

// Events one profile may hold (each kept event is ~40 bytes: 2^27 of them is ~5 GB).
constexpr std::size_t kMaxEvents = std::size_t{1} << 27;
// Bytes of one event's JSON (an event with a huge args blob is not a profiler's).
constexpr std::size_t kMaxEventBytes = std::size_t{64} << 20;
constexpr std::size_t kChunk = std::size_t{1} << 20;
// A tensor's elements (and any one dimension): 2^48, as core's kMaxParamElements.
constexpr std::int64_t kMaxDim = std::int64_t{1} << 48;
// Timestamps and durations beyond 2^60 us (36,000 years) are not a profiler's.
constexpr double kMaxTimeUs = 1152921504606846976.0;
// One allocation: 2^56 bytes, as core's parameter bytes.
constexpr std::int64_t kMaxMemoryBytes = std::int64_t{1} << 56;
using internal::kAccumulateGrad;
using internal::kMemoryEvent;

// Bytes in: a gzip stream (zlib, by its magic bytes) or plain text, from a file or memory.
class Input final {
 public:
  static StatusOr<std::unique_ptr<Input>> OpenFile(const std::string& path) {
    auto in = std::unique_ptr<Input>(new Input());
    in->file_ = std::fopen(path.c_str(), "rb");
    if (in->file_ == nullptr) {
      return NotFound(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    }
    in->raw_.resize(kChunk);
    return in;
  }
  static std::unique_ptr<Input> FromText(std::string_view text) {
    auto in = std::unique_ptr<Input>(new Input());
    in->text_ = text;
    return in;
  }
  ~Input() {
    if (file_ != nullptr) std::fclose(file_);
    if (gzip_) inflateEnd(&zs_);
  }
  Input(const Input&) = delete;
  Input& operator=(const Input&) = delete;

  // Fills `out` with up to out.size() bytes; 0 at the end. Errors: corrupt or truncated gzip.
  StatusOr<std::size_t> Read(char* out, std::size_t n) {
    if (!started_) {
      started_ = true;
      FSDP_RETURN_IF_ERROR(Start());
    }
    if (!gzip_) return ReadRaw(out, n);
    zs_.next_out = reinterpret_cast<Bytef*>(out);
    zs_.avail_out = static_cast<uInt>(n);
    while (zs_.avail_out == n) {
      if (zs_.avail_in == 0) {
        FSDP_ASSIGN_OR_RETURN(std::size_t got, ReadRaw(raw_.data(), raw_.size()));
        if (got == 0) {
          if (stream_end_) return std::size_t{0};
          return InvalidInput("gzip stream truncated (ends before its end marker)");
        }
        zs_.next_in = reinterpret_cast<Bytef*>(raw_.data());
        zs_.avail_in = static_cast<uInt>(got);
      }
      if (stream_end_) {
        // Concatenated gzip members are one stream (as gzip -d reads them).
        if (inflateReset(&zs_) != Z_OK) return InvalidInput("gzip: cannot reset the decoder");
        stream_end_ = false;
      }
      int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        stream_end_ = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return InvalidInput(
            fmt::format("corrupt gzip data ({})", zs_.msg ? zs_.msg : "zlib error"));
      }
      if (stream_end_ && zs_.avail_in == 0 && zs_.avail_out == n) {
        FSDP_ASSIGN_OR_RETURN(std::size_t got, ReadRaw(raw_.data(), raw_.size()));
        if (got == 0) return std::size_t{0};
        zs_.next_in = reinterpret_cast<Bytef*>(raw_.data());
        zs_.avail_in = static_cast<uInt>(got);
      }
    }
    return n - zs_.avail_out;
  }

 private:
  Input() = default;

  Status Start() {
    // Peek at the first two bytes for gzip's magic.
    char head[2];
    FSDP_ASSIGN_OR_RETURN(std::size_t got, ReadRaw(head, 2));
    pending_.assign(head, got);
    if (got == 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
        static_cast<unsigned char>(head[1]) == 0x8b) {
      gzip_ = true;
      std::memset(&zs_, 0, sizeof(zs_));
      if (inflateInit2(&zs_, 15 + 32) != Z_OK) return InternalError("zlib: inflateInit2 failed");
      if (raw_.empty()) raw_.resize(kChunk);
      std::memcpy(raw_.data(), head, 2);
      zs_.next_in = reinterpret_cast<Bytef*>(raw_.data());
      zs_.avail_in = 2;
      pending_.clear();
    }
    return Status::Ok();
  }

  StatusOr<std::size_t> ReadRaw(char* out, std::size_t n) {
    std::size_t done = 0;
    if (!pending_.empty()) {
      done = std::min(n, pending_.size());
      std::memcpy(out, pending_.data(), done);
      pending_.erase(0, done);
      if (done == n) return done;
    }
    if (file_ != nullptr) {
      std::size_t got = std::fread(out + done, 1, n - done, file_);
      if (got < n - done && std::ferror(file_)) return InvalidInput("read error");
      return done + got;
    }
    std::size_t got = std::min(n - done, text_.size() - text_pos_);
    if (got > 0) std::memcpy(out + done, text_.data() + text_pos_, got);
    text_pos_ += got;
    return done + got;
  }

  std::FILE* file_ = nullptr;
  std::string_view text_;
  std::size_t text_pos_ = 0;
  std::string pending_;
  std::vector<char> raw_;
  z_stream zs_{};
  bool gzip_ = false;
  bool started_ = false;
  bool stream_end_ = false;
};

struct SvHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using NameIds = std::unordered_map<std::string, std::int32_t, SvHash, std::equal_to<>>;

// The bytes that change the state of the value scanner.
constexpr std::array<std::uint8_t, 256> kStructural = [] {
  std::array<std::uint8_t, 256> t{};
  for (unsigned char c : std::string_view("\"\\{}[]")) t[c] = 1;
  return t;
}();

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

class Reader final {
 public:
  Reader(std::unique_ptr<Input> in, std::string source) : in_(std::move(in)) {
    profile_.source = std::move(source);
    buf_.resize(kChunk);
    element_.reserve(4096 + simdjson::SIMDJSON_PADDING);
  }

  StatusOr<Profile> Run() {
    FSDP_RETURN_IF_ERROR(Walk());
    profile_.json_bytes = consumed_;
    return std::move(profile_);
  }

 private:
  Status Error(std::string_view what) const {
    return InvalidInput(fmt::format("{}: {}", profile_.source, what));
  }
  Status Truncated(std::string_view where) const {
    return Error(fmt::format("the file ends inside {} (truncated?) after {} bytes", where,
                             consumed_ + pos_));
  }

  // Next byte, refilling; -1 at the end of the input.
  StatusOr<int> Peek() {
    if (pos_ == len_) {
      FSDP_RETURN_IF_ERROR(Refill());
      if (len_ == 0) return -1;
    }
    return static_cast<unsigned char>(buf_[pos_]);
  }
  Status Refill() {
    consumed_ += len_;
    pos_ = 0;
    len_ = 0;
    StatusOr<std::size_t> got = in_->Read(buf_.data(), buf_.size());
    if (!got.ok()) return Error(got.status().message());
    len_ = *got;
    return Status::Ok();
  }
  StatusOr<int> NextNonSpace() {
    while (true) {
      FSDP_ASSIGN_OR_RETURN(int c, Peek());
      if (c < 0 || !IsSpace(static_cast<char>(c))) return c;
      ++pos_;
    }
  }
  Status Expect(char want, std::string_view where) {
    FSDP_ASSIGN_OR_RETURN(int c, NextNonSpace());
    if (c < 0) return Truncated(where);
    if (c != want) {
      return Error(fmt::format("expected '{}' in {} at byte {}, found '{}'", want, where,
                               consumed_ + pos_, static_cast<char>(c)));
    }
    ++pos_;
    return Status::Ok();
  }

  // Copies (or skips, out == nullptr) one JSON value starting at the next non-space byte:
  // containers by depth outside strings, strings to their closing quote, scalars to a delimiter.
  Status ScanValue(std::string* out, std::string_view where) {
    FSDP_ASSIGN_OR_RETURN(int first, NextNonSpace());
    if (first < 0) return Truncated(where);
    int depth = 0;
    bool in_string = false;
    bool escape = false;
    const bool scalar = first != '{' && first != '[' && first != '"';
    bool started = false;
    while (true) {
      if (pos_ == len_) {
        FSDP_RETURN_IF_ERROR(Refill());
        if (len_ == 0) {
          if (scalar && started) return Status::Ok();
          return Truncated(where);
        }
      }
      const char* b = buf_.data();
      std::size_t i = pos_;
      bool done = false;
      if (!started) {
        started = true;
        const char c = b[i++];
        in_string = c == '"';
        depth = (c == '{' || c == '[') ? 1 : 0;
      }
      if (scalar) {
        for (; i < len_; ++i) {
          const char c = b[i];
          if (c == ',' || c == '}' || c == ']' || IsSpace(c)) {
            done = true;
            break;
          }
        }
      } else {
        // Only quotes, backslashes and brackets matter: a table skips every other byte.
        for (; i < len_; ++i) {
          const auto c = static_cast<unsigned char>(b[i]);
          if (escape) {  // the byte after a backslash, whatever it is
            escape = false;
            continue;
          }
          if (kStructural[c] == 0) continue;
          if (in_string) {
            if (c == '\\') {
              escape = true;
            } else if (c == '"') {
              in_string = false;
              if (depth == 0) {
                ++i;
                done = true;
                break;
              }
            }
            continue;
          }
          if (c == '"') {
            in_string = true;
          } else if (c == '{' || c == '[') {
            ++depth;
          } else if (c == '}' || c == ']') {
            if (--depth == 0) {
              ++i;
              done = true;
              break;
            }
          }
        }
      }
      if (out != nullptr) {
        if (out->size() + (i - pos_) > kMaxEventBytes) {
          return Error(fmt::format("{} is larger than {} bytes: not a profiler event", where,
                                   kMaxEventBytes));
        }
        out->append(b + pos_, i - pos_);
      }
      pos_ = i;
      if (done) return Status::Ok();
    }
  }

  StatusOr<std::string> ReadKey(std::string_view where) {
    std::string key;
    FSDP_ASSIGN_OR_RETURN(int c, NextNonSpace());
    if (c < 0) return Truncated(where);
    if (c != '"') {
      return Error(fmt::format("expected a key string in {} at byte {}", where, consumed_ + pos_));
    }
    FSDP_RETURN_IF_ERROR(ScanValue(&key, where));
    if (key.size() < 2) return Error(fmt::format("bad key in {}", where));
    return key.substr(1, key.size() - 2);
  }

  Status Walk() {
    FSDP_ASSIGN_OR_RETURN(int c, NextNonSpace());
    if (c < 0) return Error("empty file: expected a Kineto trace (a JSON object)");
    if (c != '{') {
      return Error("not a Kineto trace: expected a JSON object with \"traceEvents\"");
    }
    ++pos_;
    bool saw_events = false;
    FSDP_ASSIGN_OR_RETURN(c, NextNonSpace());
    if (c == '}') return Error("no \"traceEvents\" array: not a Kineto trace");
    while (true) {
      FSDP_ASSIGN_OR_RETURN(std::string key, ReadKey("the top-level object"));
      FSDP_RETURN_IF_ERROR(Expect(':', "the top-level object"));
      if (key == "traceEvents") {
        saw_events = true;
        FSDP_RETURN_IF_ERROR(ReadEvents());
      } else if (key == "distributedInfo" || key == "record_shapes") {
        std::string text;
        FSDP_RETURN_IF_ERROR(ScanValue(&text, key));
        FSDP_RETURN_IF_ERROR(TopLevel(key, text));
      } else {
        FSDP_RETURN_IF_ERROR(ScanValue(nullptr, fmt::format("\"{}\"", key)));
      }
      FSDP_ASSIGN_OR_RETURN(c, NextNonSpace());
      if (c < 0) return Truncated("the top-level object");
      ++pos_;
      if (c == '}') break;
      if (c != ',') {
        return Error(
            fmt::format("expected ',' or '}}' after \"{}\" at byte {}", key, consumed_ + pos_ - 1));
      }
    }
    FSDP_ASSIGN_OR_RETURN(c, NextNonSpace());
    if (c >= 0)
      return Error(
          fmt::format("trailing content after the JSON object at byte {}", consumed_ + pos_));
    if (!saw_events) return Error("no \"traceEvents\" array: not a Kineto trace");
    return Status::Ok();
  }

  Status TopLevel(std::string_view key, std::string& text) {
    text.reserve(text.size() + simdjson::SIMDJSON_PADDING);
    simdjson::padded_string_view view(text.data(), text.size(), text.capacity());
    od::document doc;
    if (parser_.iterate(view).get(doc) != simdjson::SUCCESS) {
      return Error(fmt::format("\"{}\" is not valid JSON", key));
    }
    if (key == "record_shapes") {
      std::int64_t v = 0;
      if (doc.get_int64().get(v) == simdjson::SUCCESS) profile_.record_shapes = v != 0;
      return Status::Ok();
    }
    od::object obj;
    if (doc.get_object().get(obj) != simdjson::SUCCESS) return Status::Ok();
    for (auto field : obj) {
      std::string_view k;
      if (field.unescaped_key().get(k) != simdjson::SUCCESS) break;
      std::int64_t v = 0;
      std::string_view backend;
      if (k == "backend" && field.value().get_string().get(backend) == simdjson::SUCCESS) {
        profile_.backend = std::string(backend);
      } else if (k == "rank" && field.value().get_int64().get(v) == simdjson::SUCCESS) {
        profile_.rank = static_cast<int>(v);
      } else if (k == "world_size" && field.value().get_int64().get(v) == simdjson::SUCCESS) {
        profile_.world_size = static_cast<int>(v);
      }
    }
    return Status::Ok();
  }

  Status ReadEvents() {
    FSDP_RETURN_IF_ERROR(Expect('[', "\"traceEvents\""));
    FSDP_ASSIGN_OR_RETURN(int c, NextNonSpace());
    if (c == ']') {
      ++pos_;
      return Status::Ok();
    }
    for (std::size_t index = 0;; ++index) {
      element_.clear();
      FSDP_RETURN_IF_ERROR(ScanValue(&element_, "\"traceEvents\""));
      FSDP_RETURN_IF_ERROR(ParseEvent(index));
      FSDP_ASSIGN_OR_RETURN(c, NextNonSpace());
      if (c < 0) return Truncated("\"traceEvents\"");
      ++pos_;
      if (c == ']') return Status::Ok();
      if (c != ',') {
        return Error(fmt::format("traceEvents[{}]: expected ',' or ']' after the event", index));
      }
    }
  }

  std::int32_t Intern(NameIds& map, std::vector<std::string>& list, std::string_view s) {
    auto it = map.find(s);
    if (it != map.end()) return it->second;
    auto id = static_cast<std::int32_t>(list.size());
    list.emplace_back(s);
    map.emplace(list.back(), id);
    return id;
  }

  static bool WantsArgs(std::string_view name) {
    return name.starts_with("c10d::") || name == "record_param_comms" ||
           name == "fsdp::all_gather_copy_in" || name.starts_with("nccl:") ||
           name == kAccumulateGrad;
  }

  Status ParseEvent(std::size_t index) {
    auto bad = [&](std::string_view what) {
      return Error(fmt::format("traceEvents[{}]: {}", index, what));
    };
    if (element_.empty() || element_[0] != '{') return bad("not an object");
    if (element_.capacity() < element_.size() + simdjson::SIMDJSON_PADDING) {
      element_.reserve(element_.size() + simdjson::SIMDJSON_PADDING);
    }
    simdjson::padded_string_view view(element_.data(), element_.size(), element_.capacity());
    od::document doc;
    od::object obj;
    if (parser_.iterate(view).get(doc) != simdjson::SUCCESS ||
        doc.get_object().get(obj) != simdjson::SUCCESS) {
      return bad("not a JSON object");
    }
    std::string_view ph;
    std::string_view cat;
    std::string_view name;
    std::string_view pid;
    std::string_view tid;
    std::optional<double> ts;
    std::optional<double> dur;
    std::string_view args_raw;
    thread_.clear();
    tid_.clear();
    auto ph_wants_args = [](std::string_view c) {
      return c == "kernel" || c == "gpu_memcpy" || c == "gpu_memset" || c == "cuda_runtime" ||
             c == "cuda_driver";
    };
    // A pid or tid: a number's own text, or a string's contents (no conversion).
    auto id_text = [&](od::value v, std::string_view& out) -> bool {
      od::json_type t;
      if (v.type().get(t) != simdjson::SUCCESS) return false;
      if (t == od::json_type::string) return v.get_string().get(out) == simdjson::SUCCESS;
      if (t != od::json_type::number) return false;
      out = v.raw_json_token();
      while (!out.empty() && IsSpace(out.back())) out.remove_suffix(1);
      return true;
    };
    for (auto field : obj) {
      std::string_view key;
      if (field.unescaped_key().get(key) != simdjson::SUCCESS) return bad("not a JSON object");
      od::value v;
      if (field.value().get(v) != simdjson::SUCCESS) return bad("not a JSON object");
      simdjson::error_code err = simdjson::SUCCESS;
      if (key == "ph") {
        err = v.get_string().get(ph);
      } else if (key == "cat") {
        err = v.get_string().get(cat);
      } else if (key == "name") {
        err = v.get_string().get(name);
      } else if (key == "pid") {
        if (!id_text(v, pid)) return bad("pid: expected a number or a string");
        thread_.assign(pid);
      } else if (key == "tid") {
        if (!id_text(v, tid)) return bad("tid: expected a number or a string");
        tid_.assign(tid);
      } else if (key == "ts") {
        double d = 0;
        err = v.get_double().get(d);
        if (err == simdjson::SUCCESS) ts = d;
      } else if (key == "dur") {
        double d = 0;
        err = v.get_double().get(d);
        if (err == simdjson::SUCCESS) dur = d;
      } else if (key == "args" &&
                 (name.empty() || WantsArgs(name) || ph_wants_args(cat) || name == kMemoryEvent)) {
        od::object args_obj;
        err = v.get_object().get(args_obj);
        if (err == simdjson::SUCCESS) err = args_obj.raw_json().get(args_raw);
      }
      if (err != simdjson::SUCCESS) {
        return bad(fmt::format("{}: {}", key, simdjson::error_message(err)));
      }
    }
    if (ph == "i" && name == kMemoryEvent) return ParseMemory(args_raw, *ts, index);
    if (ph != "X") return Status::Ok();  // metadata, flows, other instants: not read
    if (!ts || !dur) return bad("a complete event (\"ph\": \"X\") needs \"ts\" and \"dur\"");
    if (!std::isfinite(*ts) || !std::isfinite(*dur) || *dur < 0 || !std::isfinite(*ts + *dur) ||
        std::fabs(*ts) > kMaxTimeUs || *dur > kMaxTimeUs) {
      return bad(fmt::format(
          "ts {} / dur {}: not a time and a duration >= 0 (finite, below 2^60 us)", *ts, *dur));
    }
    ProfileEvent e;
    e.ts = *ts;
    e.dur = *dur;
    if (cat == "cpu_op") {
      e.cat = Category::kCpuOp;
    } else if (cat == "user_annotation" || cat == "gpu_user_annotation") {
      e.cat = cat == "user_annotation" ? Category::kAnnotation : Category::kOther;
    } else if (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset") {
      e.cat = Category::kKernel;
    } else if (cat == "cuda_runtime" || cat == "cuda_driver") {
      e.cat = Category::kRuntime;
    } else if (cat == "python_function" && internal::IsFsdpFrame(name)) {
      e.cat = Category::kFsdpFrame;
    } else if (cat == "python_function" && internal::IsRecorderFrame(name)) {
      e.cat = Category::kRecorderFrame;
    } else if (cat != "python_function") {
      return Status::Ok();  // profiler spans, ...: not read
    }
    if (profile_.events.size() + profile_.python_frames.size() >= kMaxEvents) {
      return bad(fmt::format("more than {} events: too large to import", kMaxEvents));
    }
    thread_ += '/';
    thread_ += tid_;
    e.thread = Intern(thread_ids_, profile_.threads, thread_);
    if (cat == "python_function") {
      // Every Python frame is counted (the Python tracer's cost); FSDP2's and the recorder's
      // are also kept whole.
      profile_.python_frames.push_back({e.ts, e.thread});
      if (e.cat == Category::kOther) return Status::Ok();
    }
    e.name = Intern(name_ids_, profile_.names, name);
    if (!args_raw.empty() &&
        (e.cat == Category::kKernel || e.cat == Category::kRuntime || WantsArgs(name))) {
      FSDP_RETURN_IF_ERROR(ParseArgs(args_raw, e, WantsArgs(name), index));
    }
    profile_.events.push_back(e);
    return Status::Ok();
  }

  // A "[memory]" instant: the bytes allocated (> 0) or freed (< 0) and on which device.
  Status ParseMemory(std::string_view raw, std::optional<double> ts, std::size_t index) {
    auto bad = [&](std::string_view what) {
      return Error(fmt::format("traceEvents[{}] ([memory]): {}", index, what));
    };
    if (!ts || !std::isfinite(*ts) || std::fabs(*ts) > kMaxTimeUs) return bad("no finite \"ts\"");
    if (raw.empty()) return bad("no \"args\"");
    args_text_.assign(raw);
    args_text_.reserve(args_text_.size() + simdjson::SIMDJSON_PADDING);
    simdjson::padded_string_view view(args_text_.data(), args_text_.size(), args_text_.capacity());
    od::document doc;
    od::object obj;
    if (args_parser_.iterate(view).get(doc) != simdjson::SUCCESS ||
        doc.get_object().get(obj) != simdjson::SUCCESS) {
      return bad("args: not a JSON object");
    }
    MemoryEvent m;
    m.ts = *ts;
    bool has_bytes = false;
    for (auto field : obj) {
      std::string_view key;
      if (field.unescaped_key().get(key) != simdjson::SUCCESS) return bad("not a JSON object");
      od::value v;
      if (field.value().get(v) != simdjson::SUCCESS) return bad("not a JSON object");
      if (key == "Bytes") {
        if (v.get_int64().get(m.bytes) != simdjson::SUCCESS) return bad("Bytes: not an integer");
        if (m.bytes > kMaxMemoryBytes || m.bytes < -kMaxMemoryBytes) {
          return bad(fmt::format("Bytes {} is out of range", m.bytes));
        }
        has_bytes = true;
      } else if (key == "Addr") {
        std::uint64_t u = 0;
        if (v.get_uint64().get(u) != simdjson::SUCCESS) return bad("Addr: not an integer >= 0");
        m.addr = static_cast<std::int64_t>(u);  // an identity only
      } else if (key == "Device Type") {
        std::int64_t d = 0;
        if (v.get_int64().get(d) != simdjson::SUCCESS) return bad("Device Type: not an integer");
        m.device = d != 0;
      }
    }
    if (!has_bytes) return bad("no \"Bytes\"");
    if (profile_.memory.size() >= kMaxEvents) {
      return bad(fmt::format("more than {} memory events: too large to import", kMaxEvents));
    }
    thread_ += '/';
    thread_ += tid_;
    m.thread = Intern(thread_ids_, profile_.threads, thread_);
    profile_.memory.push_back(m);
    return Status::Ok();
  }

  Status ParseArgs(std::string_view raw, ProfileEvent& e, bool op_args, std::size_t index) {
    auto bad = [&](std::string_view what) {
      return Error(fmt::format("traceEvents[{}].args: {}", index, what));
    };
    args_text_.assign(raw);
    args_text_.reserve(args_text_.size() + simdjson::SIMDJSON_PADDING);
    simdjson::padded_string_view view(args_text_.data(), args_text_.size(), args_text_.capacity());
    od::document doc;
    od::object obj;
    if (args_parser_.iterate(view).get(doc) != simdjson::SUCCESS ||
        doc.get_object().get(obj) != simdjson::SUCCESS) {
      return bad("not a JSON object");
    }
    OpArgs a;
    for (auto field : obj) {
      std::string_view key;
      if (field.unescaped_key().get(key) != simdjson::SUCCESS) return bad("not a JSON object");
      od::value v;
      if (field.value().get(v) != simdjson::SUCCESS) return bad("not a JSON object");
      simdjson::error_code err = simdjson::SUCCESS;
      if (key == "correlation") {
        err = v.get_int64().get(e.correlation);
      } else if (!op_args) {
        continue;
      } else if (key == "Input Dims") {
        od::array outer;
        err = v.get_array().get(outer);
        if (err != simdjson::SUCCESS) return bad(fmt::format("\"{}\": expected an array", key));
        for (auto item : outer) {
          if (err != simdjson::SUCCESS) break;
          od::array dims;
          if ((err = item.get_array().get(dims)) != simdjson::SUCCESS) break;
          std::vector<std::int64_t> flat;
          std::vector<std::int64_t> numels;
          for (auto d : dims) {
            od::json_type t;
            if ((err = d.type().get(t)) != simdjson::SUCCESS) break;
            if (t == od::json_type::array) {  // a tensor list: one shape per tensor
              std::int64_t n = 1;
              od::array inner;
              if ((err = d.get_array().get(inner)) != simdjson::SUCCESS) break;
              for (auto x : inner) {
                std::int64_t k = 0;
                if ((err = x.get_int64().get(k)) != simdjson::SUCCESS) break;
                if (k < 0 || k > kMaxDim || (k > 0 && n > kMaxDim / k)) {
                  return bad(
                      fmt::format("\"Input Dims\": a tensor of more than {} elements", kMaxDim));
                }
                n *= k;
              }
              if (err != simdjson::SUCCESS) break;
              numels.push_back(n);
            } else {
              std::int64_t k = 0;
              if ((err = d.get_int64().get(k)) != simdjson::SUCCESS) break;
              if (k < 0 || k > kMaxDim) {
                return bad(fmt::format("\"Input Dims\": dimension {} is out of range", k));
              }
              flat.push_back(k);
            }
          }
          if (err != simdjson::SUCCESS) break;
          a.input_dims.push_back(std::move(flat));
          a.list_dims.push_back(std::move(numels));
        }
      } else if (key == "Input type" || key == "Concrete Inputs") {
        od::array arr;
        err = v.get_array().get(arr);
        if (err != simdjson::SUCCESS) return bad(fmt::format("\"{}\": expected an array", key));
        auto& out = key == "Input type" ? a.input_types : a.concrete_inputs;
        for (auto item : arr) {
          if (err != simdjson::SUCCESS) break;
          std::string_view s;
          if ((err = item.get_string().get(s)) != simdjson::SUCCESS) break;
          out.emplace_back(s);
        }
      } else if (key == "Collective name" || key == "dtype") {
        std::string_view s;
        err = v.get_string().get(s);
        (key == "dtype" ? a.dtype : a.collective_name).assign(s);
      } else if (key == "In msg nelems" || key == "Out msg nelems") {
        std::int64_t& n = key == "In msg nelems" ? a.in_nelems : a.out_nelems;
        err = v.get_int64().get(n);
        if (err == simdjson::SUCCESS && (n < 0 || n > kMaxDim)) {
          return bad(fmt::format("\"{}\": {} is out of range", key, n));
        }
      } else if (key == "Group size") {
        err = v.get_int64().get(a.group_size);
      }
      if (err != simdjson::SUCCESS) {
        return bad(fmt::format("\"{}\": {}", key, simdjson::error_message(err)));
      }
    }
    if (op_args) {
      e.args = static_cast<std::int32_t>(profile_.args.size());
      profile_.args.push_back(std::move(a));
    }
    return Status::Ok();
  }

  std::unique_ptr<Input> in_;
  std::vector<char> buf_;
  std::size_t pos_ = 0;
  std::size_t len_ = 0;
  std::uint64_t consumed_ = 0;
  std::string element_;
  std::string args_text_;
  od::parser parser_;
  od::parser args_parser_;
  Profile profile_;
  NameIds name_ids_;
  NameIds thread_ids_;
  std::string thread_;
  std::string tid_;
};

}  // namespace

StatusOr<Profile> ReadProfile(const std::string& path) {
  FSDP_ASSIGN_OR_RETURN(std::unique_ptr<Input> in, Input::OpenFile(path));
  return Reader(std::move(in), path).Run();
}

StatusOr<Profile> ParseProfile(std::string_view json_text, std::string source) {
  return Reader(Input::FromText(json_text), std::move(source)).Run();
}

}  // namespace fsdplab::kineto
