// Reads `fsdplab.trace` v1 with simdjson's on-demand API (DESIGN §5: the DOM is too slow for
// large traces) and checks everything DESIGN §4.1 lists, naming the field and its position.
// The JSON machinery is trace_json.h; the checks of events that need no JSON, trace_checks.h.
//
// One pass over the document: fields are taken in whatever order they come. Events are resolved
// against the units as they are read, so when "steps" comes before "units" its raw text is kept
// and parsed again once the units are known. Problems in values are collected and reading goes on;
// a document that is not readable JSON stops the walk where simdjson stopped.
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "fsdplab/core/file_util.h"
#include "fsdplab/core/limits.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/trace/trace_io.h"
#include "trace_checks.h"
#include "trace_json.h"

namespace fsdplab {
namespace {

using internal::EventChecker;
using internal::EventPath;
using internal::JsonWalker;
using internal::LineColumn;
using internal::R;
namespace od = simdjson::ondemand;

constexpr std::string_view kFormat = "fsdplab.trace";
constexpr std::int64_t kVersion = 1;

struct SvHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using NameMap = std::unordered_map<std::string, UnitId, SvHash, std::equal_to<>>;

struct UnitRaw {
  std::string name;
  std::optional<std::string> parent;
  std::vector<ParamSpec> params;
  RecomputeKind recompute = RecomputeKind::kNone;
};

enum class EventKey {
  kOp,
  kUnit,
  kPhase,
  kUs,
  kTsUs,
  kSavedBytes,
  kReleasedBytes,
  kPeakBytes,
  kGradBytes,
  kPeakGradBytes,
  kBytes,
  kKind,
  kStartUs,
  kEndUs,
  kCopyOutUs,
  kName,
  kArgs,
  kUnknown
};

// The keys of an event, dispatched on length first (this runs for every field of every event).
EventKey EventKeyOf(std::string_view key) {
  switch (key.size()) {
    case 2:
      if (key == "op") return EventKey::kOp;
      if (key == "us") return EventKey::kUs;
      break;
    case 4:
      if (key == "unit") return EventKey::kUnit;
      if (key == "kind") return EventKey::kKind;
      if (key == "name") return EventKey::kName;
      if (key == "args") return EventKey::kArgs;
      break;
    case 5:
      if (key == "phase") return EventKey::kPhase;
      if (key == "ts_us") return EventKey::kTsUs;
      if (key == "bytes") return EventKey::kBytes;
      break;
    case 6:
      if (key == "end_us") return EventKey::kEndUs;
      break;
    case 8:
      if (key == "start_us") return EventKey::kStartUs;
      break;
    case 10:
      if (key == "peak_bytes") return EventKey::kPeakBytes;
      if (key == "grad_bytes") return EventKey::kGradBytes;
      break;
    case 11:
      if (key == "saved_bytes") return EventKey::kSavedBytes;
      if (key == "copy_out_us") return EventKey::kCopyOutUs;
      break;
    case 14:
      if (key == "released_bytes") return EventKey::kReleasedBytes;
      break;
    case 15:
      if (key == "peak_grad_bytes") return EventKey::kPeakGradBytes;
      break;
    default: break;
  }
  return EventKey::kUnknown;
}

class Reader final : public JsonWalker {
 public:
  // `capacity`: as JsonWalker's.
  explicit Reader(std::string_view text, std::size_t capacity = 0) : JsonWalker(text, capacity) {}

  void Run();

  std::vector<Status> TakeProblems() {
    // A wrong format or version explains everything else, and a broken unit list explains the
    // events that name its units: those come first, each group in document order.
    auto rank = [](const Status& st) {
      const std::string& m = st.message();
      if (m.rfind("format:", 0) == 0 || m.rfind("version:", 0) == 0) return 0;
      if (m.rfind("units", 0) == 0 || m.rfind("meta", 0) == 0) return 1;
      return 2;
    };
    std::stable_sort(problems_.begin(), problems_.end(),
                     [&](const Status& a, const Status& b) { return rank(a) < rank(b); });
    if (overflow_ > 0) {
      problems_.push_back(
          InvalidInput(fmt::format("... and {} more problems not listed", overflow_)));
    }
    return std::move(problems_);
  }
  Trace TakeTrace(Model model) {
    Trace t;
    t.meta = std::move(meta_);
    t.model = std::move(model);
    t.steps = std::move(steps_);
    return t;
  }
  ModelBuilder& builder() { return builder_; }

 private:
  // Walks one document: the whole trace, or (`steps_only`) a deferred "steps" array.
  void Walk(std::string_view text, std::size_t base, bool steps_only);

  R ParseMeta(od::value& v);
  R ParseUnits(od::value& v);
  R ParseParam(od::value& v, std::size_t u, std::size_t p, ParamSpec& out);
  R ParseSteps(od::value& v);
  R ParseEvent(od::value& v, std::size_t s, std::size_t m, std::size_t e, Event& out);
  // An event's `args`: a JSON object, kept as its compact text.
  template <typename Where>
  R ReadArgs(od::value& v, Where&& where, std::string& out);
  void IndexUnits();
  UnitId Lookup(std::string_view name);

  std::string_view deferred_steps_;  // "steps" seen before "units": walked afterwards
  bool have_units_ = false;
  bool have_steps_ = false;
  std::optional<std::string> format_;
  std::optional<std::int64_t> version_;
  std::size_t last_event_count_ = 0;
  bool format_seen_ = false;
  bool units_seen_ = false;
  bool version_seen_ = false;
  std::size_t deferred_offset_ = 0;

  TraceMeta meta_;
  std::vector<UnitRaw> units_;
  ModelBuilder builder_;
  std::vector<Step> steps_;
  NameMap ids_;
  std::unique_ptr<EventChecker> checker_;
  // One-entry cache: consecutive events usually name the same unit.
  std::string last_name_;
  UnitId last_id_ = kNoUnit;
};

R Reader::ParseMeta(od::value& v) {
  od::object obj;
  auto where = [] { return std::string("meta"); };
  R r = Obj(v, obj, where);
  if (r != R::kOk) return r;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  std::int64_t world_size = 1;
  std::int64_t rank = 0;
  r = Fields(obj, where, [&](std::string_view key, od::value& fv) -> R {
    auto fwhere = [&] { return fmt::format("meta.{}", key); };
    if (key == "source") {
      std::string_view src;
      R x = Str(fv, src, fwhere);
      if (x == R::kOk) meta_.source = std::string(src);
      return x;
    }
    if (key == "world_size" || key == "rank") {
      std::int64_t n = 0;
      R x = Int(fv, n, fwhere);
      if (x != R::kOk) return x;
      if (key == "world_size") {
        if (n < 1 || n > std::numeric_limits<int>::max()) {
          Add(fmt::format("meta.world_size: must be a positive integer, got {}", n));
          return R::kBad;
        }
        world_size = n;
      } else {
        rank = n;
      }
      return R::kOk;
    }
    if (key == "device" || key == "backend") {
      // Where a recorded run ran (cpu | cuda) and its process group's backend (gloo, nccl, ...):
      // checked here, kept verbatim with the other keys.
      std::string_view text;
      R x = Str(fv, text, fwhere);
      if (x != R::kOk) return x;
      if (key == "device" && text != "cpu" && text != "cuda") {
        Add(fmt::format("meta.device: '{}' is not a device (cpu or cuda)", text));
        return R::kBad;
      }
      if (text.empty()) {
        Add("meta.backend: empty (the process group's backend, e.g. gloo or nccl)");
        return R::kBad;
      }
      extra[std::string(key)] = std::string(text);
      return R::kOk;
    }
    // Any other key is kept verbatim.
    od::json_type t;
    if (auto err = fv.type().get(t)) return Fatal(err, fwhere());
    std::string_view raw;
    simdjson::error_code err = simdjson::SUCCESS;
    if (t == od::json_type::object) {
      od::object o;
      err = fv.get_object().get(o);
      if (!err) err = o.raw_json().get(raw);
    } else if (t == od::json_type::array) {
      od::array a;
      err = fv.get_array().get(a);
      if (!err) err = a.raw_json().get(raw);
    } else {
      raw = fv.raw_json_token();
    }
    if (err) return Fatal(err, fwhere());
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(raw, nullptr, false);
    if (j.is_discarded()) {
      Add(fmt::format("meta.{}: unreadable value", key));
      return R::kBad;
    }
    extra[std::string(key)] = std::move(j);
    return R::kOk;
  });
  if (r == R::kFatal) return r;
  meta_.world_size = static_cast<int>(world_size);
  if (rank < 0 || rank >= world_size) {
    Add(fmt::format("meta.rank: rank {} is outside 0..{} (world_size {})", rank, world_size - 1,
                    world_size));
    r = R::kBad;
  } else {
    meta_.rank = static_cast<int>(rank);
  }
  meta_.extra_json = extra.dump();
  return r;
}

R Reader::ParseParam(od::value& v, std::size_t u, std::size_t p, ParamSpec& out) {
  auto where = [&] { return fmt::format("units[{}].params[{}]", u, p); };
  od::object obj;
  R r = Obj(v, obj, where);
  if (r != R::kOk) return r;
  bool has_name = false;
  bool has_dtype = false;
  bool has_shape = false;
  r = Fields(obj, where, [&](std::string_view key, od::value& fv) -> R {
    auto fwhere = [&] { return fmt::format("{}.{}", where(), key); };
    if (key == "name") {
      std::string_view name;
      R x = Str(fv, name, fwhere);
      if (x == R::kOk) out.name = std::string(name);
      has_name = true;
      return x;
    }
    if (key == "dtype") {
      has_dtype = true;
      std::string_view text;
      R x = Str(fv, text, fwhere);
      if (x != R::kOk) return x;
      std::optional<DType> d = ParseDType(text);
      if (!d) {
        Add(fmt::format("{}: unknown dtype '{}' (expected fp32, bf16, fp16 or mxfp8)", fwhere(),
                        text));
        return R::kBad;
      }
      out.dtype = *d;
      return R::kOk;
    }
    if (key == "shape") {
      has_shape = true;
      od::array arr;
      R x = Arr(fv, arr, fwhere);
      if (x != R::kOk) return x;
      return Items(arr, fwhere, [&](std::size_t k, od::value& dv) -> R {
        std::int64_t d = 0;
        R y = Int(dv, d, [&] { return fmt::format("{}[{}]", fwhere(), k); });
        out.shape.push_back(d);  // negative dims are reported by the model's checks
        return y;
      });
    }
    if (key == "numel") {
      std::int64_t n = 0;
      R x = Int(fv, n, fwhere);
      if (x != R::kOk) return x;
      if (n < 0) {
        Add(fmt::format("{}: negative numel {}", fwhere(), n));
        return R::kBad;
      }
      out.numel = static_cast<Elements>(n);
      return R::kOk;
    }
    Add(fmt::format("{}: unknown key '{}' (a parameter has name, dtype, shape, numel)", where(),
                    key));
    return R::kBad;
  });
  if (r == R::kFatal) return r;
  if (!has_name) Add(fmt::format("{}.name: missing", where()));
  if (!has_dtype) Add(fmt::format("{}.dtype: missing (fp32, bf16, fp16 or mxfp8)", where()));
  if (!has_shape && !out.numel.has_value()) {
    Add(fmt::format("{}: needs shape or numel", where()));
  }
  return (has_name && has_dtype && (has_shape || out.numel)) ? r : R::kBad;
}

R Reader::ParseUnits(od::value& v) {
  od::array arr;
  auto where = [] { return std::string("units"); };
  R r = Arr(v, arr, where);
  if (r != R::kOk) return r;
  r = Items(arr, where, [&](std::size_t i, od::value& uv) -> R {
    auto uwhere = [&] { return fmt::format("units[{}]", i); };
    if (static_cast<std::int64_t>(i) >= kMaxUnits) {
      // Stop here: the rest could only be refused too. Listed first, whatever else was found.
      fatal_ = true;
      problems_.insert(
          problems_.begin(),
          InvalidInput(fmt::format("units: more than the {} units a model may have", kMaxUnits)));
      return R::kFatal;
    }
    UnitRaw u;
    od::object obj;
    R x = Obj(uv, obj, uwhere);
    if (x == R::kFatal) return x;
    bool has_name = false;
    if (x == R::kOk) {
      x = Fields(obj, uwhere, [&](std::string_view key, od::value& fv) -> R {
        auto fwhere = [&] { return fmt::format("units[{}].{}", i, key); };
        if (key == "name") {
          std::string_view name;
          R y = Str(fv, name, fwhere);
          if (y == R::kOk) {
            u.name = std::string(name);
            has_name = true;
          }
          return y;
        }
        if (key == "parent") {
          od::json_type t;
          if (auto err = fv.type().get(t)) return Fatal(err, fwhere());
          if (t == od::json_type::null) return R::kOk;
          std::string_view parent;
          R y = Str(fv, parent, fwhere);
          if (y == R::kOk) u.parent = std::string(parent);
          return y;
        }
        if (key == "recompute") {
          std::string_view text;
          R y = Str(fv, text, fwhere);
          if (y != R::kOk) return y;
          std::optional<RecomputeKind> k = ParseRecomputeKind(text);
          if (!k) {
            Add(fmt::format("{}: unknown recompute kind '{}' (expected none, reentrant or inside)",
                            fwhere(), text));
            return R::kBad;
          }
          u.recompute = *k;
          return R::kOk;
        }
        if (key == "params") {
          od::array params;
          R y = Arr(fv, params, fwhere);
          if (y != R::kOk) return y;
          return Items(params, fwhere, [&](std::size_t p, od::value& pv) -> R {
            ParamSpec spec;
            R z = ParseParam(pv, i, p, spec);
            u.params.push_back(std::move(spec));
            return z;
          });
        }
        Add(fmt::format("units[{}]: unknown key '{}' (a unit has name, parent, recompute, params)",
                        i, key));
        return R::kBad;
      });
      if (x == R::kFatal) return x;
      if (!has_name && x != R::kFatal) Add(fmt::format("units[{}].name: missing", i));
    }
    // Keep positions aligned with the document even when the unit is unusable.
    if (!has_name) u.name = fmt::format("<units[{}]>", i);
    units_.push_back(std::move(u));
    return x;
  });
  if (r != R::kFatal) IndexUnits();
  return r;
}

void Reader::IndexUnits() {
  have_units_ = true;
  for (std::size_t i = 0; i < units_.size(); ++i) {
    ids_.emplace(units_[i].name, static_cast<UnitId>(i));  // the first of a duplicated name
  }
  checker_ = std::make_unique<EventChecker>(static_cast<int>(units_.size()));
}

UnitId Reader::Lookup(std::string_view name) {
  if (last_id_ != kNoUnit && name == last_name_) return last_id_;
  auto it = ids_.find(name);
  if (it == ids_.end()) return kNoUnit;
  last_name_.assign(name);
  last_id_ = it->second;
  return last_id_;
}

template <typename Where>
R Reader::ReadArgs(od::value& v, Where&& where, std::string& out) {
  od::object obj;
  R r = Obj(v, obj, where);
  if (r != R::kOk) return r;
  std::string_view raw;
  if (auto err = obj.raw_json().get(raw)) return Fatal(err, where());
  // On-demand skips an object without checking its scalars: nlohmann checks them and gives the
  // compact text the writer prints back (key order kept).
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(raw, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    Add(fmt::format("{}: not a readable JSON object", where()));
    return R::kBad;
  }
  out = j.dump();
  return R::kOk;
}

R Reader::ParseEvent(od::value& v, std::size_t s, std::size_t m, std::size_t e, Event& out) {
  auto where = [&] { return EventPath(s, m, e); };
  od::object obj;
  R r = Obj(v, obj, where);
  if (r != R::kOk) return r;
  std::string_view op_text;
  std::string_view unit_text;
  std::string_view phase_text;
  std::string_view kind_text;
  bool has_op = false, has_unit = false, unit_null = false, has_phase = false, has_us = false;
  bool has_saved = false, has_kind = false, has_bytes = false, has_start = false, has_end = false;
  bool has_copy_out = false;
  bool has_released = false, has_peak = false, has_grad = false, has_peak_grad = false;
  bool unit_bad = false, phase_read = false, kind_read = false;
  bool bad = false;
  r = Fields(obj, where, [&](std::string_view key, od::value& fv) -> R {
    auto fwhere = [&] { return fmt::format("{}.{}", where(), key); };
    R x = R::kOk;
    switch (EventKeyOf(key)) {
      case EventKey::kOp:
        x = Str(fv, op_text, fwhere);
        has_op = x == R::kOk;
        break;
      case EventKey::kUnit: {
        has_unit = true;
        od::json_type t;
        if (auto err = fv.type().get(t)) return Fatal(err, fwhere());
        if (t == od::json_type::null) {
          unit_null = true;
        } else {
          x = Str(fv, unit_text, fwhere);
          unit_bad = x != R::kOk;
        }
        break;
      }
      case EventKey::kPhase:
        x = Str(fv, phase_text, fwhere);
        has_phase = true;
        phase_read = x == R::kOk;
        break;
      case EventKey::kUs:
        x = Double(fv, out.us, fwhere);
        has_us = true;
        break;
      case EventKey::kTsUs: {
        double ts = 0;
        x = Double(fv, ts, fwhere);
        if (x == R::kOk) out.ts_us = ts;
        break;
      }
      case EventKey::kSavedBytes:
      case EventKey::kReleasedBytes:
      case EventKey::kPeakBytes:
      case EventKey::kGradBytes:
      case EventKey::kPeakGradBytes:
      case EventKey::kBytes: {
        const EventKey k = EventKeyOf(key);
        std::int64_t n = 0;
        x = Int(fv, n, fwhere);
        (k == EventKey::kBytes           ? has_bytes
         : k == EventKey::kSavedBytes    ? has_saved
         : k == EventKey::kReleasedBytes ? has_released
         : k == EventKey::kPeakBytes     ? has_peak
         : k == EventKey::kGradBytes     ? has_grad
                                         : has_peak_grad) = true;
        if (x == R::kOk && n < 0) {
          Add(fmt::format("{}: negative size {}", fwhere(), n));
          x = R::kBad;
        }
        if (x != R::kOk) break;
        const auto b = static_cast<Bytes>(n);
        switch (k) {
          case EventKey::kBytes: out.bytes = b; break;
          case EventKey::kSavedBytes: out.saved_bytes = b; break;
          case EventKey::kReleasedBytes: out.released_bytes = b; break;
          case EventKey::kPeakBytes: out.peak_bytes = b; break;
          case EventKey::kGradBytes: out.grad_bytes = b; break;
          default: out.peak_grad_bytes = b; break;
        }
        break;
      }
      case EventKey::kKind:
        x = Str(fv, kind_text, fwhere);
        has_kind = true;
        kind_read = x == R::kOk;
        break;
      case EventKey::kStartUs:
        x = Double(fv, out.start_us, fwhere);
        has_start = true;
        break;
      case EventKey::kEndUs:
        x = Double(fv, out.end_us, fwhere);
        has_end = true;
        break;
      case EventKey::kCopyOutUs: {
        TimeUs copy_out = 0;
        x = Double(fv, copy_out, fwhere);
        if (x == R::kOk) out.copy_out_us = copy_out;
        has_copy_out = true;
        break;
      }
      case EventKey::kName: {
        std::string_view name;
        x = Str(fv, name, fwhere);
        if (x == R::kOk && name.empty()) {
          Add(fmt::format("{}: empty label (leave the key out for none)", fwhere()));
          x = R::kBad;
        }
        if (x == R::kOk) out.name = std::string(name);
        break;
      }
      case EventKey::kArgs: x = ReadArgs(fv, fwhere, out.args_json); break;
      case EventKey::kUnknown:
        Add(fmt::format(
            "{}: unknown key '{}' (an event has op, unit, phase, us, saved_bytes, "
            "released_bytes, peak_bytes, grad_bytes, peak_grad_bytes, ts_us, kind, bytes, "
            "start_us, end_us, copy_out_us, name, args)",
            where(), key));
        x = R::kBad;
        break;
    }
    return x;
  });
  if (r == R::kFatal) return r;
  bad = bad || r == R::kBad;
  if (!has_op) {
    if (r != R::kBad) {
      Add(
          fmt::format("{}.op: missing (pre_forward, post_forward, pre_backward, post_backward, "
                      "compute, backward_end or collective)",
                      where()));
    }
    return R::kBad;
  }
  std::optional<Op> op = ParseOp(op_text);
  if (!op) {
    Add(
        fmt::format("{}.op: unknown op '{}' (expected pre_forward, post_forward, pre_backward, "
                    "post_backward, compute, backward_end or collective)",
                    where(), op_text));
    return R::kBad;
  }
  out.op = *op;
  const bool compute = out.op == Op::kCompute;
  const bool collective = out.op == Op::kCollective;
  auto not_for = [&](bool present, std::string_view key, std::string_view who) {
    if (!present) return;
    Add(fmt::format("{}.{}: a {} event has no {} (only a {} has)", where(), key, op_text, key,
                    who));
    bad = true;
  };
  if (!compute) {
    not_for(has_phase, "phase", "compute");
    not_for(has_us, "us", "compute");
    not_for(has_saved, "saved_bytes", "compute");
    not_for(has_released, "released_bytes", "compute");
    not_for(has_peak, "peak_bytes", "compute");
    not_for(has_grad, "grad_bytes", "compute");
    not_for(has_peak_grad, "peak_grad_bytes", "compute");
  }
  if (!collective) {
    not_for(has_kind, "kind", "collective");
    not_for(has_bytes, "bytes", "collective");
    not_for(has_start, "start_us", "collective");
    not_for(has_end, "end_us", "collective");
    not_for(has_copy_out, "copy_out_us", "collective");
  }

  // The unit.
  bool unit_ok = false;
  if (has_unit && !unit_null) {
    UnitId id = Lookup(unit_text);
    if (id == kNoUnit) {
      Add(fmt::format("{}.unit: unknown unit '{}'", where(), unit_text));
      bad = true;
    } else {
      out.unit = id;
      unit_ok = true;
    }
  }
  const bool hook = out.op == Op::kPreForward || out.op == Op::kPostForward ||
                    out.op == Op::kPreBackward || out.op == Op::kPostBackward;
  if (hook && !unit_ok && !unit_bad && (!has_unit || unit_null)) {
    Add(fmt::format("{}.unit: missing: a {} names its unit", where(), op_text));
    bad = true;
  }
  if (out.op == Op::kBackwardEnd && unit_ok) {
    Add(fmt::format("{}.unit: backward_end names no unit", where()));
    bad = true;
  }

  if (compute) {
    if (!has_phase) {
      Add(
          fmt::format("{}.phase: missing: a compute needs a phase (forward, backward, recompute or "
                      "optimizer)",
                      where()));
      bad = true;
    } else if (phase_read) {
      std::optional<Phase> ph = ParsePhase(phase_text);
      if (ph) {
        out.phase = *ph;
      } else {
        Add(
            fmt::format("{}.phase: unknown phase '{}' (expected forward, backward, recompute or "
                        "optimizer)",
                        where(), phase_text));
        bad = true;
      }
    }
    if (!has_us) {
      Add(fmt::format("{}.us: missing: a compute needs its duration in microseconds", where()));
      bad = true;
    }
  }
  if (collective) {
    if (!has_kind) {
      Add(fmt::format("{}.kind: missing (all_gather, reduce_scatter or all_reduce)", where()));
      bad = true;
    } else if (kind_read) {
      std::optional<CollectiveKind> k = ParseCollectiveKind(kind_text);
      if (k) {
        out.kind = *k;
      } else {
        Add(
            fmt::format("{}.kind: unknown collective kind '{}' (expected all_gather, "
                        "reduce_scatter or all_reduce)",
                        where(), kind_text));
        bad = true;
      }
    }
    if (!has_bytes) Add(fmt::format("{}.bytes: missing", where())), bad = true;
    if (!has_start) Add(fmt::format("{}.start_us: missing", where())), bad = true;
    if (!has_end) Add(fmt::format("{}.end_us: missing", where())), bad = true;
  }

  std::size_t before = problems_.size() + overflow_;
  checker_->Check(
      out, unit_ok, where, [&](UnitId id) -> std::string_view { return units_[id].name; },
      [&](std::string msg) { Add(std::move(msg)); });
  bad = bad || problems_.size() + overflow_ != before;
  return bad ? R::kBad : R::kOk;
}

R Reader::ParseSteps(od::value& v) {
  od::array arr;
  auto where = [] { return std::string("steps"); };
  R r = Arr(v, arr, where);
  if (r != R::kOk) return r;
  return Items(arr, where, [&](std::size_t s, od::value& sv) -> R {
    auto swhere = [&] { return fmt::format("steps[{}]", s); };
    steps_.emplace_back();
    od::object sobj;
    R x = Obj(sv, sobj, swhere);
    if (x != R::kOk) return x;
    bool has_mbs = false;
    x = Fields(sobj, swhere, [&](std::string_view key, od::value& mv) -> R {
      if (key != "microbatches") {
        Add(fmt::format("steps[{}]: unknown key '{}' (a step has microbatches)", s, key));
        return R::kBad;
      }
      has_mbs = true;
      auto mswhere = [&] { return fmt::format("steps[{}].microbatches", s); };
      od::array mbs;
      R y = Arr(mv, mbs, mswhere);
      if (y != R::kOk) return y;
      return Items(mbs, mswhere, [&](std::size_t m, od::value& mbv) -> R {
        auto mwhere = [&] { return fmt::format("steps[{}].microbatches[{}]", s, m); };
        std::vector<Microbatch>& mb_list = steps_.back().microbatches;
        mb_list.emplace_back();
        checker_->BeginMicrobatch();
        od::object mobj;
        R z = Obj(mbv, mobj, mwhere);
        if (z != R::kOk) return z;
        bool has_events = false;
        z = Fields(mobj, mwhere, [&](std::string_view mkey, od::value& ev) -> R {
          if (mkey != "events") {
            Add(fmt::format("{}: unknown key '{}' (a microbatch has events)", mwhere(), mkey));
            return R::kBad;
          }
          has_events = true;
          auto ewhere = [&] { return fmt::format("{}.events", mwhere()); };
          od::array events;
          R q = Arr(ev, events, ewhere);
          if (q != R::kOk) return q;
          std::vector<Event>& list = mb_list.back().events;
          list.reserve(last_event_count_);  // microbatches of one trace are alike
          R items = Items(events, ewhere, [&](std::size_t e, od::value& evv) -> R {
            list.emplace_back();
            return ParseEvent(evv, s, m, e, list.back());
          });
          last_event_count_ = list.size();
          return items;
        });
        if (z != R::kFatal && !has_events) {
          Add(fmt::format("{}.events: missing", mwhere()));
          z = R::kBad;
        }
        return z;
      });
    });
    if (x != R::kFatal && !has_mbs) {
      Add(fmt::format("steps[{}].microbatches: missing", s));
      x = R::kBad;
    }
    return x;
  });
}

void Reader::Walk(std::string_view text, std::size_t base, bool steps_only) {
  // In place when the caller's buffer has simdjson's padding after `text` (a file read with
  // spare capacity; a deferred "steps" array is followed by the rest of the document).
  const bool in_place = capacity_ >= base + text.size() + simdjson::SIMDJSON_PADDING;
  simdjson::padded_string copy;
  if (!in_place) copy = simdjson::padded_string(text);
  const simdjson::padded_string_view padded =
      in_place ? simdjson::padded_string_view(text.data(), text.size(), capacity_ - base)
               : simdjson::padded_string_view(copy);
  od::parser parser;
  od::document doc;
  buf_begin_ = padded.data();
  buf_end_ = padded.data() + padded.size();
  base_ = base;
  doc_ = nullptr;
  if (auto err = parser.iterate(padded).get(doc)) {
    Fatal(err, steps_only ? "steps" : "");
    return;
  }
  doc_ = &doc;
  if (steps_only) {
    od::value v;
    if (auto err = doc.get_value().get(v)) {
      Fatal(err, "steps");
    } else {
      ParseSteps(v);
    }
    doc_ = nullptr;
    return;
  }
  od::object root;
  if (auto err = doc.get_object().get(root)) {
    RootNotObject(doc, err, "a trace is a JSON object ({\"format\": \"fsdplab.trace\", ...})");
    doc_ = nullptr;
    return;
  }
  auto where = [] { return std::string(); };
  R r = Fields(root, where, [&](std::string_view key, od::value& v) -> R {
    if (key == "format") {
      std::string_view f;
      R x = Str(v, f, [] { return std::string("format"); });
      format_seen_ = true;
      if (x == R::kOk) format_ = std::string(f);
      return x;
    }
    if (key == "version") {
      std::int64_t n = 0;
      R x = Int(v, n, [] { return std::string("version"); });
      version_seen_ = true;
      if (x == R::kOk) version_ = n;
      return x;
    }
    if (key == "meta") return ParseMeta(v);
    if (key == "units") {
      units_seen_ = true;
      return ParseUnits(v);
    }
    if (key == "steps") {
      have_steps_ = true;
      if (have_units_) return ParseSteps(v);
      // Units come later: keep the raw array and walk it once they are known.
      od::array a;
      R x = Arr(v, a, [] { return std::string("steps"); });
      if (x != R::kOk) return x;
      std::string_view raw;
      if (auto err = a.raw_json().get(raw)) return Fatal(err, "steps");
      deferred_offset_ = base_ + static_cast<std::size_t>(raw.data() - buf_begin_);
      deferred_steps_ = text_.substr(deferred_offset_, raw.size());
      return R::kOk;
    }
    Add(fmt::format("unknown top-level key '{}' (a trace has format, version, meta, units, steps)",
                    key));
    return R::kBad;
  });
  // Anything after the root object is an error: current_location() fails only at the end.
  const char* rest = nullptr;
  if (r != R::kFatal && !doc.current_location().get(rest)) Fatal(simdjson::TRAILING_CONTENT, "");
  doc_ = nullptr;
}

void Reader::Run() {
  Walk(text_, 0, false);
  if (fatal_) return;
  if (!format_seen_) {
    Add("format: missing (a trace starts with \"format\": \"fsdplab.trace\")");
  } else if (format_ && *format_ != kFormat) {
    Add(fmt::format("format: unknown format '{}' (expected '{}')", *format_, kFormat));
  }
  if (!version_seen_) {
    Add("version: missing (this reader reads version 1)");
  } else if (!version_) {
  } else if (*version_ > kVersion) {
    Add(fmt::format("version: version {} is newer than this reader (it reads version {})",
                    *version_, kVersion));
  } else if (*version_ < 1) {
    Add(fmt::format("version: invalid version {} (this reader reads version {})", *version_,
                    kVersion));
  }
  if (!units_seen_) Add("units: missing");
  if (!have_steps_) Add("steps: missing");
  if (have_units_ && !deferred_steps_.empty()) Walk(deferred_steps_, deferred_offset_, true);
  // What the run was configured with (meta.recorded_policy), in the policy's per-unit
  // vocabulary and over this trace's units: checked by the policy's own reader.
  if (have_units_) {
    const auto is_unit = [&](std::string_view name) { return ids_.find(name) != ids_.end(); };
    if (Status s = ReadRecordedPolicy(meta_.extra_json, is_unit).status(); !s.ok()) {
      Add(s.message());
    }
  }
  for (UnitRaw& u : units_) {
    builder_.AddUnit(std::move(u.name), std::move(u.parent), std::move(u.params), u.recompute);
  }
  for (Status& s : builder_.Problems()) Add(s.message());
}

}  // namespace
namespace {

StatusOr<Trace> Parse(std::string_view json_text, std::size_t capacity) {
  Reader reader(json_text, capacity);
  reader.Run();
  std::vector<Status> problems = reader.TakeProblems();
  if (!problems.empty()) return problems.front();
  FSDP_ASSIGN_OR_RETURN(Model model, std::move(reader.builder()).Build());
  return reader.TakeTrace(std::move(model));
}

}  // namespace

StatusOr<Trace> ParseTrace(std::string_view json_text) { return Parse(json_text, 0); }

StatusOr<Trace> ReadTraceFile(const std::string& path) {
  // Read with simdjson's padding to spare, so that the text is parsed where it was read.
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, simdjson::SIMDJSON_PADDING));
  StatusOr<Trace> trace = Parse(text, text.capacity());
  if (!trace.ok()) return trace.status().WithContext(path);
  return trace;
}

std::vector<Status> ValidateTraceText(std::string_view json_text) {
  Reader reader(json_text);
  reader.Run();
  return reader.TakeProblems();
}

}  // namespace fsdplab
