// The dependency graph of a simulated run and its longest path (critical_path.h), the causes in
// words with their what-if savings, and the JSON and text forms.
#include "fsdplab/sim/critical_path.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/dag_shortest_paths.hpp>
#include <boost/graph/topological_sort.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "engine.h"
#include "fsdplab/sim/simulator.h"

namespace fsdplab::sim {

std::string_view DepKindName(DepKind kind) {
  switch (kind) {
    case DepKind::kStart: return "start";
    case DepKind::kStream: return "stream order";
    case DepKind::kHostIssue: return "host issue";
    case DepKind::kHostOrder: return "host order";
    case DepKind::kEvent: return "event wait";
    case DepKind::kMemoryCap: return "memory cap";
  }
  return "?";
}

namespace {

struct EdgeProp {
  double weight = 0;  // the duration of the edge's target: path lengths are end times
  DepKind kind = DepKind::kStream;
};
using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS,
                                    boost::no_property, EdgeProp>;

// Among dependencies that end at the same instant, the one that says most about the wait.
int Priority(DepKind kind) {
  switch (kind) {
    case DepKind::kMemoryCap: return 5;
    case DepKind::kEvent: return 4;
    case DepKind::kHostIssue: return 3;
    case DepKind::kStream: return 2;
    case DepKind::kHostOrder: return 1;
    case DepKind::kStart: return 0;
  }
  return 0;
}
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

// What a node stands for: a host issue (command), a stream entry, or a collective shared by
// every rank.
struct Node {
  int rank = 0;
  int stream = -1;          // -1: a host issue
  std::uint32_t index = 0;  // the command, or the entry on the stream
  TimeUs start = 0;
  TimeUs end = 0;
  std::int64_t timeline_id = -1;
};

std::string WhatOf(const ProgOp& op) {
  switch (op.type) {
    case PlanOpKind::kCompute: return "compute";
    case PlanOpKind::kCollective:
      return op.kind == CollectiveKind::kAllGather       ? "all_gather"
             : op.kind == CollectiveKind::kReduceScatter ? "reduce_scatter"
                                                         : "all_reduce";
    case PlanOpKind::kWait: return "wait";
    case PlanOpKind::kAlloc: return "alloc";
    case PlanOpKind::kFree: return "free";
    default: return "record";
  }
}

}  // namespace

// Declared in engine.h.
CriticalPath BuildCriticalPath(const std::vector<RankState>& ranks, const SimOptions& opt) {
  std::vector<Node> nodes;
  nodes.push_back(Node{});  // 0: the source
  // Node ids: host issues and stream entries per rank; collectives once per (stream, sequence).
  std::vector<std::vector<std::uint32_t>> host_base(ranks.size());
  std::vector<std::array<std::vector<std::uint32_t>, kNumStreams>> entry_node(ranks.size());
  // Keyed by (the rank's collective group on the stream, sequence).
  std::array<std::map<std::pair<int, std::uint32_t>, std::uint32_t>, kNumStreams> coll_node;
  for (std::size_t ri = 0; ri < ranks.size(); ++ri) {
    const RankState& r = ranks[ri];
    const SimProgram& p = *r.prog;
    host_base[ri].resize(p.commands.size());
    for (std::uint32_t c = 0; c < p.commands.size(); ++c) {
      host_base[ri][c] = static_cast<std::uint32_t>(nodes.size());
      const TimeUs dur = p.commands[c].host_cost ? opt.launch_us : 0;
      nodes.push_back(Node{r.id, -1, c, r.deps.issued[c] - dur, r.deps.issued[c], -1});
    }
    for (int s = 0; s < kNumStreams; ++s) {
      const std::size_t ss = static_cast<std::size_t>(s);
      const std::uint32_t n = r.streams[ss].completed;
      entry_node[ri][ss].resize(n);
      for (std::uint32_t e = 0; e < n; ++e) {
        const ProgOp& op = p.ops[p.stream_ops[ss][e]];
        Node node{r.id, s, e, r.deps.start[ss][e], r.deps.end[ss][e], r.deps.timeline_id[ss][e]};
        if (op.type == PlanOpKind::kCollective) {
          auto [it, fresh] = coll_node[ss].try_emplace(std::pair{r.group[ss], op.coll_seq},
                                                       static_cast<std::uint32_t>(nodes.size()));
          if (fresh) nodes.push_back(node);
          if (node.timeline_id >= 0 && nodes[it->second].timeline_id < 0) {
            nodes[it->second].timeline_id = node.timeline_id;
          }
          entry_node[ri][ss][e] = it->second;
        } else {
          entry_node[ri][ss][e] = static_cast<std::uint32_t>(nodes.size());
          nodes.push_back(node);
        }
      }
    }
  }
  const std::size_t num_nodes = nodes.size();
  Graph g(num_nodes);
  auto dur = [&](std::uint32_t v) { return nodes[v].end - nodes[v].start; };
  auto add = [&](std::uint32_t from, std::uint32_t to, DepKind kind) {
    boost::add_edge(from, to, EdgeProp{dur(to), kind}, g);
  };
  for (std::size_t ri = 0; ri < ranks.size(); ++ri) {
    const RankState& r = ranks[ri];
    const SimProgram& p = *r.prog;
    // Which command each op came from.
    std::vector<std::uint32_t> cmd_of(p.ops.size(), 0);
    for (std::uint32_t c = 0; c < p.commands.size(); ++c) {
      for (std::uint32_t i = p.commands[c].first; i < p.commands[c].end; ++i) cmd_of[i] = c;
    }
    for (std::uint32_t c = 0; c < p.commands.size(); ++c) {
      const std::uint32_t h = host_base[ri][c];
      if (c == 0) {
        add(0, h, DepKind::kStart);
      } else {
        add(host_base[ri][c - 1], h, DepKind::kHostOrder);
      }
    }
    for (std::size_t ss = 0; ss < kNumStreams; ++ss) {
      const std::vector<std::uint32_t>& en = entry_node[ri][ss];
      for (std::uint32_t e = 0; e < en.size(); ++e) {
        const std::uint32_t op_index = p.stream_ops[ss][e];
        const ProgOp& op = p.ops[op_index];
        if (e > 0) add(en[e - 1], en[e], DepKind::kStream);
        add(host_base[ri][cmd_of[op_index]], en[e], DepKind::kHostIssue);
        if (const std::int64_t w = r.deps.woken_by[ss][e]; w >= 0) {
          // A gather's allocation the memory cap held until this free made room.
          const auto ws = static_cast<std::size_t>(w >> 32);
          const auto we = static_cast<std::uint32_t>(w & 0xffffffff);
          if (we < entry_node[ri][ws].size())
            add(entry_node[ri][ws][we], en[e], DepKind::kMemoryCap);
        }
        if (op.type == PlanOpKind::kWait && op.wait_count > 0) {
          const std::vector<std::uint32_t>& wn =
              entry_node[ri][static_cast<std::size_t>(op.wait_stream)];
          if (op.wait_count - 1 < wn.size()) add(wn[op.wait_count - 1], en[e], DepKind::kEvent);
        }
      }
    }
  }

  // Longest paths from the source: DAG shortest paths with the comparison reversed.
  std::vector<double> dist(num_nodes, 0);
  std::vector<Vertex> pred(num_nodes);
  for (std::size_t v = 0; v < num_nodes; ++v) pred[v] = v;
  boost::dag_shortest_paths(g, 0,
                            boost::weight_map(boost::get(&EdgeProp::weight, g))
                                .distance_map(boost::make_iterator_property_map(
                                    dist.begin(), boost::get(boost::vertex_index, g)))
                                .predecessor_map(boost::make_iterator_property_map(
                                    pred.begin(), boost::get(boost::vertex_index, g)))
                                .distance_compare(std::greater<double>())
                                .distance_inf(-std::numeric_limits<double>::infinity())
                                .distance_zero(0.0));
  // The longest path from each node's end to the end of the run (reverse topological order).
  std::vector<Vertex> rev_topo;
  boost::topological_sort(g, std::back_inserter(rev_topo));
  std::vector<double> tail(num_nodes, 0);
  for (Vertex v : rev_topo) {
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) {
      const Vertex t = boost::target(*e, g);
      tail[v] = std::max(tail[v], g[*e].weight + tail[t]);
    }
  }

  CriticalPath cp;
  Vertex sink = 0;
  for (std::size_t v = 1; v < num_nodes; ++v) {
    if (dist[v] > dist[sink]) sink = v;
    cp.end_us = std::max(cp.end_us, nodes[v].end);
  }
  cp.length_us = dist[sink];

  auto describe = [&](std::uint32_t v, PathStep& st) {
    const Node& n = nodes[v];
    const RankState& r = ranks[static_cast<std::size_t>(
        std::find_if(ranks.begin(), ranks.end(),
                     [&](const RankState& q) { return q.id == n.rank; }) -
        ranks.begin())];
    const SimProgram& p = *r.prog;
    st.rank = n.rank;
    st.start_us = n.start;
    st.end_us = n.end;
    st.timeline_id = n.timeline_id;
    if (n.stream < 0) {
      const ProgCommand& c = p.commands[n.index];
      st.what = "host issue";
      st.unit = c.unit;
      st.step = c.origin.step;
      st.microbatch = c.origin.microbatch;
      st.event = c.origin.event;
      return;
    }
    const ProgOp& op = p.ops[p.stream_ops[static_cast<std::size_t>(n.stream)][n.index]];
    st.what = WhatOf(op);
    st.unit = op.unit;
    st.phase = op.phase;
    st.reason = op.reason;
    st.step = op.step;
    st.microbatch = op.microbatch;
    st.event = op.event;
  };

  // The chain, from the sink back to the source: at each node a dependency that ends when it
  // starts on the longest path (the predecessor map holds one; among ties, the most telling).
  std::vector<std::uint8_t> on_path(num_nodes, 0);
  for (Vertex v = sink; v != 0;) {
    Vertex u = pred[v];
    if (u == v) break;
    DepKind via = DepKind::kStart;
    int best = -1;
    const double tolerance = 1e-9 * std::max(1.0, std::abs(dist[v]));
    for (auto [e, end] = boost::in_edges(v, g); e != end; ++e) {
      const Vertex from = boost::source(*e, g);
      if (std::abs(dist[from] + g[*e].weight - dist[v]) > tolerance) continue;
      if (Priority(g[*e].kind) > best) {
        best = Priority(g[*e].kind);
        via = g[*e].kind;
        u = from;
      }
    }
    on_path[v] = 1;
    PathStep st;
    describe(static_cast<std::uint32_t>(v), st);
    st.via = via;
    // A collective reached through a rank's op: name that rank (the last to arrive).
    if (nodes[v].stream >= 0 && u != 0) st.rank = nodes[u].rank;
    cp.chain.push_back(std::move(st));
    v = u;
  }
  std::reverse(cp.chain.begin(), cp.chain.end());

  std::map<std::pair<UnitId, std::string>, PathGroup> groups;
  for (const PathStep& st : cp.chain) {
    const TimeUs d = st.end_us - st.start_us;
    if (d <= 0) continue;
    PathGroup& grp = groups[{st.what == "host issue" ? kNoUnit : st.unit, st.what}];
    grp.unit = st.what == "host issue" ? kNoUnit : st.unit;
    grp.what = st.what;
    grp.us += d;
    ++grp.ops;
  }
  for (auto& [key, grp] : groups) cp.groups.push_back(grp);
  std::stable_sort(cp.groups.begin(), cp.groups.end(),
                   [](const PathGroup& a, const PathGroup& b) { return a.us > b.us; });

  for (std::size_t ss = 0; ss < kNumStreams; ++ss) {
    for (const auto& [seq, v] : coll_node[ss]) {
      PathStep st;
      describe(v, st);
      if (st.what != "all_gather") continue;
      GatherSlack gs;
      gs.unit = st.unit;
      gs.phase = st.phase;
      gs.reason = st.reason;
      gs.step = st.step;
      gs.microbatch = st.microbatch;
      gs.event = st.event;
      gs.start_us = st.start_us;
      gs.end_us = st.end_us;
      gs.slack_us = std::max(0.0, cp.length_us - dist[v] - tail[v]);
      gs.on_path = on_path[v] != 0;
      cp.gathers.push_back(gs);
    }
  }
  std::stable_sort(
      cp.gathers.begin(), cp.gathers.end(),
      [](const GatherSlack& a, const GatherSlack& b) { return a.start_us < b.start_us; });
  return cp;
}

namespace {

TimeUs EndOf(const SimResult& r) {
  TimeUs end = 0;
  for (const TimelineOp& op : r.timeline.ops) end = std::max(end, op.end_us);
  return end;
}

std::string GatherAdvice(const PathStep& st, const Model& model, const SimOptions& base,
                         bool first_of_forward) {
  const std::string_view phase = PhaseName(st.phase);
  const std::string_view budget = st.phase == Phase::kForward ? "forward" : "backward";
  switch (st.reason) {
    case GatherReason::kFirstUnit:
      return "it is gathered at the start of the step and no compute comes before it to hide it";
    case GatherReason::kDemand:
      if (first_of_forward && !base.policy.prefetch_first_unit) {
        return "it is gathered on demand; prefetch_first_unit would issue it before the forward";
      }
      return fmt::format(
          "it is gathered on demand in {}; a larger {}_prefetch budget on the units before it "
          "(\"units\": {{\"...\": {{\"{}_prefetch\": ...}}}}) would issue it earlier",
          phase, budget, budget);
    case GatherReason::kPrefetch:
      return fmt::format(
          "it is prefetched in {} but too late or behind other gathers; a larger {}_prefetch "
          "budget on the units before it would issue it earlier",
          phase, budget);
  }
  (void)model;
  return "";
}

}  // namespace

Status ExplainCauses(CriticalPath& path, const Model& model, const SimOptions& base,
                     const std::function<StatusOr<SimResult>(const SimOptions&)>& simulate,
                     int max_gathers) {
  path.causes.clear();
  SimOptions opt = base;
  opt.critical_path = false;
  auto saving_with = [&](const SimOptions& o) -> StatusOr<TimeUs> {
    FSDP_ASSIGN_OR_RETURN(SimResult r, simulate(o));
    if (!r.status.ok()) return TimeUs{0};
    return path.end_us - EndOf(r);
  };
  // Gathers, by time on the path.
  struct OnPath {
    PathStep step;
    TimeUs us = 0;
  };
  std::vector<OnPath> gathers;
  UnitId first_forward = kNoUnit;
  for (const PathStep& st : path.chain) {
    if (st.what == "all_gather" && st.end_us > st.start_us) {
      gathers.push_back({st, st.end_us - st.start_us});
    }
  }
  for (const GatherSlack& g : path.gathers) {
    if (g.phase == Phase::kForward) {
      first_forward = g.unit;
      break;
    }
  }
  std::stable_sort(gathers.begin(), gathers.end(),
                   [](const OnPath& a, const OnPath& b) { return a.us > b.us; });
  if (gathers.size() > static_cast<std::size_t>(max_gathers)) gathers.resize(max_gathers);
  for (const OnPath& g : gathers) {
    const PathStep& st = g.step;
    Cause c;
    c.on_path_us = g.us;
    c.text =
        fmt::format("the all-gather of {} ({}, {}{}, step {}) is exposed for {:.1f} us: {}",
                    model.NameOf(st.unit), PhaseName(st.phase), GatherReasonName(st.reason),
                    st.unit == first_forward && st.phase == Phase::kForward ? ", first unit" : "",
                    st.step, g.us, GatherAdvice(st, model, base, st.unit == first_forward));
    SimOptions o = opt;
    o.zero_cost_gathers.push_back(GatherRef{st.unit, st.step, st.microbatch, st.event});
    c.whatif = fmt::format("that gather at zero cost");
    FSDP_ASSIGN_OR_RETURN(c.whatif_saving_us, saving_with(o));
    path.causes.push_back(std::move(c));
  }
  // Memory-cap waits on the path.
  UnitId cap_unit = kNoUnit;
  for (const PathStep& st : path.chain) {
    if (st.via == DepKind::kMemoryCap && cap_unit == kNoUnit) cap_unit = st.unit;
  }
  if (cap_unit != kNoUnit && base.memory_cap) {
    Cause c;
    SimOptions o = opt;
    o.memory_cap.reset();
    FSDP_ASSIGN_OR_RETURN(c.whatif_saving_us, saving_with(o));
    c.whatif = "no memory cap";
    c.on_path_us = c.whatif_saving_us;
    c.text = fmt::format(
        "the memory cap ({} bytes) held the gather of {} until a release made room for its "
        "buffer: the path runs through that release; a smaller prefetch budget before it, "
        "reshard_after_forward on the units it keeps, or a larger cap would let it start earlier",
        *base.memory_cap, model.NameOf(cap_unit));
    path.causes.push_back(std::move(c));
  }
  // Stragglers: a slow rank's compute on the path.
  for (const Straggler& s : base.stragglers) {
    if (s.factor <= 1.0) continue;
    TimeUs us = 0;
    for (const PathStep& st : path.chain) {
      if (st.what == "compute" && st.rank == s.rank) us += st.end_us - st.start_us;
    }
    if (us <= 0) continue;
    Cause c;
    c.on_path_us = us;
    SimOptions o = opt;
    o.stragglers.clear();
    FSDP_ASSIGN_OR_RETURN(c.whatif_saving_us, saving_with(o));
    c.whatif = "no straggler";
    c.text = fmt::format(
        "rank {} computes x{:g} slower and is the last to arrive at the collectives: {:.1f} us of "
        "its compute are on the path; the other ranks wait for it",
        s.rank, s.factor, us);
    path.causes.push_back(std::move(c));
  }
  std::stable_sort(path.causes.begin(), path.causes.end(), [](const Cause& a, const Cause& b) {
    return a.whatif_saving_us > b.whatif_saving_us;
  });
  return Status::Ok();
}

std::string CriticalPathToJson(const CriticalPath& path, const Model& model) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["length_us"] = path.length_us;
  j["end_us"] = path.end_us;
  Json chain = Json::array();
  for (const PathStep& st : path.chain) {
    Json o{{"what", st.what},
           {"unit", st.unit == kNoUnit ? std::string() : std::string(model.NameOf(st.unit))},
           {"rank", st.rank},
           {"step", st.step},
           {"microbatch", st.microbatch},
           {"event", st.event},
           {"start_us", st.start_us},
           {"end_us", st.end_us},
           {"via", DepKindName(st.via)}};
    if (st.what != "host issue") o["phase"] = PhaseName(st.phase);
    if (st.what == "all_gather") o["reason"] = GatherReasonName(st.reason);
    chain.push_back(std::move(o));
  }
  j["chain"] = std::move(chain);
  Json groups = Json::array();
  for (const PathGroup& grp : path.groups) {
    groups.push_back(
        Json{{"unit", grp.unit == kNoUnit ? std::string() : std::string(model.NameOf(grp.unit))},
             {"what", grp.what},
             {"us", grp.us},
             {"ops", grp.ops}});
  }
  j["groups"] = std::move(groups);
  Json gathers = Json::array();
  for (const GatherSlack& g : path.gathers) {
    gathers.push_back(Json{{"unit", std::string(model.NameOf(g.unit))},
                           {"phase", PhaseName(g.phase)},
                           {"reason", GatherReasonName(g.reason)},
                           {"step", g.step},
                           {"microbatch", g.microbatch},
                           {"start_us", g.start_us},
                           {"end_us", g.end_us},
                           {"slack_us", g.slack_us},
                           {"on_path", g.on_path}});
  }
  j["gathers"] = std::move(gathers);
  Json causes = Json::array();
  for (const Cause& c : path.causes) {
    causes.push_back(Json{{"text", c.text},
                          {"on_path_us", c.on_path_us},
                          {"whatif", c.whatif},
                          {"whatif_saving_us", c.whatif_saving_us}});
  }
  j["causes"] = std::move(causes);
  return j.dump();
}

std::string CriticalPathToText(const CriticalPath& path, const Model& model) {
  std::string out =
      fmt::format("critical path: {:.1f} us (the run ends at {:.1f} us), {} operations\n",
                  path.length_us, path.end_us, path.chain.size());
  out += "  time on the path by unit and kind:\n";
  std::size_t shown = 0;
  for (const PathGroup& grp : path.groups) {
    if (++shown > 12) {
      out += fmt::format("    ... {} more groups\n", path.groups.size() - 12);
      break;
    }
    out += fmt::format("    {:>10.1f} us  {:<15} {} ({} op{})\n", grp.us, grp.what,
                       grp.unit == kNoUnit ? std::string("-") : std::string(model.NameOf(grp.unit)),
                       grp.ops, grp.ops == 1 ? "" : "s");
  }
  std::vector<const GatherSlack*> tight;
  for (const GatherSlack& g : path.gathers) tight.push_back(&g);
  std::stable_sort(tight.begin(), tight.end(), [](const GatherSlack* a, const GatherSlack* b) {
    return a->slack_us < b->slack_us;
  });
  out += fmt::format("  gathers by slack (of {}; 0 = on the path):\n", path.gathers.size());
  for (std::size_t i = 0; i < tight.size() && i < 8; ++i) {
    const GatherSlack& g = *tight[i];
    out += fmt::format("    {:>10.1f} us  {} {} ({}, step {}){}\n", g.slack_us,
                       model.NameOf(g.unit), PhaseName(g.phase), GatherReasonName(g.reason), g.step,
                       g.on_path ? "  on the path" : "");
  }
  if (!path.causes.empty()) out += "  top causes:\n";
  for (const Cause& c : path.causes) {
    out += fmt::format("    - {}\n      what if {}: the run is {:.1f} us shorter\n", c.text,
                       c.whatif, c.whatif_saving_us);
  }
  return out;
}

}  // namespace fsdplab::sim
