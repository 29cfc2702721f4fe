// A discrete-event engine: a queue of typed events ordered by (time, sequence number), so events
// at equal times run in the order they were scheduled. No global state: every simulation owns
// its queue.
//
//   struct Tick { int id; };
//   struct Done { int id; };
//   EventQueue<std::variant<Tick, Done>> q;
//   q.Push(5.0, Tick{1});
//   q.Run([&](TimeUs now, const std::variant<Tick, Done>& ev) {
//     std::visit(Overloaded{[&](const Tick& t) { q.Push(now + 1, Done{t.id}); },
//                           [&](const Done&) {}}, ev);
//   });
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "fsdplab/core/units.h"

namespace fsdplab::sim {

// Builds a visitor from lambdas (for std::visit over an event variant).
template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

template <typename Payload>
class EventQueue final {
 public:
  void Push(TimeUs t, Payload payload) {
    heap_.push_back(Entry{t, seq_++, std::move(payload)});
    std::push_heap(heap_.begin(), heap_.end(), Later{});
  }
  bool empty() const { return heap_.empty(); }
  std::size_t size() const { return heap_.size(); }
  TimeUs next_time() const { return heap_.front().t; }
  // Events pushed so far and events handed to a handler so far.
  std::uint64_t pushed() const { return seq_; }
  std::uint64_t processed() const { return processed_; }
  void Clear() { heap_.clear(); }

  // Removes the earliest event; `now` receives its time.
  Payload Pop(TimeUs& now) {
    std::pop_heap(heap_.begin(), heap_.end(), Later{});
    Entry e = std::move(heap_.back());
    heap_.pop_back();
    now = e.t;
    ++processed_;
    return std::move(e.payload);
  }

  // Hands every event to `handler(now, payload)` in (time, sequence) order until the queue is
  // empty or the handler returns false (when it returns bool).
  template <typename Handler>
  void Run(Handler&& handler) {
    while (!heap_.empty()) {
      TimeUs now = 0;
      Payload p = Pop(now);
      if constexpr (std::is_same_v<decltype(handler(now, p)), bool>) {
        if (!handler(now, p)) return;
      } else {
        handler(now, p);
      }
    }
  }

 private:
  struct Entry {
    TimeUs t;
    std::uint64_t seq;
    Payload payload;
  };
  // Max-heap comparator that puts the earliest (time, seq) on top.
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  std::vector<Entry> heap_;
  std::uint64_t seq_ = 0;
  std::uint64_t processed_ = 0;
};

}  // namespace fsdplab::sim
