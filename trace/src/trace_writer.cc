// Writes `fsdplab.trace` v1 deterministically: one unit per line, one event per line, numbers in
// their shortest form that reads back to the same double (fmt's "{}"), so that
// ParseTrace(WriteTrace(t)) is the same trace as t.
#include <fmt/format.h>

#include <iterator>
#include <nlohmann/json.hpp>

#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

using Buffer = fmt::memory_buffer;

void AppendEscaped(Buffer& out, std::string_view s) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\r': out.append(std::string_view("\\r")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      case '\b': out.append(std::string_view("\\b")); break;
      case '\f': out.append(std::string_view("\\f")); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void AppendNumber(Buffer& out, double v) { fmt::format_to(std::back_inserter(out), "{}", v); }
void AppendNumber(Buffer& out, std::uint64_t v) {
  fmt::format_to(std::back_inserter(out), "{}", v);
}

void AppendParam(Buffer& out, const ParamSpec& p) {
  out.append(std::string_view("{\"name\": "));
  AppendEscaped(out, p.name);
  out.append(std::string_view(", \"dtype\": "));
  AppendEscaped(out, DTypeName(p.dtype));
  if (!p.shape.empty() || !p.numel.has_value()) {
    out.append(std::string_view(", \"shape\": ["));
    for (std::size_t k = 0; k < p.shape.size(); ++k) {
      if (k > 0) out.append(std::string_view(", "));
      fmt::format_to(std::back_inserter(out), "{}", p.shape[k]);
    }
    out.push_back(']');
  }
  if (p.numel.has_value()) {
    out.append(std::string_view(", \"numel\": "));
    AppendNumber(out, static_cast<std::uint64_t>(*p.numel));
  }
  out.push_back('}');
}

void AppendEvent(Buffer& out, const Event& ev, const Model& model) {
  out.append(std::string_view("{\"op\": \""));
  out.append(OpName(ev.op));
  out.push_back('"');
  if (ev.op != Op::kBackwardEnd) {
    out.append(std::string_view(", \"unit\": "));
    if (ev.unit == kNoUnit) {
      out.append(std::string_view("null"));
    } else {
      AppendEscaped(out, model.NameOf(ev.unit));
    }
  }
  if (ev.op == Op::kCompute) {
    out.append(std::string_view(", \"phase\": \""));
    out.append(PhaseName(ev.phase));
    out.append(std::string_view("\", \"us\": "));
    AppendNumber(out, ev.us);
    if (ev.saved_bytes != 0) {
      out.append(std::string_view(", \"saved_bytes\": "));
      AppendNumber(out, ev.saved_bytes);
    }
    if (ev.released_bytes.has_value()) {
      out.append(std::string_view(", \"released_bytes\": "));
      AppendNumber(out, *ev.released_bytes);
    }
    if (ev.peak_bytes != 0) {
      out.append(std::string_view(", \"peak_bytes\": "));
      AppendNumber(out, ev.peak_bytes);
    }
    if (ev.grad_bytes.has_value()) {
      out.append(std::string_view(", \"grad_bytes\": "));
      AppendNumber(out, *ev.grad_bytes);
    }
    if (ev.peak_grad_bytes.has_value()) {
      out.append(std::string_view(", \"peak_grad_bytes\": "));
      AppendNumber(out, *ev.peak_grad_bytes);
    }
  }
  if (ev.op == Op::kCollective) {
    out.append(std::string_view(", \"kind\": \""));
    out.append(CollectiveKindName(ev.kind));
    out.append(std::string_view("\", \"bytes\": "));
    AppendNumber(out, ev.bytes);
    out.append(std::string_view(", \"start_us\": "));
    AppendNumber(out, ev.start_us);
    out.append(std::string_view(", \"end_us\": "));
    AppendNumber(out, ev.end_us);
    if (ev.copy_out_us.has_value()) {
      out.append(std::string_view(", \"copy_out_us\": "));
      AppendNumber(out, *ev.copy_out_us);
    }
  }
  if (ev.ts_us.has_value()) {
    out.append(std::string_view(", \"ts_us\": "));
    AppendNumber(out, *ev.ts_us);
  }
  if (!ev.name.empty()) {
    out.append(std::string_view(", \"name\": "));
    AppendEscaped(out, ev.name);
  }
  if (!ev.args_json.empty()) {
    out.append(std::string_view(", \"args\": "));
    out.append(ev.args_json);
  }
  out.push_back('}');
}

// The fields an event of this op carries in the format; others are not compared.
bool SameExtra(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto ja = nlohmann::ordered_json::parse(a, nullptr, false);
  auto jb = nlohmann::ordered_json::parse(b, nullptr, false);
  if (ja.is_discarded() || jb.is_discarded()) return false;
  return ja == jb;
}

bool SameArgs(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return a.empty() && b.empty();
  return SameExtra(a, b);
}

bool SameEvent(const Event& a, const Event& b) {
  if (a.op != b.op || a.ts_us != b.ts_us || a.name != b.name ||
      !SameArgs(a.args_json, b.args_json)) {
    return false;
  }
  if (a.op != Op::kBackwardEnd && a.unit != b.unit) return false;
  if (a.op == Op::kCompute) {
    return a.phase == b.phase && a.us == b.us && a.saved_bytes == b.saved_bytes &&
           a.released_bytes == b.released_bytes && a.peak_bytes == b.peak_bytes &&
           a.grad_bytes == b.grad_bytes && a.peak_grad_bytes == b.peak_grad_bytes;
  }
  if (a.op == Op::kCollective) {
    return a.kind == b.kind && a.bytes == b.bytes && a.start_us == b.start_us &&
           a.end_us == b.end_us && a.copy_out_us == b.copy_out_us;
  }
  return true;
}

}  // namespace

bool SameTrace(const Trace& a, const Trace& b) {
  if (a.meta.source != b.meta.source || a.meta.world_size != b.meta.world_size ||
      a.meta.rank != b.meta.rank || !SameExtra(a.meta.extra_json, b.meta.extra_json)) {
    return false;
  }
  if (a.model.num_units() != b.model.num_units()) return false;
  for (UnitId i = 0; i < a.model.num_units(); ++i) {
    const Unit& ua = a.model.unit(i);
    const Unit& ub = b.model.unit(i);
    if (ua.name() != ub.name() || ua.parent() != ub.parent() || ua.recompute() != ub.recompute() ||
        ua.params() != ub.params()) {
      return false;
    }
  }
  if (a.steps.size() != b.steps.size()) return false;
  for (std::size_t s = 0; s < a.steps.size(); ++s) {
    const auto& ma = a.steps[s].microbatches;
    const auto& mb = b.steps[s].microbatches;
    if (ma.size() != mb.size()) return false;
    for (std::size_t m = 0; m < ma.size(); ++m) {
      const auto& ea = ma[m].events;
      const auto& eb = mb[m].events;
      if (ea.size() != eb.size()) return false;
      for (std::size_t e = 0; e < ea.size(); ++e) {
        if (!SameEvent(ea[e], eb[e])) return false;
      }
    }
  }
  return true;
}

std::string WriteTrace(const Trace& trace) {
  Buffer out;
  const Model& model = trace.model;
  out.append(std::string_view("{\n  \"format\": \"fsdplab.trace\", \"version\": 1,\n"));
  out.append(std::string_view("  \"meta\": {\"source\": "));
  AppendEscaped(out, trace.meta.source);
  fmt::format_to(std::back_inserter(out), ", \"world_size\": {}, \"rank\": {}",
                 trace.meta.world_size, trace.meta.rank);
  auto extra = nlohmann::ordered_json::parse(trace.meta.extra_json, nullptr, false);
  if (!extra.is_discarded() && extra.is_object()) {
    for (const auto& [key, value] : extra.items()) {
      if (key == "source" || key == "world_size" || key == "rank") continue;
      out.append(std::string_view(", "));
      AppendEscaped(out, key);
      out.append(std::string_view(": "));
      out.append(value.dump());
    }
  }
  out.append(std::string_view("},\n  \"units\": ["));
  for (UnitId i = 0; i < model.num_units(); ++i) {
    const Unit& u = model.unit(i);
    out.append(std::string_view(i == 0 ? "\n    {\"name\": " : ",\n    {\"name\": "));
    AppendEscaped(out, u.name());
    out.append(std::string_view(", \"parent\": "));
    if (u.is_root()) {
      out.append(std::string_view("null"));
    } else {
      AppendEscaped(out, model.NameOf(u.parent()));
    }
    out.append(std::string_view(", \"recompute\": \""));
    out.append(RecomputeKindName(u.recompute()));
    out.append(std::string_view("\",\n     \"params\": ["));
    for (std::size_t j = 0; j < u.params().size(); ++j) {
      if (j > 0) out.append(std::string_view(", "));
      AppendParam(out, u.params()[j]);
    }
    out.append(std::string_view("]}"));
  }
  out.append(std::string_view(model.num_units() > 0 ? "\n  ],\n" : "],\n"));
  out.append(std::string_view("  \"steps\": ["));
  for (std::size_t s = 0; s < trace.steps.size(); ++s) {
    out.append(
        std::string_view(s == 0 ? "\n    {\"microbatches\": [" : ",\n    {\"microbatches\": ["));
    const auto& mbs = trace.steps[s].microbatches;
    for (std::size_t m = 0; m < mbs.size(); ++m) {
      out.append(std::string_view(m == 0 ? "\n      {\"events\": [" : ",\n      {\"events\": ["));
      const auto& events = mbs[m].events;
      for (std::size_t e = 0; e < events.size(); ++e) {
        out.append(std::string_view(e == 0 ? "\n        " : ",\n        "));
        AppendEvent(out, events[e], model);
      }
      out.append(std::string_view(events.empty() ? "]}" : "\n      ]}"));
    }
    out.append(std::string_view(mbs.empty() ? "]}" : "\n    ]}"));
  }
  out.append(std::string_view(trace.steps.empty() ? "]\n}\n" : "\n  ]\n}\n"));
  return fmt::to_string(out);
}

Status WriteTraceFile(const Trace& trace, const std::string& path) {
  return WriteFileAtomic(path, WriteTrace(trace));
}

}  // namespace fsdplab
