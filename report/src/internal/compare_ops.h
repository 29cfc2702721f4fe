// What the comparison of two reports and its Chrome timeline share: an op's key (kind, unit,
// phase, step, microbatch, occurrence) and an index of a report's ops by it. Private to the
// report room.
#pragma once

#include <map>
#include <string>
#include <tuple>

#include "fsdplab/report/report_compare.h"

namespace fsdplab::internal {

using OpKey = std::tuple<std::string, std::string, std::string, int, int, int>;

inline OpKey KeyOf(const ComparedReport::Op& op) {
  return {op.kind, op.unit, op.phase, op.step, op.microbatch, op.occurrence};
}

inline std::map<OpKey, const ComparedReport::Op*> IndexOps(const ComparedReport& report) {
  std::map<OpKey, const ComparedReport::Op*> out;
  for (const ComparedReport::Op& op : report.ops) out[KeyOf(op)] = &op;
  return out;
}

}  // namespace fsdplab::internal
