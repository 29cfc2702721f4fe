// The report (`fsdplab.report` v1, DESIGN §4.3), computed from any timeline.
//
//   ReportInputs in{.model = &model, .policy = &policy, .order = &sched.order(),
//                   .cluster = {{"world_size", 8}}};   // (sim::SimulateToReport fills it all)
//   Report r = BuildReport(timeline, in);
//   std::string json = ReportToJson(r);   // --json / -o FILE
//   nlohmann::ordered_json doc = ReportJson(r);  // the same document as a value
//   std::string text = ReportToText(r);   // for people
//
// Definitions (DESIGN §4.3): a step's window runs from the end of the previous step's last work
// on any stream (first step: from its first work) to the end of its own last work; `time_us` is
// its length; `exposed_comm_us` is the time in the window where a collective is in progress on
// the rank and no compute runs; `idle_us` the time in the window where neither a compute nor a
// collective runs on the rank (the host, a stall or a launch held the step: an allocation, a
// synchronisation, a late wake-up, a collective waiting for the other ranks to join:
// `rendezvous_wait_us`, a part of it); `overlapped` counts collectives whose interval intersects
// some compute of the same rank. Multi-rank timelines report rank 0's steps and the worst peak.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/policy.h"
#include "fsdplab/core/timeline.h"

namespace fsdplab {

class JsonSink;

struct CollectiveStats final {
  int count = 0;
  Bytes bytes = 0;
  int overlapped = 0;
  TimeUs busy_us = 0;
};

// One op of the lowest-numbered rank in the timeline (computes and collectives), so that
// `fsdplab compare` can match a predicted op with its measured counterpart. Added for compare;
// serialised as "ops" in the JSON.
struct OpReport final {
  OpKind kind = OpKind::kCompute;
  UnitId unit = kNoUnit;
  Phase phase = Phase::kForward;
  GatherReason reason = GatherReason::kDemand;
  int step = 0;
  int microbatch = 0;
  int event = -1;
  TimeUs start_us = 0;
  TimeUs dur_us = 0;
  Bytes bytes = 0;
  std::string name;    // a compute's trace label (`name`), empty if none
  TimeUs wait_us = 0;  // a collective: its wait for the other ranks (TimelineOp::wait_us)
};

// A race that sets a step's memory peak (`fsdplab compare` explains a total that differs with
// them). A collective's end frees buffers (a reduce-scatter its unsharded gradients and its
// output). Had it run `margin_us` longer, they would have been alive beside later allocations,
// and so would those of the collectives queued behind it on its stream, which end that much later
// too: the step's peak would have been `peak_if_bytes`, higher by at least kPeakRaceMinFraction
// of the peak (and later still, up to `peak_at_limit_bytes`). Collectives are what a prediction
// times least surely (live ones vary from call to call), so a margin that is small beside the
// collective's duration is a peak that one slow call breaks.
//
// An early race is the other direction: a collective that frees its buffers after the peak
// began, and that, ended `margin_us` sooner, would have lowered the peak by the threshold, to
// `peak_if_bytes` (and sooner still, by up to its duration, to `peak_at_limit_bytes`); `meets` is
// then the op whose start made the peak, which it would have to precede.
//
// A collective that runs once per microbatch can hold the peak up once per microbatch: the step
// then has several high samples, each lowered only by its own call, and no single call brings the
// peak down. The calls share one predicted rate, so a prediction that times one of them long times
// them all long: an early race of the repeated collective ends all its calls (same kind and unit)
// `margin_us` sooner. `op` is then its first call that lowers a high sample, `repeats` the others,
// each with the op whose start made the highest sample before its first free (its own `meets`).
//
// A gate race raises the peak from the other side: a compute that waited for a collective (its
// gather) after its stream was free allocates (a backward's gradients) as the collective ends. Had
// the collective ended `margin_us` sooner, the allocation would have come that much sooner, beside
// buffers freed in between (the previous unit's parameters, released on the all-gather stream
// once the compute before it ended): the peak `peak_if_bytes`. `gates` is then true, `op` is the
// collective, `meets` the compute it gated, `behind` the compute before it on its stream, and the
// race is bounded by how long the compute waited: its collective can end no sooner than the
// stream was free and still make it wait (and by kMaxRaceSlowdown times its duration). `bytes`
// and `categories` are then the compute's allocations. A gate race is a late race in
// `compare`'s sense (it explains a measured total above the predicted one).
struct PeakRace final {
  struct Call final {
    OpReport op;
    std::optional<OpReport> meets;
  };
  bool early = false;                      // an early race (above); false: a late one
  OpReport op;                             // the collective (rank 0) whose end freed the buffers
  std::vector<MemoryCategory> categories;  // of the buffers it freed, largest first
  Bytes bytes = 0;                         // all of them
  int queued = 0;                 // collectives queued behind it, made late with it (late races)
  TimeUs at_us = 0;               // its first free
  TimeUs margin_us = 0;           // how much longer it would have to run (>= 0)
  Bytes peak_if_bytes = 0;        // the step's peak with it that late
  Bytes peak_at_limit_bytes = 0;  // and with it kMaxRaceSlowdown times its duration late
  // The op whose start made the allocation at that peak (a backward's gradients, a gather), when
  // one did: the collective must end before it starts for the predicted peak to hold.
  std::optional<OpReport> meets;
  std::vector<Call> repeats;  // an early race of a repeated collective: its other calls (above)
  bool gates = false;         // a gate race (above)
  std::optional<OpReport> behind;  // a gate race: the compute its `meets` queued behind
  double margin_fraction() const { return op.dur_us > 0 ? margin_us / op.dur_us : 0; }
};

// A race counts when it would raise the peak by this fraction of it (`fsdplab compare`'s default
// tolerance on the total) with its collective at most kMaxRaceSlowdown times longer than it ran;
// (or, early, ending sooner by at most its duration); a free belongs to the collective of its
// unit ending within kPeakRaceOpSlackUs of it; a step keeps the kMaxPeakRaces smallest margins
// (as fractions of their collectives) of each direction.
inline constexpr double kPeakRaceMinFraction = 0.02;
inline constexpr double kMaxRaceSlowdown = 1.0;
inline constexpr TimeUs kPeakRaceOpSlackUs = 1000;
inline constexpr std::size_t kMaxPeakRaces = 4;

// The first of several steps records the execution order and warms up (the live executor's
// buffers and threads are new): the summary leaves it out, and `fsdplab compare` holds neither
// its time nor its memory total to a tolerance (its exact memory categories still must match).
// `position`: the step's place among the report's `steps`, in order.
inline bool IsWarmupStep(std::size_t position, std::size_t steps) {
  return steps > 1 && position == 0;
}

struct StepReport final {
  int index = 0;
  TimeUs start_us = 0;
  TimeUs end_us = 0;
  TimeUs time_us = 0;
  TimeUs compute_us = 0;
  // The part of compute_us the optimizer step took (its optimizer.step() and zero_grad(): a
  // compute of phase optimizer); 0 when the trace has none.
  TimeUs optimizer_us = 0;
  TimeUs exposed_comm_us = 0;
  TimeUs idle_us = 0;  // no compute and no collective in progress on the rank
  // The part of idle_us in which a collective of the rank had been called and waited for the
  // other ranks to join (TimelineOp::wait_us): the ranks arrived apart.
  TimeUs rendezvous_wait_us = 0;
  CollectiveStats allgather;
  CollectiveStats reduce_scatter;  // no_shard's all-reduces in place of reduce-scatters too
  CollectiveStats all_reduce;      // hsdp: the replica all-reduces (their own stream)
  Bytes peak_memory_bytes = 0;
  std::array<Bytes, kNumMemoryCategories> peak_by_category{};  // at the step's peak
  // Each category's own peak within the step (they need not coincide with the total's).
  std::array<Bytes, kNumMemoryCategories> category_peaks{};
  // The caching allocator's peaks within the step (0 when the executor does not model it).
  Bytes peak_allocated_bytes = 0;
  Bytes peak_reserved_bytes = 0;
  TimeUs peak_memory_at_us = 0;  // the first moment of the step's peak
  // The races with the smallest margins (PeakRace): the late ones, smallest fraction of their
  // collective first, then the early ones likewise, at most kMaxPeakRaces of each.
  std::vector<PeakRace> peak_races;
  // The most one late collective could raise the step's peak to: the largest
  // `peak_at_limit_bytes` of every late race (gate races included), before the list above is cut
  // to the smallest margins; the peak itself when there is none.
  Bytes peak_if_late_bytes = 0;
};

struct UnitReport final {
  UnitId unit = kNoUnit;
  int gathers = 0;
  int demand = 0;
  int prefetch = 0;
  int first_unit = 0;
  Bytes gather_bytes = 0;
  TimeUs gather_us = 0;
  TimeUs exposed_us = 0;  // gather time not hidden by compute
};

struct ReportSummary final {
  TimeUs step_time_us = 0;        // mean over steps after the first (the only step if one)
  TimeUs exposed_comm_us = 0;     // mean, same steps
  TimeUs idle_us = 0;             // mean, same steps
  TimeUs rendezvous_wait_us = 0;  // mean, same steps (StepReport::rendezvous_wait_us)
  double overlap_ratio = 0;       // overlapped collectives / all collectives
  Bytes peak_memory_bytes = 0;
  // The largest StepReport::peak_if_late_bytes: what a run's peak can reach when one collective
  // of one step ends late (up to kMaxRaceSlowdown times its duration). A run of many steps has
  // many chances, so a live run's peak is held to the range between the two; how often the host
  // grids' peaks fell inside it is in bench/README.md ("host_prediction.sh --grid", memory).
  Bytes peak_if_late_bytes = 0;
  TimeUs peak_memory_at_us = 0;
  int peak_memory_rank = 0;
  std::array<Bytes, kNumMemoryCategories> peak_by_category{};
  // The caching allocator's peaks over every sample (sim/allocator_model.h; 0 when not
  // modelled): bytes in blocks handed out and bytes of segments reserved, and where the reserved
  // peak was. --memory-cap applies to the reserved bytes.
  Bytes peak_allocated_bytes = 0;
  Bytes peak_reserved_bytes = 0;
  int peak_reserved_rank = 0;
  TimeUs lower_bound_us = 0;
  TimeUs compute_us = 0;    // mean, same steps as step_time_us
  TimeUs optimizer_us = 0;  // mean, same steps: the optimizer step's part of compute_us
  int collectives = 0;
  int overlapped = 0;
  // The bytes every rank's collectives walk, summed over the ranks (CollectiveFootprintBytes;
  // 0 when the executor does not say): the working set a host bench needs.
  Bytes collective_footprint_bytes = 0;
};

struct ReportInputs final {
  const Model* model = nullptr;
  const Policy* policy = nullptr;
  const ExecutionOrder* order = nullptr;
  // What the run ran on, printed back as the report's "cluster": the simulator's cluster, or the
  // live backend and its ranks. A value, never text to parse again.
  nlohmann::ordered_json cluster = nlohmann::ordered_json::object();
  std::string cluster_text;              // one line for people ("8 ranks (1 node x 8 GPUs), ...")
  std::string source;                    // overrides timeline.source when set
  TimeUs memory_cap_lower_bound_us = 0;  // what a memory cap forces, if the executor knows
  Bytes collective_footprint_bytes = 0;  // ReportSummary::collective_footprint_bytes
  // false: no peak races are looked for (steps' peak_races stay empty and peak_if_late_bytes is
  // the peak), for a search that holds a cap to the simulated peak and reports the races of
  // its result alone.
  bool peak_races = true;
};

struct Report final {
  std::string source;
  bool measured = false;  // live runs
  std::string policy_json;
  nlohmann::ordered_json cluster = nlohmann::ordered_json::object();
  std::string cluster_text;
  std::string policy_text;  // "order=registration forward_prefetch=1 ..."
  std::string order_json;
  std::string order_text;
  std::vector<StepReport> steps;
  std::vector<UnitReport> units;
  std::vector<OpReport> ops;
  ReportSummary summary;
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  std::vector<std::string> notes;
  std::vector<std::string> unit_names;  // for the text form
  // A JSON object printed as "critical_path" when set (simulate --explain; the simulator's).
  std::string critical_path_json;
  // The step-time distribution of a run whose ranks' speeds change from step to step: a JSON
  // object printed as "variability", and its text lines (the simulator's, sim/variability.h).
  std::string variability_json;
  std::string variability_text;
  // What a report page draws of the timeline (timeline_view.h), printed as "timeline" when set:
  // the commands' --html put it in.
  nlohmann::ordered_json timeline;
};

Report BuildReport(const Timeline& timeline, const ReportInputs& inputs);
// The fsdplab.report document as a value (what the Python API hands back as a dict), and as the
// text `--json` writes: that value indented by 2.
nlohmann::ordered_json ReportJson(const Report& report);
// That document as calls to a sink (json_sink.h): ReportJson's value, or the Python API's dict
// made without it.
void EmitReport(const Report& report, JsonSink& sink);
std::string ReportToJson(const Report& report);
std::string ReportToText(const Report& report);

}  // namespace fsdplab
