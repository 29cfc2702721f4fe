// The end of a simulation: a gather still held by the memory cap is out of memory; ranks that
// stopped with work left are deadlocked, explained through a wait-for graph between ranks.
#include <fmt/format.h>

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/depth_first_search.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine.h"

namespace fsdplab::sim {
namespace {

std::size_t Idx(int i) { return static_cast<std::size_t>(i); }

}  // namespace

void Engine::CheckQuiescent() {
  for (const RankState& r : ranks_) {
    for (int s = 0; s < kNumStreams; ++s) {
      const StreamState& st = r.streams[Idx(s)];
      if (!st.memory_wait) continue;
      const ProgOp& op = OpAt(r, s, st.completed);
      const Bytes held = opt_.allocator_model ? r.allocator.allocator().reserved() : r.total();
      Fail(StepFailed(fmt::format(
          "out of memory at step {} (microbatch {}) on rank {}: the all-gather of {} needs {} "
          "bytes, {} of the cap of {} bytes are {} and nothing in flight frees memory",
          op.step, op.microbatch, r.id, UnitName(r, op.unit), op.bytes, held, *opt_.memory_cap,
          opt_.allocator_model ? "reserved by the caching allocator" : "in use")));
      return;
    }
  }
  bool all_done = true;
  for (const RankState& r : ranks_) all_done = all_done && r.finished();
  if (all_done) return;
  Fail(DeadlockError(DescribeDeadlock()));
}

// What rank r waits in: the collective at the head of one of its streams.
Engine::Waiting Engine::WaitingIn(const RankState& r) const {
  for (int s = 0; s < kNumStreams; ++s) {
    const StreamState& st = r.streams[Idx(s)];
    if (st.arrived) return {s, &OpAt(r, s, st.completed)};
  }
  return {};
}

std::string Engine::DescribeOp(const RankState& r, const ProgOp& op) const {
  std::string_view kind = op.kind == CollectiveKind::kAllGather   ? "all_gather"
                          : op.kind == CollectiveKind::kAllReduce ? "all_reduce"
                                                                  : "reduce_scatter";
  return fmt::format("{} of {} (step {}, microbatch {})", kind, UnitName(r, op.unit), op.step,
                     op.microbatch);
}

// Rank r waits in `w`; why rank q holds it up.
std::string Engine::EdgeText(const RankState& r, const Waiting& w, const RankState& q) const {
  std::string text =
      fmt::format("rank {} waits in {} which rank {} ", r.id, DescribeOp(r, *w.op), q.id);
  const std::vector<std::uint32_t>& colls = q.prog->collectives[Idx(w.stream)];
  if (w.op->coll_seq >= colls.size()) {
    return text + fmt::format(
                      "never issues (its program has only {} collectives on that "
                      "stream)",
                      colls.size());
  }
  const ProgOp& theirs = q.prog->ops[colls[w.op->coll_seq]];
  if (theirs.unit != w.op->unit || theirs.kind != w.op->kind) {
    return text + "never issues";
  }
  if (theirs.bytes != w.op->bytes) {
    return text + fmt::format("issues with {} bytes instead of {}", theirs.bytes, w.op->bytes);
  }
  return text + "has not reached";
}

// Does q hold r up at the collective r waits in?
bool Engine::Blocks(const RankState& r, const Waiting& w, const RankState& q) const {
  if (q.group[Idx(w.stream)] != r.group[Idx(w.stream)]) return false;  // another group's
  const StreamState& qs = q.streams[Idx(w.stream)];
  if (!qs.arrived || qs.coll_done != r.streams[Idx(w.stream)].coll_done) return true;
  const ProgOp& qop = OpAt(q, w.stream, qs.completed);
  return qop.unit != w.op->unit || qop.bytes != w.op->bytes || qop.kind != w.op->kind;
}

// The wait-for graph between ranks (an edge r -> q: rank r waits in a collective that rank q
// has not joined), then a cycle in it, or the chain to a rank that waits on nobody.
std::string Engine::DescribeDeadlock() const {
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
  std::size_t n = ranks_.size();
  Graph g(n);
  std::vector<Waiting> waiting(n);
  std::vector<int> first_edge_to(n, -1);
  for (const RankState& r : ranks_) {
    Waiting w = WaitingIn(r);
    waiting[Idx(r.rank)] = w;
    if (!w.op) continue;
    for (const RankState& q : ranks_) {
      if (q.rank == r.rank || !Blocks(r, w, q)) continue;
      boost::add_edge(Idx(r.rank), Idx(q.rank), g);
      if (first_edge_to[Idx(r.rank)] < 0) first_edge_to[Idx(r.rank)] = q.rank;
    }
  }
  struct CycleFinder : boost::default_dfs_visitor {
    std::vector<std::size_t>* parent = nullptr;
    std::optional<std::pair<std::size_t, std::size_t>>* back = nullptr;
    void tree_edge(Graph::edge_descriptor e, const Graph& gr) const {
      (*parent)[boost::target(e, gr)] = boost::source(e, gr);
    }
    void back_edge(Graph::edge_descriptor e, const Graph& gr) const {
      if (!back->has_value()) *back = std::make_pair(boost::source(e, gr), boost::target(e, gr));
    }
  };
  std::vector<std::size_t> parent(n, n);
  std::optional<std::pair<std::size_t, std::size_t>> back;
  CycleFinder vis;
  vis.parent = &parent;
  vis.back = &back;
  boost::depth_first_search(g, boost::visitor(vis));
  std::vector<std::size_t> chain;
  bool cycle = false;
  if (back) {
    // A back edge u -> v: v is an ancestor of u, so v -> ... -> u -> v is a cycle.
    for (std::size_t x = back->first; x != back->second && x < n; x = parent[x]) {
      chain.push_back(x);
    }
    chain.push_back(back->second);
    std::reverse(chain.begin(), chain.end());
    cycle = true;
  } else {
    std::vector<std::uint8_t> seen(n, 0);
    std::size_t x = n;
    for (std::size_t i = 0; i < n; ++i) {
      if (first_edge_to[i] >= 0) {
        x = i;
        break;
      }
    }
    while (x < n && !seen[x]) {
      seen[x] = 1;
      chain.push_back(x);
      if (first_edge_to[x] < 0) break;
      x = Idx(first_edge_to[x]);
    }
  }
  std::vector<std::string> parts;
  constexpr std::size_t kMaxParts = 8;
  for (std::size_t i = 0; i < chain.size() && parts.size() < kMaxParts; ++i) {
    std::size_t x = chain[i];
    const RankState& r = ranks_[x];
    std::size_t next = i + 1 < chain.size() ? chain[i + 1] : (cycle ? chain[0] : n);
    if (waiting[x].op && next < n) {
      parts.push_back(EdgeText(r, waiting[x], ranks_[next]));
    } else if (waiting[x].op) {
      parts.push_back(fmt::format("rank {} waits in {}", r.id, DescribeOp(r, *waiting[x].op)));
    } else {
      parts.push_back(
          fmt::format("rank {} {}", r.id,
                      r.finished() ? "has finished its program" : "is stopped with work left"));
    }
  }
  if (chain.size() > kMaxParts) {
    parts.push_back(fmt::format("... and {} more ranks", chain.size() - kMaxParts));
  }
  if (parts.empty()) return "deadlock: ranks stopped with work left and nothing in flight";
  return fmt::format("deadlock: {}", fmt::join(parts, "; "));
}

}  // namespace fsdplab::sim
