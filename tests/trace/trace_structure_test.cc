#include "fsdplab/trace/trace_structure.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

// One step, one microbatch over units a (root) and b (child of a). Events are numbered from 0 in
// the order given; the expected positions in the tests below are counted by hand from them.
std::string WithEvents(std::string_view events) {
  return std::string(R"({"format": "fsdplab.trace", "version": 1,
  "meta": {"source": "hand", "world_size": 2, "rank": 0},
  "units": [{"name": "a", "parent": null, "params": [{"name": "w", "dtype": "bf16", "numel": 8}]},
            {"name": "b", "parent": "a", "params": [{"name": "w", "dtype": "bf16", "numel": 8}]}],
  "steps": [{"microbatches": [{"events": [)") +
         std::string(events) + "]}]}]}";
}

// The forward of a and b: events 0-5.
constexpr std::string_view kForward = R"(
  {"op": "pre_forward", "unit": "a"},
  {"op": "pre_forward", "unit": "b"},
  {"op": "compute", "unit": "b", "phase": "forward", "us": 10},
  {"op": "post_forward", "unit": "b"},
  {"op": "compute", "unit": "a", "phase": "forward", "us": 1},
  {"op": "post_forward", "unit": "a"},)";

// The structural problems of a trace whose fields are valid (as `fsdplab validate` runs them).
std::vector<std::string> Problems(std::string_view events) {
  StatusOr<Trace> t = ParseTrace(WithEvents(events));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return {t.status().message()};
  std::vector<std::string> out;
  for (const Status& s : CheckTraceStructure(*t)) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
    out.push_back(s.message());
  }
  return out;
}

std::string Cat(std::string_view a, std::string_view b) { return std::string(a) + std::string(b); }

TEST(TraceStructure, EveryRecomputeKindAndASharedBackwardAreValid) {
  // Events 6-: a reentrant recomputation of b before its backward, an inside recomputation of b
  // (a recompute compute while b is in BACKWARD), a repeated pre_backward of b (one backward).
  const std::string events = Cat(kForward, R"(
    {"op": "pre_backward", "unit": "a"},
    {"op": "pre_forward", "unit": "b"},
    {"op": "compute", "unit": "b", "phase": "recompute", "us": 10},
    {"op": "post_forward", "unit": "b"},
    {"op": "pre_backward", "unit": "b"},
    {"op": "compute", "unit": "b", "phase": "recompute", "us": 3},
    {"op": "compute", "unit": "b", "phase": "backward", "us": 20},
    {"op": "pre_backward", "unit": "b"},
    {"op": "compute", "unit": "b", "phase": "backward", "us": 20},
    {"op": "post_backward", "unit": "b"},
    {"op": "collective", "kind": "reduce_scatter", "unit": "b", "bytes": 16, "start_us": 0,
     "end_us": 1},
    {"op": "compute", "unit": "a", "phase": "backward", "us": 2},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})");
  EXPECT_EQ(Problems(events), std::vector<std::string>{});
}

TEST(TraceStructure, RecomputationStoppedEarlyIsNamedAtTheNextBackwardEvent) {
  // What torch 2.x's early-stopping checkpoint left before the recorder closed it (a reentrant
  // checkpoint's order): b's recomputation (pre_forward at 7) never ends and b's pre_backward (8)
  // comes during it. That one problem is reported; from there b is in BACKWARD as the scheduler
  // would have it, so its backward (9, 10) and backward_end (13) are in order.
  const std::string events = Cat(kForward, R"(
    {"op": "pre_backward", "unit": "a"},
    {"op": "pre_forward", "unit": "b"},
    {"op": "pre_backward", "unit": "b"},
    {"op": "compute", "unit": "b", "phase": "backward", "us": 20},
    {"op": "post_backward", "unit": "b"},
    {"op": "compute", "unit": "a", "phase": "backward", "us": 2},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})");
  const std::vector<std::string> expected = {
      "steps[0].microbatches[0].events[8]: pre_backward of 'b' during its recomputation: the "
      "pre_forward at events[7] has no post_forward (a recomputation stopped early and not "
      "closed?)",
  };
  EXPECT_EQ(Problems(events), expected);
}

TEST(TraceStructure, RecomputationOpenAtPostBackwardAndBackwardEnd) {
  // pre_backward of b first (7), then its recomputation opens (8) and is never closed: the
  // backward compute (9) and post_backward (10) come during it.
  const std::string events = Cat(kForward, R"(
    {"op": "pre_backward", "unit": "a"},
    {"op": "pre_backward", "unit": "b"},
    {"op": "pre_forward", "unit": "b"},
    {"op": "compute", "unit": "b", "phase": "backward", "us": 20},
    {"op": "post_backward", "unit": "b"},
    {"op": "pre_forward", "unit": "a"},
    {"op": "compute", "unit": "a", "phase": "backward", "us": 2},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})");
  EXPECT_EQ(Problems(events),
            (std::vector<std::string>{
                "steps[0].microbatches[0].events[9]: backward compute of 'b' outside its "
                "pre_backward / post_backward (its recomputation is open)",
                "steps[0].microbatches[0].events[10]: post_backward of 'b' during its "
                "recomputation: the pre_forward at events[8] has no post_forward (a "
                "recomputation stopped early and not closed?)",
                // a's recomputation (11) is open at its own backward compute and post_backward.
                "steps[0].microbatches[0].events[12]: backward compute of 'a' outside its "
                "pre_backward / post_backward (its recomputation is open)",
                "steps[0].microbatches[0].events[13]: post_backward of 'a' during its "
                "recomputation: the pre_forward at events[11] has no post_forward (a "
                "recomputation stopped early and not closed?)",
            }));
}

TEST(TraceStructure, ForwardLeftOpenWhenTheBackwardBegins) {
  // b's pre_forward (1) has no post_forward; the backward begins at 4.
  const std::string events = R"(
    {"op": "pre_forward", "unit": "a"},
    {"op": "pre_forward", "unit": "b"},
    {"op": "compute", "unit": "b", "phase": "forward", "us": 10},
    {"op": "post_forward", "unit": "a"},
    {"op": "pre_backward", "unit": "a"},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})";
  EXPECT_EQ(Problems(events),
            (std::vector<std::string>{
                "steps[0].microbatches[0].events[4]: the backward begins (pre_backward of 'a') "
                "while the pre_forward of 'b' at events[1] has no post_forward",
            }));
}

TEST(TraceStructure, OpenAtBackwardEndAndAtTheEndOfTheMicrobatch) {
  // b's pre_backward (7) has no post_backward by backward_end (10). After it, a's pre_forward
  // (11) opens a forward of the next pass that the microbatch never closes (last event: 11).
  const std::string events = Cat(kForward, R"(
    {"op": "pre_backward", "unit": "a"},
    {"op": "pre_backward", "unit": "b"},
    {"op": "compute", "unit": "a", "phase": "backward", "us": 2},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"},
    {"op": "pre_forward", "unit": "a"})");
  EXPECT_EQ(Problems(events),
            (std::vector<std::string>{
                "steps[0].microbatches[0].events[10]: the pre_backward of 'b' at events[7] has "
                "no post_backward before backward_end",
                "steps[0].microbatches[0].events[11]: the pre_forward of 'a' at events[11] has "
                "no post_forward before the end of the microbatch",
            }));
}

TEST(TraceStructure, ComputesOutsideTheirPhase) {
  // 0: b's forward compute before its pre_forward. 6: an inside recompute of b before the
  // backward. 8: b's backward compute before its pre_backward. 11: an inside recompute of b
  // after its post_backward (b is RESTING: nothing says its planes are there).
  const std::string events = R"(
    {"op": "compute", "unit": "b", "phase": "forward", "us": 1},
    {"op": "pre_forward", "unit": "a"},
    {"op": "pre_forward", "unit": "b"},
    {"op": "post_forward", "unit": "b"},
    {"op": "compute", "unit": null, "phase": "forward", "us": 1},
    {"op": "post_forward", "unit": "a"},
    {"op": "compute", "unit": "b", "phase": "recompute", "us": 1},
    {"op": "pre_backward", "unit": "a"},
    {"op": "compute", "unit": "b", "phase": "backward", "us": 1},
    {"op": "pre_backward", "unit": "b"},
    {"op": "post_backward", "unit": "b"},
    {"op": "compute", "unit": "b", "phase": "recompute", "us": 1},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})";
  EXPECT_EQ(Problems(events),
            (std::vector<std::string>{
                "steps[0].microbatches[0].events[0]: forward compute of 'b' outside its "
                "pre_forward / post_forward",
                "steps[0].microbatches[0].events[6]: recompute compute of 'b' neither inside a "
                "recomputation (pre_forward during the backward) nor while the unit is in "
                "BACKWARD (an inside recomputation); the backward has not begun",
                "steps[0].microbatches[0].events[8]: backward compute of 'b' outside its "
                "pre_backward / post_backward",
                "steps[0].microbatches[0].events[11]: recompute compute of 'b' neither inside a "
                "recomputation (pre_forward during the backward) nor while the unit is in "
                "BACKWARD (an inside recomputation)",
            }));
}

TEST(TraceStructure, UnitEnteredAgainWhileOpen) {
  // b entered at 1 and again at 2 before its post_forward (3); the second post_forward (4)
  // then has nothing open.
  const std::string events = R"(
    {"op": "pre_forward", "unit": "a"},
    {"op": "pre_forward", "unit": "b"},
    {"op": "pre_forward", "unit": "b"},
    {"op": "post_forward", "unit": "b"},
    {"op": "post_forward", "unit": "b"},
    {"op": "post_forward", "unit": "a"},
    {"op": "pre_backward", "unit": "a"},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})";
  EXPECT_EQ(Problems(events),
            (std::vector<std::string>{
                "steps[0].microbatches[0].events[2]: pre_forward of 'b' while its pre_forward "
                "(at events[1]) is still open",
                "steps[0].microbatches[0].events[4]: post_forward of 'b' without an open "
                "pre_forward",
            }));
}

// The backward of a alone after kForward: events 6-8.
constexpr std::string_view kBackward = R"(
    {"op": "pre_backward", "unit": "a"},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})";
constexpr std::string_view kOptimizer =
    R"({"op": "compute", "unit": null, "phase": "optimizer", "us": 5})";

TEST(TraceStructure, OptimizerStepAfterTheLastBackwardEndIsValid) {
  EXPECT_EQ(Problems(Cat(Cat(kForward, kBackward), Cat(",", kOptimizer))),
            std::vector<std::string>{});
}

TEST(TraceStructure, OptimizerStepInsideAPassOrTwiceOrFollowedByAPassIsRefused) {
  // Event 6 is the optimizer compute, inside the pass (its backward_end comes at 9).
  EXPECT_EQ(Problems(Cat(Cat(kForward, kOptimizer), Cat(",", kBackward))),
            std::vector<std::string>{
                "steps[0].microbatches[0].events[6]: the optimizer compute comes after the "
                "backward_end of the step's last microbatch (a pass is open here)"});
  // Events 9 and 10: two optimizer computes; the second is named with the first's position.
  EXPECT_EQ(
      Problems(Cat(Cat(kForward, kBackward), Cat(Cat(",", kOptimizer), Cat(",", kOptimizer)))),
      std::vector<std::string>{
          "steps[0].microbatches[0].events[10]: a second optimizer compute in the step (the "
          "first at steps[0].microbatches[0].events[9])"});
  // Event 9 the optimizer, then a pre_forward (10) and its post_forward (11) of a new pass.
  EXPECT_EQ(Problems(Cat(Cat(kForward, kBackward),
                         Cat(Cat(",", kOptimizer), R"(, {"op": "pre_forward", "unit": "a"},
                             {"op": "post_forward", "unit": "a"})"))),
            (std::vector<std::string>{
                "steps[0].microbatches[0].events[10]: pre_forward after the optimizer step (at "
                "events[9]): the optimizer compute ends its step",
                "steps[0].microbatches[0].events[11]: post_forward after the optimizer step (at "
                "events[9]): the optimizer compute ends its step"}));
}

TEST(TraceStructure, OptimizerStepBeforeTheStepsLastMicrobatchIsRefused) {
  // Two microbatches; the first ends with the optimizer compute (its event 9).
  const std::string mb = Cat(kForward, kBackward);
  StatusOr<Trace> t = ParseTrace(WithEvents(Cat(mb, Cat(",", kOptimizer))));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  t->steps[0].microbatches.push_back(t->steps[0].microbatches[0]);
  t->steps[0].microbatches[1].events.pop_back();
  std::vector<Status> p = CheckTraceStructure(*t);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].message(),
            "steps[0].microbatches[0].events[9]: the optimizer compute comes after the "
            "backward_end of the step's last microbatch (this is not the step's last "
            "microbatch)");
}

TEST(TraceStructure, ChecksABuiltTraceDirectly) {
  StatusOr<Trace> t = ParseTrace(WithEvents(Cat(kForward, R"(
    {"op": "pre_backward", "unit": "a"},
    {"op": "post_backward", "unit": "a"},
    {"op": "backward_end"})")));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(CheckTraceStructure(*t).empty());
  // Drop b's post_forward (event 3): b's forward is open when the backward begins (now event 5).
  std::vector<Event>& ev = t->steps[0].microbatches[0].events;
  ev.erase(ev.begin() + 3);
  std::vector<Status> p = CheckTraceStructure(*t);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].message(),
            "steps[0].microbatches[0].events[5]: the backward begins (pre_backward of 'a') while "
            "the pre_forward of 'b' at events[1] has no post_forward");
}

}  // namespace
}  // namespace fsdplab
