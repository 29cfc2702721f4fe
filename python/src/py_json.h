// JSON documents across the Python boundary, without JSON text on the Python side: a document the
// libraries build (an nlohmann value) becomes dicts, lists, str, int, float, bool and None, as
// json.loads would make them of its text; a dict (or list) given from Python becomes the JSON text
// the libraries' readers take, so that a dict and a file with the same content read alike.
//
//   nb::object report = ToPython(ReportJson(run.report));   // with the GIL held
//   StatusOr<std::string> text = ToJsonText(trace_dict, "trace");
//   // a value JSON cannot hold: 'trace["units"][3]["bytes"]: float nan is not JSON'
//
// Both need the GIL; they run no Python code of the objects they walk.
#pragma once

#include <nanobind/nanobind.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fsdplab/core/status.h"
#include "fsdplab/report/json_sink.h"

namespace fsdplab::python {

// The value as json.loads would read `value.dump()`: integers as int (any size nlohmann holds),
// floats as float, a non-finite float as None (dump writes null), objects as dicts in key order.
// Keys and short strings that repeat are one Python object each. Raises (nb::python_error) only
// on a string that is not UTF-8, which dump() refuses too.
nanobind::object ToPython(const nlohmann::ordered_json& value);
// The same objects made directly from a document's calls (EmitReport, EmitJson), with no value
// between: ToPython([&](JsonSink& s) { EmitReport(report, s); }).
nanobind::object ToPython(const std::function<void(JsonSink&)>& emit);

// A Python value as JSON text (one line, json.dumps' separators): dict with str keys, list,
// tuple, str, int, float, bool and None, subclasses included. Anything else (a NaN or infinite
// float, a key that is not a str, another type, a string that is not Unicode, nesting deeper
// than a reader takes) is invalid input naming where it is, from `root` ("trace", "policy"):
// 'policy["units"]["layers.0"]["forward_prefetch"]: float nan is not JSON'.
StatusOr<std::string> ToJsonText(nanobind::handle value, std::string_view root);

}  // namespace fsdplab::python
