// The Kineto import on hand-made minimal profiles, one per rule (kineto.h), bad files, and the
// command line end to end (the built binary).
#include "fsdplab/kineto/kineto.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"

namespace fsdplab::kineto {
namespace {

namespace fs = std::filesystem;

// One complete event: {"ph": "X", "cat": ..., "name": ..., "pid": 1, "tid": tid, ...}.
std::string X(std::string_view cat, std::string_view name, int tid, double ts, double dur,
              std::string_view args = "") {
  std::string e = fmt::format(
      R"({{"ph": "X", "cat": "{}", "name": "{}", "pid": 1, "tid": {}, "ts": {}, "dur": {})", cat,
      name, tid, ts, dur);
  if (!args.empty()) e += fmt::format(R"(, "args": {})", args);
  return e + "}";
}
std::string Op(std::string_view name, double ts, double dur, int tid = 1,
               std::string_view args = "") {
  return X("cpu_op", name, tid, ts, dur, args);
}
std::string Ann(std::string_view name, double ts, double dur, int tid = 1) {
  return X("user_annotation", name, tid, ts, dur);
}

std::string ProfileText(const std::vector<std::string>& events, int rank = 0, int world = 2) {
  std::string out = fmt::format(
      R"({{"schemaVersion": 1, "distributedInfo": {{"backend": "gloo", "rank": {}, "world_size": {}}},
  "record_shapes": 1, "traceEvents": [
  {{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {{"name": "main"}}}})",
      rank, world);
  for (const std::string& e : events) out += ",\n  " + e;
  return out + "\n], \"traceName\": \"t\"}";
}

StatusOr<Imported> Import(const std::string& text, ImportOptions options = {}) {
  StatusOr<Profile> p = ParseProfile(text, "test.json");
  if (!p.ok()) return p.status();
  return ImportProfile(*p, options);
}

// The events of step s, microbatch 0, as "op unit phase us" lines (collectives: kind bytes).
std::vector<std::string> Lines(const Trace& t, std::size_t s = 0) {
  std::vector<std::string> out;
  for (const Event& e : t.steps.at(s).microbatches.at(0).events) {
    std::string unit(e.unit == kNoUnit ? "-" : t.model.NameOf(e.unit));
    switch (e.op) {
      case fsdplab::Op::kCompute:
        out.push_back(fmt::format("compute {} {} {:g}{}", unit, PhaseName(e.phase), e.us,
                                  e.name.empty() ? "" : " " + e.name));
        break;
      case fsdplab::Op::kCollective:
        out.push_back(fmt::format(
            "{} {} {} {:g}-{:g}{}", CollectiveKindName(e.kind), unit, e.bytes, e.start_us, e.end_us,
            e.copy_out_us ? fmt::format(" copy-out {:g}", *e.copy_out_us) : ""));
        break;
      default: out.push_back(fmt::format("{} {}", OpName(e.op), unit));
    }
  }
  return out;
}

// FSDP's copy-in of two fp32 shards (6 and 2 elements), the all-gather of those 8 elements into
// 16 and the reduce-scatter of 16 into 8, on thread 1, as the profiler records them.
std::string CopyIn(double ts) {
  return Op(
      "fsdp::all_gather_copy_in", ts, 1, 1,
      R"({"Input Dims": [[[3], [1]], [8], [], [], []], "Input type": ["TensorList", "float", "ScalarList", "Scalar", "Scalar"], "Concrete Inputs": ["", "", "[6, 2]", "8", "0"]})");
}
std::string AllGather(double ts, double dur) {
  return Op(
      "c10d::_allgather_base_", ts, dur, 1,
      R"({"Input Dims": [[16], [8], [], [], []], "Input type": ["float", "float", "", "Scalar", "Scalar"]})");
}
std::string ReduceScatter(double ts, double dur) {
  return Op(
      "c10d::_reduce_scatter_base_", ts, dur, 1,
      R"({"Input Dims": [[8], [16], [], [], []], "Input type": ["float", "float", "", "", "Scalar"]})");
}

// One root unit on the CPU (gloo): hooks, an all-gather whose copy-in gives two parameters,
// forward, loss, backward, the reduce-scatter in FSDP's final callback and the optimizer.
std::vector<std::string> OneUnitEvents(int step = 5) {
  return {
      Ann(fmt::format("ProfilerStep#{}", step), 0, 1000),
      Ann("FSDP::pre_forward", 10, 10),
      Ann("FSDP::all_gather", 11, 8),
      CopyIn(12),
      AllGather(14, 4),
      Op("aten::linear", 30, 50),
      Ann("FSDP::post_forward", 100, 5),
      Op("aten::sum", 110, 10),
      Ann("FSDP::pre_backward", 200, 10),
      Op("autograd::engine::evaluate_function: AddmmBackward0", 220, 80),
      Ann("FSDP::root_post_backward_callback", 400, 50),
      Ann("FSDP::post_backward_reshard", 405, 5),
      Ann("FSDP::post_backward_reduce", 410, 30),
      ReduceScatter(415, 20),
      Op("aten::add_", 500, 30),
  };
}

TEST(KinetoImport, OneUnitHooksComputeCollectivesAndParams) {
  StatusOr<Imported> im = Import(ProfileText(OneUnitEvents()));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  const Trace& t = im->trace;
  ASSERT_EQ(t.model.num_units(), 1);
  EXPECT_EQ(t.model.unit(0).name(), "model");
  EXPECT_EQ(t.meta.world_size, 2);
  // Shards of 6 and 2 fp32 elements on each of 2 ranks: parameters of 12 and 4 elements.
  ASSERT_EQ(t.model.unit(0).params().size(), 2u);
  EXPECT_EQ(t.model.unit(0).params()[0].Numel(), 12u);
  EXPECT_EQ(t.model.unit(0).params()[1].Numel(), 4u);
  EXPECT_EQ(t.model.unit(0).params()[0].dtype, DType::kFp32);
  // By hand: the 30 us after backward_end are the optimizer compute, after it; a unit's
  // compute is the thread's time from its hook to the end of its last operator before FSDP's
  // post hook (the rest is FSDP's hook), less FSDP's ranges: the forward from pre_forward (10)
  // to aten::linear's end (80) less FSDP::pre_forward [10, 20] (the copy-in and the c10d
  // operator inside it) = 60 (aten::linear's 50 and the framework's 10 before it); the loss
  // (10 us) runs outside every unit (its operators' time); the backward from pre_backward (200)
  // to its backward function's end (300) less [200, 210] = 90.
  // No gloo worker range: a collective ends where FSDP's wait for it ends, the thread's next
  // operator or the end of FSDP's range that issued it. On the CPU a collective's span is FSDP's
  // call that runs it, as the recorder brackets it (its copy-in included). Gather: output [16]
  // fp32 = 64 bytes over FSDP::all_gather [11, 19] (its operator alone: 14-18, and no operator
  // after it inside the range); reduce-scatter: input [16] fp32 = 64 bytes over
  // FSDP::post_backward_reduce [410, 440] (its operator: 415-435). FSDP's own work, its ranges
  // less the collectives, is a unit-less compute "fsdp" at the next hook: [10, 11] + [19, 20] =
  // 2 in the forward, its post_forward hook from the unit's last operator [80, 105] = 25,
  // pre_backward's [200, 210] = 10, and from the backward function's end the post-backward hook
  // and the callback [300, 450] less the reduce-scatter's [410, 440] = 120.
  EXPECT_EQ(Lines(t), (std::vector<std::string>{
                          "pre_forward model",
                          "all_gather model 64 11-19",
                          "compute - forward 2 fsdp",
                          "compute model forward 60",
                          "post_forward model",
                          "compute - forward 25 fsdp",
                          "compute - forward 10 other",
                          "pre_backward model",
                          "compute - backward 10 fsdp",
                          "compute model backward 90",
                          "post_backward model",
                          "reduce_scatter model 64 410-440",
                          "compute - backward 120 fsdp",
                          "backward_end -",
                          "compute - optimizer 30 optimizer",
                      }));
  // distributedInfo says gloo and no GPU kernel ran: a CPU run, as a recorder would write it.
  const nlohmann::json extra = nlohmann::json::parse(t.meta.extra_json);
  EXPECT_EQ(extra.at("device"), "cpu");
  EXPECT_EQ(extra.at("backend"), "gloo");
  // Measured: 1000 us step; compute 50 + 10 + 80 + 30 = 170; the collectives (8 + 30 us)
  // overlap no compute.
  ASSERT_EQ(im->steps.size(), 1u);
  EXPECT_EQ(im->steps[0].profiler_step, 5);
  EXPECT_DOUBLE_EQ(im->steps[0].time_us, 1000);
  EXPECT_DOUBLE_EQ(im->steps[0].compute_us, 170);
  EXPECT_DOUBLE_EQ(im->steps[0].exposed_comm_us, 38);
  // What the profiler recorded on the computing thread in the step: 7 operators (copy-in, the
  // two c10d operators, linear, sum, the backward function, add_), no memory event; with
  // record_shapes 7 x 2.3 us.
  EXPECT_EQ(im->steps[0].operators, 7);
  EXPECT_EQ(im->steps[0].memory_events, 0);
  EXPECT_TRUE(im->record_shapes);
  EXPECT_DOUBLE_EQ(ProfilerCostUs(im->steps[0], im->record_shapes), 7 * 2.3);
  EXPECT_TRUE(CheckTraceStructure(t).empty());
  EXPECT_TRUE(CheckTraceEvents(t).empty());
}

// How the run was sharded, from what FSDP2 gathered: OneUnitEvents' unit is all-gathered in its
// forward (11-19) and not again in its backward, so it kept its parameters after forward
// (reshard_after_forward false, FSDP2's default for a root); with a second all-gather inside its
// pre_backward (201-209) it resharded after forward (true).
TEST(KinetoImport, ShardingAfterForwardFromTheBackwardsAllGathers) {
  StatusOr<Imported> kept = Import(ProfileText(OneUnitEvents()));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  nlohmann::json extra = nlohmann::json::parse(kept->trace.meta.extra_json);
  EXPECT_EQ(extra.at("recorded_policy"),
            nlohmann::json::parse(R"({"units": {"model": {"reshard_after_forward": false}}})"));

  std::vector<std::string> ev = OneUnitEvents();
  ev.push_back(Ann("FSDP::all_gather", 201, 8));
  ev.push_back(CopyIn(202));
  ev.push_back(AllGather(204, 4));
  StatusOr<Imported> resharded = Import(ProfileText(ev));
  ASSERT_TRUE(resharded.ok()) << resharded.status().ToString();
  const std::vector<std::string> lines = Lines(resharded->trace);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "all_gather model 64 201-209"), 1);
  extra = nlohmann::json::parse(resharded->trace.meta.extra_json);
  EXPECT_EQ(extra.at("recorded_policy"),
            nlohmann::json::parse(R"({"units": {"model": {"reshard_after_forward": true}}})"));
  EXPECT_TRUE(CheckTraceStructure(resharded->trace).empty());
}

// An allocation (bytes > 0) or free (bytes < 0) of the host's memory (profile_memory=True).
std::string Mem(double ts, long long bytes, long long addr = 0, int tid = 1) {
  return fmt::format(
      R"({{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": {}, "ts": {}, "s": "t", "args": {{"Device Type": 0, "Device Id": -1, "Addr": {}, "Bytes": {}}}}})",
      tid, ts, addr, bytes);
}

// With memory events each compute carries what it kept, released and peaked at, a backward the
// gradient bytes AccumulateGrad received; the optimizer's range names meta.optimizer.
TEST(KinetoImport, MemoryEventsAndTheOptimizerClass) {
  std::vector<std::string> events = OneUnitEvents();
  // FSDP's gather output (inside its pre_forward range [10, 20]), freed inside the forward:
  // the plan's buffer, in no compute's memory.
  events.push_back(Mem(15, 64, 7000));
  events.push_back(Mem(60, -64, 7000));
  // Forward (aten::linear, 30-80): +400, +100, -100: keeps 400, rises 500 above its start.
  events.push_back(Mem(35, 400));
  events.push_back(Mem(40, 100));
  events.push_back(Mem(50, -100));
  // Freed in FSDP's post_forward hook before its range (from the forward's last operator, 80,
  // to 100): the hook's time is FSDP's, what it frees is not FSDP's buffer: counted, in the
  // next compute outside every unit (the loss).
  events.push_back(Mem(90, -50));
  // The loss (aten::sum, 110-120): +4; with the -50 before it, it released 46 and rose 0.
  events.push_back(Mem(112, 4));
  // Backward (220-300): the weight's gradient (+64, handed to AccumulateGrad: [16] fp32 = 64
  // bytes), a temporary (+200, -200), the forward's 400 freed: curve 64, 264, 64, -336; less
  // the 64 gradient bytes (the plan's) it released 400 and rose 264.
  events.push_back(Mem(230, 64));
  events.push_back(Mem(240, 200));
  events.push_back(Mem(250, -200));
  events.push_back(Mem(260, -400));
  events.push_back(Op("torch::autograd::AccumulateGrad", 270, 5, 1,
                      R"({"Input Dims": [[16]], "Input type": ["float"]})"));
  // FSDP's own allocation inside its reduce range is the plan's, not a compute's.
  events.push_back(Mem(420, 32));
  events.push_back(Ann("Optimizer.step#AdamW.step", 495, 40));
  StatusOr<Imported> im = Import(ProfileText(events));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  const Trace& t = im->trace;
  std::vector<const Event*> computes;
  for (const Event& e : t.steps.at(0).microbatches.at(0).events) {
    if (e.op == fsdplab::Op::kCompute && e.phase != Phase::kOptimizer && e.name != "fsdp") {
      computes.push_back(&e);
    }
  }
  ASSERT_EQ(computes.size(), 3u);  // forward, the loss, backward
  const Event& fwd = *computes[0];
  EXPECT_EQ(fwd.saved_bytes, 400u);
  EXPECT_EQ(fwd.released_bytes, std::optional<Bytes>(0));
  EXPECT_EQ(fwd.peak_bytes, 500u);
  EXPECT_FALSE(fwd.grad_bytes.has_value());
  EXPECT_EQ(computes[1]->saved_bytes, 0u);
  EXPECT_EQ(computes[1]->released_bytes, std::optional<Bytes>(46));
  EXPECT_EQ(computes[1]->peak_bytes, 0u);
  const Event& bwd = *computes[2];
  EXPECT_EQ(bwd.saved_bytes, 0u);
  EXPECT_EQ(bwd.released_bytes, std::optional<Bytes>(400));
  EXPECT_EQ(bwd.peak_bytes, 264u);
  EXPECT_EQ(bwd.grad_bytes, std::optional<Bytes>(64));
  // AccumulateGrad (270) came after the peak (240): the gradient was an operator's output there.
  EXPECT_EQ(bwd.peak_grad_bytes, std::optional<Bytes>(0));
  const nlohmann::json extra = nlohmann::json::parse(t.meta.extra_json);
  EXPECT_EQ(extra.at("optimizer"), "adam");
  EXPECT_EQ(extra.at("master_weights"), "none");
  EXPECT_TRUE(CheckTraceEvents(t).empty());
}

// A gradient handed over (AccumulateGrad at 232) before the backward's peak (the temporary at
// 240) is held there as a gradient: peak_grad_bytes 64 of the 64 gradient bytes.
TEST(KinetoImport, GradientHandedOverBeforeThePeakIsHeldAtIt) {
  std::vector<std::string> events = OneUnitEvents();
  events.push_back(Mem(230, 64));
  events.push_back(Op("torch::autograd::AccumulateGrad", 232, 2, 1,
                      R"({"Input Dims": [[16]], "Input type": ["float"]})"));
  events.push_back(Mem(240, 200));
  events.push_back(Mem(250, -200));
  StatusOr<Imported> im = Import(ProfileText(events));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  const Event* bwd = nullptr;
  for (const Event& e : im->trace.steps.at(0).microbatches.at(0).events) {
    if (e.op == fsdplab::Op::kCompute && e.phase == Phase::kBackward && e.unit != kNoUnit) bwd = &e;
  }
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->peak_bytes, 264u);  // 64 + 200
  EXPECT_EQ(bwd->grad_bytes, std::optional<Bytes>(64));
  EXPECT_EQ(bwd->peak_grad_bytes, std::optional<Bytes>(64));
}

// Root + layers.0 nested in forward; the backward on another thread (the autograd engine's),
// with a recomputation: aten::linear inside a backward function of layers.0.
std::vector<std::string> NestedEvents() {
  return {
      Ann("ProfilerStep#0", 0, 1000),
      Ann("FSDP::pre_forward", 0, 5),
      Op("aten::embedding", 10, 10),
      Ann("FSDP::pre_forward (layers.0)", 30, 5),
      Op("aten::linear", 40, 30),
      Ann("FSDP::post_forward (layers.0)", 80, 5),
      Op("aten::linear", 90, 5),
      Ann("FSDP::post_forward", 100, 5),
      Ann("FSDP::pre_backward", 200, 5, 2),
      Ann("FSDP::pre_backward (layers.0)", 210, 5, 2),
      Op("autograd::engine::evaluate_function: AddmmBackward0", 220, 40, 2),
      Op("aten::linear", 225, 10, 2),
      Ann("FSDP::post_backward_reshard (layers.0)", 270, 5, 2),
      Op("autograd::engine::evaluate_function: EmbeddingBackward0", 280, 10, 2),
      Ann("FSDP::root_post_backward_callback", 300, 20, 2),
      Ann("FSDP::post_backward_reshard", 305, 5, 2),
  };
}

TEST(KinetoImport, NestedUnitsAutogradThreadAndRecompute) {
  StatusOr<Imported> im = Import(ProfileText(NestedEvents()));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  const Trace& t = im->trace;
  ASSERT_EQ(t.model.num_units(), 2);
  EXPECT_EQ(t.model.unit(1).name(), "model.layers.0");
  EXPECT_EQ(t.model.unit(1).parent(), 0);
  // By hand, each run of a unit's own work is a compute: its time from one hook to the next,
  // or to its last operator before FSDP's post hook, less FSDP's ranges. Forward: the root from
  // 0 to layers.0's pre_forward (30) less its pre_forward [0, 5] = 25 (the embedding's 10 and
  // the gaps), layers.0 from 30 to its aten::linear's end (70) less [30, 35] = 35, the root
  // again from 70 to its aten::linear's end (95) less [70, 85] (layers.0's post hook) = 10.
  // Backward (thread 2): the root from 200 to 210 less [200, 205] and the gap before
  // layers.0's pre_backward [205, 210] (FSDP's hook Python: nothing else runs between the
  // autograd engine's nodes) = 0, no compute; layers.0 from 210 to its backward function's end
  // (260) less [210, 215] = 45, of which 15 are a recomputation: the function from its start
  // (220) to the end of the last forward operator in it (aten::linear, 235), the framework's
  // gaps included; the root from 260 to EmbeddingBackward's end (290) less [260, 275] and the
  // post hook's Python after its range up to EmbeddingBackward [275, 280] = 10. FSDP's work
  // ("fsdp", at the next hook): its ranges, each post hook from the end of the unit's last
  // operator, and those gaps: 5 each before, [70, 85] = 15, [95, 105] = 10, [200, 210] = 10,
  // [260, 280] = 20, and the root's post hook and the callback [290, 320] = 30.
  EXPECT_EQ(Lines(t), (std::vector<std::string>{
                          "pre_forward model",
                          "compute - forward 5 fsdp",
                          "compute model forward 25",
                          "pre_forward model.layers.0",
                          "compute - forward 5 fsdp",
                          "compute model.layers.0 forward 35",
                          "post_forward model.layers.0",
                          "compute - forward 15 fsdp",
                          "compute model forward 10",
                          "post_forward model",
                          "compute - forward 10 fsdp",
                          "pre_backward model",
                          "compute - backward 10 fsdp",
                          "pre_backward model.layers.0",
                          "compute - backward 5 fsdp",
                          "compute model.layers.0 recompute 15",
                          "compute model.layers.0 backward 30",
                          "post_backward model.layers.0",
                          "compute - backward 20 fsdp",
                          "compute model backward 10",
                          "post_backward model",
                          "compute - backward 30 fsdp",
                          "backward_end -",
                      }));
  EXPECT_TRUE(CheckTraceStructure(t).empty());
  // No all-gathers: units without parameters, and the import says so.
  EXPECT_FALSE(im->notes.empty());
}

// Two layers under a root: FSDP's hook Python outside its ranges, where nothing but FSDP runs,
// is FSDP's work and not the enclosing unit's (the recorder brackets whole hooks).
TEST(KinetoImport, FsdpHookPythonOutsideItsRangesIsFsdps) {
  StatusOr<Imported> im = Import(ProfileText({
      Ann("ProfilerStep#0", 0, 1000),
      Ann("FSDP::pre_forward", 0, 5),
      Op("aten::embedding", 10, 10),
      Ann("FSDP::pre_forward (layers.0)", 30, 5),
      Op("aten::linear", 40, 30),
      Ann("FSDP::post_forward (layers.0)", 80, 5),
      Ann("FSDP::pre_forward (layers.1)", 100, 5),
      Op("aten::linear", 110, 30),
      Ann("FSDP::post_forward (layers.1)", 150, 5),
      Op("aten::linear", 165, 5),
      Ann("FSDP::post_forward", 180, 5),
      Ann("FSDP::pre_backward", 200, 5, 2),
      Op("autograd::engine::evaluate_function: MmBackward0", 210, 10, 2),
      Ann("FSDP::pre_backward (layers.1)", 230, 5, 2),
      Op("autograd::engine::evaluate_function: AddmmBackward0", 240, 30, 2),
      Ann("FSDP::post_backward_reshard (layers.1)", 280, 5, 2),
      Ann("FSDP::pre_backward (layers.0)", 290, 5, 2),
      Op("autograd::engine::evaluate_function: AddmmBackward0", 300, 30, 2),
      Ann("FSDP::post_backward_reshard (layers.0)", 340, 5, 2),
      Op("autograd::engine::evaluate_function: EmbeddingBackward0", 350, 10, 2),
      Ann("FSDP::root_post_backward_callback", 370, 20, 2),
      Ann("FSDP::post_backward_reshard", 375, 5, 2),
  }));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  // By hand. Forward: the root from 0 to layers.0's pre_forward (30) less [0, 5] = 25; layers.0
  // from 30 to its linear's end (70) less [30, 35] = 35; between layers.0's post_forward range
  // and layers.1's pre_forward range no operator runs: [85, 100] is the two hooks' Python,
  // FSDP's, so the root has 0 there (no compute); layers.1 from 100 to 140 less [100, 105] = 35;
  // the root from 140 to its linear's end (170) less layers.1's post hook [140, 155] = 15 (the
  // gap [155, 165] before its own operator stays its own: the caller's Python). Backward
  // (thread 2): the root from 200 to 230 less [200, 205] and [220, 230] (the engine between
  // MmBackward0 and layers.1's pre_backward range runs FSDP's hook) = 15; layers.1 from 230 to
  // 270 less [230, 235] = 35; the root 0 between 270 and 290 (layers.1's post hook [270, 285],
  // then [285, 290] before layers.0's range); layers.0 from 290 to 330 less [290, 295] = 35;
  // the root from 330 to EmbeddingBackward's end (360) less [330, 345] and [345, 350] = 10.
  // FSDP's work at each next hook: 5, 5, [70, 100] = 30, 5, [140, 155] = 15, [170, 185] = 15;
  // [200, 205] + [220, 230] = 15, 5, [270, 290] = 20, 5, [330, 350] = 20, [360, 390] = 30.
  // Counting those gaps as the enclosing unit's gave the root 15 more in forward ([85, 100]) and
  // 25, 5 ([285, 290]) and 15 in backward.
  EXPECT_EQ(Lines(im->trace), (std::vector<std::string>{
                                  "pre_forward model",
                                  "compute - forward 5 fsdp",
                                  "compute model forward 25",
                                  "pre_forward model.layers.0",
                                  "compute - forward 5 fsdp",
                                  "compute model.layers.0 forward 35",
                                  "post_forward model.layers.0",
                                  "compute - forward 30 fsdp",
                                  "pre_forward model.layers.1",
                                  "compute - forward 5 fsdp",
                                  "compute model.layers.1 forward 35",
                                  "post_forward model.layers.1",
                                  "compute - forward 15 fsdp",
                                  "compute model forward 15",
                                  "post_forward model",
                                  "compute - forward 15 fsdp",
                                  "pre_backward model",
                                  "compute - backward 15 fsdp",
                                  "compute model backward 15",
                                  "pre_backward model.layers.1",
                                  "compute - backward 5 fsdp",
                                  "compute model.layers.1 backward 35",
                                  "post_backward model.layers.1",
                                  "compute - backward 20 fsdp",
                                  "pre_backward model.layers.0",
                                  "compute - backward 5 fsdp",
                                  "compute model.layers.0 backward 35",
                                  "post_backward model.layers.0",
                                  "compute - backward 20 fsdp",
                                  "compute model backward 10",
                                  "post_backward model",
                                  "compute - backward 30 fsdp",
                                  "backward_end -",
                              }));
  EXPECT_TRUE(CheckTraceStructure(im->trace).empty());
}

// A Python frame ("python_function", from a profile taken with_stack=True).
std::string Py(std::string_view name, double ts, double dur, int tid = 1) {
  return X("python_function", name, tid, ts, dur);
}
constexpr std::string_view kPreForwardHook =
    "torch/distributed/fsdp/_fully_shard/_fsdp_state.py(308): _pre_forward";
constexpr std::string_view kPostForwardHook =
    "/usr/lib/python3/dist-packages/torch/distributed/fsdp/_fully_shard/_fsdp_state.py(340): "
    "_post_forward";
constexpr std::string_view kPreBackwardHook =
    "C:\\\\py\\\\torch\\\\distributed\\\\fsdp\\\\_fully_shard\\\\_fsdp_state.py(360): "
    "_pre_backward";

// A root and one layer with Python frames: FSDP2's (relative, absolute and Windows paths), the
// recorder's, a module's call and a frame of FSDP1's file: 14 frames, 6 operators.
std::vector<std::string> FramedEvents() {
  return {
      Ann("ProfilerStep#0", 0, 1000),
      Py(kPreForwardHook, 0, 10),
      Ann("FSDP::pre_forward", 2, 5),
      Op("aten::embedding", 10, 10),
      Py("torch/nn/modules/module.py(1791): _call_impl", 22, 70),
      Py("python/fsdplab/torch/hooks.py(345): hook", 24, 4),
      Py("fsdplab/torch/fsdp2.py(143): wrapper", 28, 17),
      Py("fsdplab/torch/fsdp2.py(159): _fsdp_enter", 29, 2),
      Py("torch/distributed/fsdp/_fully_shard/_fsdp_common.py(28): wrapper", 31, 13),
      Ann("FSDP::pre_forward (layers.0)", 36, 4),
      Op("aten::linear", 50, 30),
      Py(kPostForwardHook, 82, 13),
      Ann("FSDP::post_forward (layers.0)", 85, 5),
      Py("torch/distributed/fsdp/_fully_sharded_data_parallel.py(1): not_fsdp2", 96, 2),
      Op("aten::linear", 100, 10),
      Py(kPostForwardHook, 112, 8),
      Ann("FSDP::post_forward", 114, 4),
      Py(kPreBackwardHook, 200, 12),
      Ann("FSDP::pre_backward", 203, 5),
      Op("autograd::engine::evaluate_function: MmBackward0", 215, 10),
      Py(kPreBackwardHook, 228, 12),
      Ann("FSDP::pre_backward (layers.0)", 232, 4),
      Op("autograd::engine::evaluate_function: AddmmBackward0", 240, 30),
      Py("fsdplab/torch/hooks.py(601): hook", 272, 4),
      Py("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py(800): backward", 278, 12),
      Ann("FSDP::post_backward_reshard (layers.0)", 280, 5),
      Op("autograd::engine::evaluate_function: EmbeddingBackward0", 295, 10),
      Py("torch/distributed/fsdp/_fully_shard/_fsdp_state.py(400): "
         "_root_post_backward_final_callback",
         310, 30),
      Ann("FSDP::root_post_backward_callback", 312, 26),
      Ann("FSDP::post_backward_reshard", 315, 5),
  };
}

TEST(KinetoImport, PythonFramesPlaceFsdpsHookPythonAndTheRecordersOwnTime) {
  StatusOr<Imported> im = Import(ProfileText(FramedEvents()));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  // By hand. FSDP2's frames (relative, absolute and Windows paths; not FSDP1's file nor
  // module.py) are FSDP's time, ranges or not; the recorder's frames that run no operator and
  // no FSDP frame ([24, 28] its hook, [29, 31] its bracket's bookkeeping) are nobody's; its
  // wrapper [28, 45] holds an FSDP frame, so only its own [28, 29] and [44, 45] stay with the
  // unit. A post hook's mark is its frame's start (82, 112, 278).
  // Forward: the root from its pre_forward mark (2) to layers.0's (36), 34, less FSDP's [2, 10]
  // and [31, 36] and the recorder's 6 = 15 (the embedding 10, [20, 24] and [28, 29]); layers.0
  // from 36 to 82, 46, less FSDP's [36, 44] = 38 (the linear 30, [44, 50] and [80, 82]); the
  // root from 82 to 112, 30, less [82, 95] = 17 (the frame at [96, 98] is FSDP1's file: not
  // FSDP2's, the root's).
  // Backward: the root from 203 to 232, 29, less [203, 212] and [228, 232] = 16; layers.0 from
  // 232 to 278, 46, less [232, 240] and the recorder's [272, 276] = 34 (the backward 30,
  // [270, 272] and [276, 278]); the root from 278 to its post hook's frame (310; the frame
  // holds the final callback) less [278, 290] = 20.
  // FSDP's work, the frames between two marks: [0, 2] before the first; [2, 10] + [31, 36] = 13;
  // [36, 44] = 8; [82, 95] = 13; [112, 120] + [200, 203] = 11; [203, 212] + [228, 232] = 13;
  // [232, 240] = 8; [278, 290] = 12; [310, 338] = 28 up to the backward's end (the callback's).
  EXPECT_EQ(Lines(im->trace), (std::vector<std::string>{
                                  "compute - forward 2 fsdp",
                                  "pre_forward model",
                                  "compute - forward 13 fsdp",
                                  "compute model forward 15",
                                  "pre_forward model.layers.0",
                                  "compute - forward 8 fsdp",
                                  "compute model.layers.0 forward 38",
                                  "post_forward model.layers.0",
                                  "compute - forward 13 fsdp",
                                  "compute model forward 17",
                                  "post_forward model",
                                  "compute - forward 11 fsdp",
                                  "pre_backward model",
                                  "compute - backward 13 fsdp",
                                  "compute model backward 16",
                                  "pre_backward model.layers.0",
                                  "compute - backward 8 fsdp",
                                  "compute model.layers.0 backward 34",
                                  "post_backward model.layers.0",
                                  "compute - backward 12 fsdp",
                                  "compute model backward 20",
                                  "post_backward model",
                                  "compute - backward 28 fsdp",
                                  "backward_end -",
                              }));
  EXPECT_TRUE(CheckTraceStructure(im->trace).empty());
}

TEST(KinetoImport, RecomputationBeginsAfterFsdpsHookInItsFunction) {
  // NestedEvents' backward with Python frames on its thread (2) only, and layers.0's backward
  // function starting before FSDP's pre_backward hook, which runs inside it (the hook on the
  // unit's outputs; the checkpoint's unpack, the recomputation, comes after).
  const std::vector<std::string> nested = NestedEvents();
  std::vector<std::string> events(nested.begin(), nested.begin() + 8);  // the forward
  for (std::string e : {
           Py(kPreBackwardHook, 199, 7, 2),
           Ann("FSDP::pre_backward", 200, 5, 2),
           Op("autograd::engine::evaluate_function: AddmmBackward0", 206, 54, 2),
           Py(kPreBackwardHook, 208, 8, 2),
           Ann("FSDP::pre_backward (layers.0)", 210, 5, 2),
           Op("aten::linear", 225, 10, 2),
           Py("torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py(800): backward", 262, 15,
              2),
           Ann("FSDP::post_backward_reshard (layers.0)", 270, 5, 2),
           Op("autograd::engine::evaluate_function: EmbeddingBackward0", 280, 10, 2),
           Py("torch/distributed/fsdp/_fully_shard/_fsdp_state.py(400): "
              "_root_post_backward_final_callback",
              295, 30, 2),
           Ann("FSDP::root_post_backward_callback", 300, 20, 2),
           Ann("FSDP::post_backward_reshard", 305, 5, 2),
       }) {
    events.push_back(e);
  }
  StatusOr<Imported> im = Import(ProfileText(events));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  // By hand. Forward (thread 1, no frames): as NestedUnitsAutogradThreadAndRecompute, by the
  // rules. Backward (thread 2, by frames): the root from 200 to layers.0's pre_backward (210)
  // less the frames' [200, 206] and [208, 210] = 2, the engine's start of AddmmBackward0 before
  // FSDP's hook, the root's backward; layers.0 from 210 to its post hook's frame (262) less
  // [210, 216] = 46, of which the recomputation is from the end of FSDP's hook in the function
  // (216) to the linear's end (235) = 19 (from the function's start, 206, it gave the root a
  // recomputation of 2), the backward 27; the root from 262 to its post hook's frame (295) less
  // [262, 277] = 18. FSDP's work: [95, 105] and the root's hook frame before its range,
  // [199, 200] = 11; [200, 206] + [208, 210] = 8; [210, 216] = 6; [262, 277] = 15; [295, 320] =
  // 25 up to the backward's end.
  EXPECT_EQ(Lines(im->trace), (std::vector<std::string>{
                                  "pre_forward model",
                                  "compute - forward 5 fsdp",
                                  "compute model forward 25",
                                  "pre_forward model.layers.0",
                                  "compute - forward 5 fsdp",
                                  "compute model.layers.0 forward 35",
                                  "post_forward model.layers.0",
                                  "compute - forward 15 fsdp",
                                  "compute model forward 10",
                                  "post_forward model",
                                  "compute - forward 11 fsdp",
                                  "pre_backward model",
                                  "compute - backward 8 fsdp",
                                  "compute model backward 2",
                                  "pre_backward model.layers.0",
                                  "compute - backward 6 fsdp",
                                  "compute model.layers.0 recompute 19",
                                  "compute model.layers.0 backward 27",
                                  "post_backward model.layers.0",
                                  "compute - backward 15 fsdp",
                                  "compute model backward 18",
                                  "post_backward model",
                                  "compute - backward 25 fsdp",
                                  "backward_end -",
                              }));
  EXPECT_TRUE(CheckTraceStructure(im->trace).empty());
}

TEST(KinetoImport, GpuKernelsByCorrelationAndNcclBytesFromRecordParamComms) {
  // The forward's GEMM kernel (100 us) is launched inside the window; the NCCL kernel's end
  // (50) ends the collective issued at 4; record_param_comms: 8 bf16 elements out = 16 bytes.
  std::vector<std::string> ev = {
      Ann("ProfilerStep#1", 0, 500),
      Ann("FSDP::pre_forward", 0, 10),
      Ann("FSDP::all_gather", 1, 8),
      Op("fsdp::all_gather_copy_in", 2, 1, 1,
         R"({"Input Dims": [[[2]], [8], [], [], []], "Input type": ["TensorList", "c10::BFloat16"], "Concrete Inputs": ["", "", "[4]", "4", "0"]})"),
      Op("record_param_comms", 4, 2, 1,
         R"({"Collective name": "_allgather_base", "dtype": "BFloat16", "In msg nelems": 4, "Out msg nelems": 8, "Group size": 2})"),
      X("cuda_runtime", "cudaLaunchKernel", 1, 5, 0.5, R"({"correlation": 7})"),
      X("kernel", "ncclDevKernel_AllGather_RING_LL", 7, 20, 30, R"({"correlation": 7})"),
      X("cuda_runtime", "cudaLaunchKernel", 1, 12, 1, R"({"correlation": 8})"),
      X("kernel", "sm90_gemm", 7, 50, 100, R"({"correlation": 8})"),
      Ann("FSDP::post_forward", 20, 2),
  };
  StatusOr<Imported> im = Import(ProfileText(ev));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  EXPECT_TRUE(im->gpu);
  // A GPU kernel ran: meta.device cuda, whatever distributedInfo's backend says.
  EXPECT_EQ(nlohmann::json::parse(im->trace.meta.extra_json).at("device"), "cuda");
  EXPECT_EQ(im->trace.model.unit(0).params()[0].Numel(), 8u);
  EXPECT_EQ(im->trace.model.unit(0).params()[0].dtype, DType::kBf16);
  EXPECT_EQ(Lines(im->trace), (std::vector<std::string>{
                                  "pre_forward model",
                                  "all_gather model 16 4-50",
                                  "compute model forward 100",
                                  "post_forward model",
                              }));
}

// gloo runs each collective on a worker thread (`gloo:all_gather`) after the c10d operator has
// queued it, and FSDP waits for it on the thread that computes: a collective lasts from its
// issue to the end of the worker range that ran it. The ranges pair with the operators in the
// order they were queued, the barrier's included, and a range that started before every
// operator (work queued before the profile) is nobody's.
TEST(KinetoImport, GlooCollectiveEndsWithItsWorkerRange) {
  constexpr int kWorker = 3;
  std::vector<std::string> ev = {
      Ann("ProfilerStep#1", 0, 1000),
      Ann("gloo:all_reduce", 1, 3, kWorker),  // queued before the profile: nobody's
      Op("c10d::barrier", 2, 1, 1, R"({"Input Dims": [[]], "Input type": [""]})"),
      Ann("gloo:barrier", 4, 2, kWorker),
      Ann("FSDP::pre_forward", 10, 50),
      Ann("FSDP::all_gather", 11, 29),
      CopyIn(12),
      AllGather(14, 4),
      Ann("gloo:all_gather", 16, 20, kWorker),
      Ann("FSDP::all_gather_copy_out", 42, 8),
      Op("aten::linear", 70, 20),
      Ann("FSDP::post_forward", 100, 5),
      Ann("FSDP::pre_backward", 200, 10),
      Op("autograd::engine::evaluate_function: AddmmBackward0", 220, 80),
      Ann("FSDP::root_post_backward_callback", 400, 100),
      Ann("FSDP::post_backward_reshard", 405, 5),
      Ann("FSDP::post_backward_reduce", 410, 60),
      ReduceScatter(415, 5),
      Ann("gloo:all_reduce", 421, 40, kWorker),  // gloo's reduce-scatter runs as an all-reduce
  };
  StatusOr<Imported> im = Import(ProfileText(ev));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  // By hand: the barrier (issued at 2) takes gloo:barrier (4), not the all-reduce that began
  // at 1; the all-gather (14) takes gloo:all_gather [16, 36] (its operator alone: 14-18), and
  // spans its call FSDP::all_gather [11, 40]; the reduce-scatter (415) takes gloo:all_reduce
  // [421, 461] and spans FSDP::post_backward_reduce [410, 470]. The gather's copy-out is the
  // unit's FSDP::all_gather_copy_out after its call: [42, 50], 8. FSDP's own work: the forward's
  // FSDP::pre_forward [10, 60] less [11, 40] and the copy-out = 29 - 8 = 13; the unit's
  // forward (10 to aten::linear's end, 90) less that range = 30; the post_forward hook from 90
  // to 105: 15; the backward 90 and its 10 as in OneUnitHooksComputeCollectivesAndParams; from
  // the backward function's end the post-backward hook and the callback [300, 500] less
  // [410, 470] = 140.
  EXPECT_EQ(Lines(im->trace), (std::vector<std::string>{
                                  "pre_forward model",
                                  "all_gather model 64 11-40 copy-out 8",
                                  "compute - forward 13 fsdp",
                                  "compute model forward 30",
                                  "post_forward model",
                                  "compute - forward 15 fsdp",
                                  "pre_backward model",
                                  "compute - backward 10 fsdp",
                                  "compute model backward 90",
                                  "post_backward model",
                                  "reduce_scatter model 64 410-470",
                                  "compute - backward 140 fsdp",
                                  "backward_end -",
                              }));
  // Exposed: both collectives overlap no operator of the computing thread: 29 + 60.
  EXPECT_DOUBLE_EQ(im->steps.at(0).exposed_comm_us, 89);
  for (const std::string& n : im->notes) EXPECT_EQ(n.find("collective"), std::string::npos) << n;
}

// A worker range of another collective than the operator's is not its: the operator queued no
// work the profile shows (here the all-gather's range is missing), and it ends where FSDP's wait
// for it ends; the next operator still gets its own range.
TEST(KinetoImport, WorkerRangeOfAnotherCollectiveIsNotPaired) {
  std::vector<std::string> ev = OneUnitEvents();
  ev.push_back(Ann("gloo:all_reduce", 421, 40, 3));
  StatusOr<Imported> im = Import(ProfileText(ev));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  std::vector<std::string> coll;
  for (const std::string& l : Lines(im->trace)) {
    if (l.starts_with("all_gather") || l.starts_with("reduce_scatter")) coll.push_back(l);
  }
  // By hand: the all-gather (14) would take the next range, gloo:all_reduce (421), by order;
  // a reduction's range is not a gather's, so it ends with FSDP::all_gather (11-19), and the
  // reduce-scatter (415) takes that range: from its call's start (410) to 461.
  EXPECT_EQ(coll, (std::vector<std::string>{"all_gather model 64 11-19",
                                            "reduce_scatter model 64 410-461"}));
  EXPECT_TRUE(std::any_of(im->notes.begin(), im->notes.end(), [](const std::string& n) {
    return n.starts_with("1 collective(s) with no gloo worker range or NCCL kernel");
  }));
}

TEST(KinetoImport, StepsFromProfilerStepAndStepFilter) {
  std::vector<std::string> ev = OneUnitEvents(5);
  for (std::string e : OneUnitEvents(6)) ev.push_back(e);  // same times: shifted below
  // Shift the second copy by 1000 us.
  std::vector<std::string> shifted = OneUnitEvents(5);
  std::vector<std::string> second;
  for (const std::string& e : OneUnitEvents(6)) {
    nlohmann::json j = nlohmann::json::parse(e);
    j["ts"] = j["ts"].get<double>() + 1000;
    second.push_back(j.dump());
  }
  shifted.insert(shifted.end(), second.begin(), second.end());
  StatusOr<Imported> all = Import(ProfileText(shifted));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->trace.steps.size(), 2u);
  ImportOptions only;
  only.step = 6;
  StatusOr<Imported> one = Import(ProfileText(shifted), only);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->steps.size(), 1u);
  EXPECT_EQ(one->steps[0].profiler_step, 6);
  only.step = 9;
  StatusOr<Imported> none = Import(ProfileText(shifted), only);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no ProfilerStep#9"), std::string::npos);
}

TEST(KinetoImport, WithoutProfilerStepTheProfileIsOneStep) {
  std::vector<std::string> ev = OneUnitEvents();
  ev.erase(ev.begin());  // no ProfilerStep#5
  StatusOr<Imported> im = Import(ProfileText(ev));
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  ASSERT_EQ(im->trace.steps.size(), 1u);
  EXPECT_EQ(im->steps[0].profiler_step, -1);
  bool said = false;
  for (const std::string& n : im->notes) said = said || n.find("ProfilerStep") != n.npos;
  EXPECT_TRUE(said);
}

TEST(KinetoImport, Fsdp1RangesSayUnitsCannotBeIdentified) {
  StatusOr<Imported> im = Import(
      ProfileText({Ann("ProfilerStep#0", 0, 100), Ann("FullyShardedDataParallel.forward", 1, 50),
                   Op("aten::linear", 2, 10)}));
  ASSERT_FALSE(im.ok());
  EXPECT_EQ(im.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(im.status().message().find("FSDP1"), std::string::npos);
  EXPECT_NE(im.status().message().find("cannot be identified"), std::string::npos);
}

TEST(KinetoImport, NoShapesAsksForRecordShapesOrModelJson) {
  std::vector<std::string> ev = OneUnitEvents();
  ev[3] = Op("fsdp::all_gather_copy_in", 12, 1);  // no args: record_shapes was off
  StatusOr<Imported> im = Import(ProfileText(ev));
  ASSERT_FALSE(im.ok());
  EXPECT_NE(im.status().message().find("record_shapes=True"), std::string::npos);
  // A model file gives the units instead.
  ModelBuilder b;
  b.AddUnit("model", std::nullopt, {{"w", DType::kBf16, {4, 4}, std::nullopt}});
  ImportOptions o;
  o.model = *std::move(b).Build();
  StatusOr<Imported> with = Import(ProfileText(ev), o);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->trace.model.unit(0).numel(), 16u);
}

TEST(KinetoImport, CollectiveWaitsSplitAcrossRanksWithClockOffset) {
  // A collective's span on the CPU is FSDP's call (OneUnitHooksComputeCollectivesAndParams).
  // Rank 0 calls at 11 and its wait ends at 19 (the end of FSDP::all_gather); rank 1 (clock
  // 1000 us ahead) calls at 1013 and ends at 1019. Aligned by the ends: rank 1 arrived 2 us
  // after rank 0, so rank 0 waited 2 us and both transferred 19 - 13 = 6 us. Same for the
  // reduce-scatter (both end at 440 with FSDP::post_backward_reduce): rank 1 calls at 1420 ->
  // rank 0 (410) waits 10 and both transfer 440 - 420 = 20.
  std::vector<std::string> r1;
  for (const std::string& e : OneUnitEvents()) {
    nlohmann::json j = nlohmann::json::parse(e);
    const std::string name = j["name"];
    j["ts"] = j["ts"].get<double>() + 1000;
    if (name == "FSDP::all_gather") j["ts"] = 1013, j["dur"] = 6;
    if (name == "fsdp::all_gather_copy_in") j["ts"] = 1014;
    if (name == "c10d::_allgather_base_") j["ts"] = 1016, j["dur"] = 2;
    if (name == "FSDP::post_backward_reduce") j["ts"] = 1420, j["dur"] = 20;
    if (name == "c10d::_reduce_scatter_base_") j["ts"] = 1425, j["dur"] = 10;
    r1.push_back(j.dump());
  }
  StatusOr<Imported> a = Import(ProfileText(OneUnitEvents(), 0));
  StatusOr<Imported> b = Import(ProfileText(r1, 1));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<Imported*> ranks = {&*a, &*b};
  ASSERT_TRUE(SplitCollectiveWaits(ranks).ok());
  auto args = [](const Imported& im, std::size_t k) {
    std::vector<const Event*> c;
    for (const Event& e : im.trace.steps[0].microbatches[0].events) {
      if (e.op == fsdplab::Op::kCollective) c.push_back(&e);
    }
    return nlohmann::json::parse(c.at(k)->args_json);
  };
  EXPECT_DOUBLE_EQ(args(*a, 0)["wait_us"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(args(*a, 0)["transfer_us"].get<double>(), 6);
  EXPECT_DOUBLE_EQ(args(*b, 0)["wait_us"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(args(*b, 0)["transfer_us"].get<double>(), 6);
  EXPECT_DOUBLE_EQ(args(*a, 1)["wait_us"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(args(*a, 1)["transfer_us"].get<double>(), 20);
}

TEST(KinetoReader, EscapesInStringsDoNotEndTheEvent) {
  // A name with an escaped quote, brackets, an escaped tab and a trailing backslash: the event ends
  // at its own closing brace, and the next event is read too.
  StatusOr<Profile> p = ParseProfile(R"({"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "a\"}]\tb\\", "pid": 1, "tid": "t\"1", "ts": 1, "dur": 2},
    {"ph": "X", "cat": "cpu_op", "name": "c", "pid": 1, "tid": 2, "ts": 3, "dur": 4}]})");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->events.size(), 2u);
  EXPECT_EQ(p->names[static_cast<std::size_t>(p->events[0].name)], "a\"}]\tb\\");
  EXPECT_EQ(p->threads[static_cast<std::size_t>(p->events[0].thread)], "1/t\"1");
  EXPECT_DOUBLE_EQ(p->events[1].dur, 4);
}

TEST(KinetoReader, GarbledAndTruncatedInputsAreInvalidInputNeverACrash) {
  const std::string good = ProfileText(OneUnitEvents());
  ASSERT_TRUE(ParseProfile(good).ok());
  struct Case {
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", "empty file"},
      {"[1, 2]", "not a Kineto trace"},
      {R"({"traceEvents": [{"ph": "X", "ts": oops}]})", "traceEvents[0]"},
      {R"({"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]})", "needs \"ts\" and \"dur\""},
      {R"({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": -4}]})", "duration >= 0"},
      {R"({"schemaVersion": 1})", "no \"traceEvents\""},
      {good.substr(0, good.size() / 2), "truncated"},
      {good + "}", "trailing content"},
  };
  for (const Case& c : cases) {
    StatusOr<Profile> p = ParseProfile(c.text, "bad.json");
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput) << c.text;
    EXPECT_NE(p.status().message().find("bad.json"), std::string::npos);
    EXPECT_NE(p.status().message().find(c.says), std::string::npos) << p.status().message();
  }
  // Every prefix (step 13 bytes) is read or rejected with a status, never a crash.
  for (std::size_t n = 0; n < good.size(); n += 13) {
    StatusOr<Profile> p = ParseProfile(good.substr(0, n));
    if (p.ok()) (void)ImportProfile(*p, {});
  }
}

TEST(KinetoReader, ArgumentsOfTheWrongShapeAreInvalidInput) {
  // Regressions found by fuzzing (fuzz/regressions/kineto): an "Input Dims" that is no array
  // crashed the reader; dims beyond the element limit overflowed.
  for (const std::string args :
       {R"({"Input Dims": 5})", R"({"Input type": {"a": 1}})",
        R"({"Input Dims": [[562949953421312]]})", R"({"Input Dims": [[[281474976710656, 2]]]})"}) {
    StatusOr<Profile> p =
        ParseProfile(ProfileText({Op("c10d::_allgather_base_", 1, 2, 1, args)}), "bad.json");
    ASSERT_FALSE(p.ok()) << args;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidInput);
    EXPECT_NE(p.status().message().find("traceEvents[1].args"), std::string::npos)
        << p.status().message();
  }
}

TEST(KinetoImport, RankOutsideTheWorldIsInvalidInput) {
  StatusOr<Imported> im = Import(ProfileText(OneUnitEvents(), /*rank=*/3, /*world=*/2));
  ASSERT_FALSE(im.ok());
  EXPECT_NE(im.status().message().find("distributedInfo.rank 3 is outside 0..1"), std::string::npos)
      << im.status().message();
}

std::string TempPath(const std::string& name) {
  return (fs::temp_directory_path() / fmt::format("fsdplab_kineto_{}_{}", ::getpid(), name))
      .string();
}

void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  gzclose(f);
}

TEST(KinetoReader, GzipReadsLikePlainTextAndCorruptGzipIsInvalidInput) {
  const std::string text = ProfileText(OneUnitEvents());
  const std::string gz = TempPath("ok.json.gz");
  WriteGzip(gz, text);
  StatusOr<Profile> p = ReadProfile(gz);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  StatusOr<Profile> q = ParseProfile(text);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(p->events.size(), q->events.size());
  EXPECT_EQ(p->json_bytes, text.size());
  // Truncated gzip, and gzip with its deflate data overwritten.
  StatusOr<std::string> bytes = ReadFile(gz);
  ASSERT_TRUE(bytes.ok());
  const std::string cut = TempPath("cut.json.gz");
  ASSERT_TRUE(WriteFileAtomic(cut, bytes->substr(0, bytes->size() / 2)).ok());
  StatusOr<Profile> c = ReadProfile(cut);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(c.status().message().find("truncated"), std::string::npos) << c.status().message();
  std::string garbled = *bytes;
  for (std::size_t i = 12; i < garbled.size() - 8; i += 3) garbled[i] = static_cast<char>(0xff);
  const std::string bad = TempPath("bad.json.gz");
  ASSERT_TRUE(WriteFileAtomic(bad, garbled).ok());
  StatusOr<Profile> g = ReadProfile(bad);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidInput);
  for (const std::string& f : {gz, cut, bad}) fs::remove(f);
}

struct CmdResult {
  int code = -1;
  std::string out;
};

CmdResult Fsdplab(const std::string& args) {
  CmdResult r;
  std::string cmd = std::string(FSDPLAB_BIN) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(KinetoCli, ImportValidateSimulateCheckAndExitCodes) {
  const std::string in = TempPath("p.json");
  const std::string out = TempPath("t.json");
  ASSERT_TRUE(WriteFileAtomic(in, ProfileText(NestedEvents())).ok());
  CmdResult r = Fsdplab("import-kineto " + in + " -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Fsdplab("validate " + out).code, 0);
  EXPECT_EQ(Fsdplab("simulate " + out).code, 0);
  CmdResult check = Fsdplab("import-kineto " + in + " -o " + out + " --check");
  ASSERT_EQ(check.code, 0) << check.out;
  EXPECT_NE(check.out.find("predicted_us"), std::string::npos);
  EXPECT_NE(check.out.find("like with like"), std::string::npos);
  // The profiler's cost, by hand: 6 operators on the computing threads (the embedding, three
  // linears, two backward functions), no memory event, record_shapes: 6 x 2.3 = 13.8 us of the
  // 1000 us step; at --profiler-op-us 10: 60 us. Without the profiler the step took 500 us: the
  // profiled one ran +100%.
  EXPECT_NE(check.out.find("profiler: 6 operators, 0 memory events a step"), std::string::npos)
      << check.out;
  EXPECT_NE(check.out.find("about 13.8 us a step (1.4% of the profiled step)"), std::string::npos)
      << check.out;
  // The prediction without the profiler is the median prediction less those 13.8 us.
  const std::size_t at = check.out.find("predicted without the profiler: ");
  ASSERT_NE(at, std::string::npos) << check.out;
  const std::size_t median_at = check.out.find("(the median prediction ", at);
  ASSERT_NE(median_at, std::string::npos) << check.out;
  const double without = std::stod(check.out.substr(at + 32));
  const double median = std::stod(check.out.substr(median_at + 23));
  EXPECT_NEAR(median - without, 13.8, 0.05) << check.out;
  CmdResult vs = Fsdplab("import-kineto " + in + " -o " + out +
                         " --check --unprofiled-step-us 500 --profiler-op-us 10");
  ASSERT_EQ(vs.code, 0) << vs.out;
  EXPECT_NE(vs.out.find("about 60.0 us a step (6.0% of the profiled step)"), std::string::npos)
      << vs.out;
  EXPECT_NE(vs.out.find("unprofiled step 500.0 us: the profiled steps ran +100.0%"),
            std::string::npos)
      << vs.out;
  // A profile with Python frames (with_stack): each costs the tracer's time too. By hand: 6
  // operators x 2.3 + 14 frames x 0.56 = 21.64 us of the 1000 us step.
  const std::string framed = TempPath("framed.json");
  ASSERT_TRUE(WriteFileAtomic(framed, ProfileText(FramedEvents())).ok());
  CmdResult stack = Fsdplab("import-kineto " + framed + " -o " + out + " --check");
  ASSERT_EQ(stack.code, 0) << stack.out;
  EXPECT_NE(stack.out.find("profiler: 6 operators, 0 memory events and 14 Python frames "
                           "(with_stack) a step"),
            std::string::npos)
      << stack.out;
  EXPECT_NE(stack.out.find("0.56 us per Python frame it cost about 21.6 us a step (2.2% of"),
            std::string::npos)
      << stack.out;
  EXPECT_EQ(Fsdplab("import-kineto " + in + " -o " + out + " --check --unprofiled-step-us 0").code,
            1);
  // A truncated profile: exit 2, the file named, no output written.
  const std::string cut = TempPath("cut.json");
  const std::string none = TempPath("none.json");
  const std::string text = ProfileText(NestedEvents());
  ASSERT_TRUE(WriteFileAtomic(cut, text.substr(0, text.size() - 40)).ok());
  CmdResult bad = Fsdplab("import-kineto " + cut + " -o " + none);
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find(cut), std::string::npos);
  EXPECT_FALSE(fs::exists(none));
  EXPECT_EQ(Fsdplab("import-kineto").code, 1);
  EXPECT_EQ(Fsdplab("import-kineto " + in + " --step x").code, 1);
  for (const std::string& f : {in, out, cut}) fs::remove(f);
}

}  // namespace
}  // namespace fsdplab::kineto
