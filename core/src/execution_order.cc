#include "fsdplab/core/execution_order.h"

#include <fmt/format.h>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <nlohmann/json.hpp>

namespace fsdplab {
namespace {

// The unit tree as a Boost graph: an edge from each parent to each child, added in
// registration order (so out-edges are visited in registration order).
using UnitTree = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;

UnitTree BuildUnitTree(const Model& model) {
  UnitTree tree(static_cast<std::size_t>(model.num_units()));
  for (const Unit& u : model.units()) {
    for (UnitId child : u.children()) {
      boost::add_edge(static_cast<std::size_t>(u.id()), static_cast<std::size_t>(child), tree);
    }
  }
  return tree;
}

// Pre-order walk from `root`; children in registration order, or reversed.
void PreOrder(const UnitTree& tree, UnitId root, bool reverse_children, Phase phase,
              std::vector<OrderEntry>& out) {
  std::vector<std::size_t> stack = {static_cast<std::size_t>(root)};
  while (!stack.empty()) {
    std::size_t v = stack.back();
    stack.pop_back();
    out.push_back({static_cast<UnitId>(v), phase});
    std::vector<std::size_t> children;
    for (auto [it, end] = boost::adjacent_vertices(v, tree); it != end; ++it) {
      children.push_back(*it);
    }
    // The stack pops the last pushed first: push in the opposite order of the visit.
    if (reverse_children) {
      for (std::size_t c : children) stack.push_back(c);
    } else {
      for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(*it);
    }
  }
}

}  // namespace

ExecutionOrder ExecutionOrder::Registration(const Model& model) {
  UnitTree tree = BuildUnitTree(model);
  std::vector<OrderEntry> forward;
  std::vector<OrderEntry> backward;
  forward.reserve(static_cast<std::size_t>(model.num_units()));
  backward.reserve(static_cast<std::size_t>(model.num_units()));
  for (UnitId root : model.roots()) PreOrder(tree, root, false, Phase::kForward, forward);
  for (auto it = model.roots().rbegin(); it != model.roots().rend(); ++it) {
    PreOrder(tree, *it, true, Phase::kBackward, backward);
  }
  return {std::move(forward), std::move(backward)};
}

std::string ExecutionOrder::ToJson(const Model& model) const {
  auto entries = [&](const std::vector<OrderEntry>& seq) {
    nlohmann::json arr = nlohmann::json::array();
    for (const OrderEntry& e : seq) {
      std::string name(model.NameOf(e.unit));
      if (e.phase == Phase::kRecompute) {
        arr.push_back({{"unit", name}, {"phase", "recompute"}});
      } else {
        arr.push_back(name);
      }
    }
    return arr;
  };
  nlohmann::json j;
  j["forward"] = entries(forward_);
  j["backward"] = entries(backward_);
  return j.dump();
}

std::string ExecutionOrder::ToText(const Model& model) const {
  auto line = [&](const std::vector<OrderEntry>& seq) {
    std::string out;
    for (std::size_t i = 0; i < seq.size(); ++i) {
      if (i > 0) out += " -> ";
      out += model.NameOf(seq[i].unit);
      if (seq[i].phase == Phase::kRecompute) out += " (recompute)";
    }
    return out.empty() ? std::string("(empty)") : out;
  };
  return fmt::format("forward:  {}\nbackward: {}\n", line(forward_), line(backward_));
}

}  // namespace fsdplab
