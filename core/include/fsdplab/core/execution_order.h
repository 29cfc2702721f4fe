// Execution orders (DESIGN §2.1): the sequences the scheduler prefetches along.
//
//   ExecutionOrder reg = ExecutionOrder::Registration(model);
//   reg.forward()   // pre-order walk of each root's subtree, roots in registration order
//   reg.backward()  // roots reversed, children reversed: a root before its children
//
// A recorded order comes from the scheduler's first ordinary pass (see Scheduler); its backward
// order may hold (unit, kRecompute) entries when the policy is recompute-aware.
#pragma once

#include <string>
#include <vector>

#include "fsdplab/core/model.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab {

struct OrderEntry final {
  UnitId unit = kNoUnit;
  Phase phase = Phase::kForward;  // kForward in forward(); kBackward or kRecompute in backward()
  friend bool operator==(const OrderEntry&, const OrderEntry&) = default;
};

class ExecutionOrder final {
 public:
  ExecutionOrder() = default;
  ExecutionOrder(std::vector<OrderEntry> forward, std::vector<OrderEntry> backward)
      : forward_(std::move(forward)), backward_(std::move(backward)) {}

  static ExecutionOrder Registration(const Model& model);

  const std::vector<OrderEntry>& forward() const { return forward_; }
  const std::vector<OrderEntry>& backward() const { return backward_; }
  bool empty() const { return forward_.empty() && backward_.empty(); }

  // {"forward": [...], "backward": [...]}: unit names; recompute entries as
  // {"unit": name, "phase": "recompute"}.
  std::string ToJson(const Model& model) const;
  // One line per direction: "forward:  a -> b -> c".
  std::string ToText(const Model& model) const;

  friend bool operator==(const ExecutionOrder&, const ExecutionOrder&) = default;

 private:
  std::vector<OrderEntry> forward_;
  std::vector<OrderEntry> backward_;
};

}  // namespace fsdplab
