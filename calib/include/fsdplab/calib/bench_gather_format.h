// What `fsdplab bench-gather` writes, written here, where calib/nccl_tests.h reads it back: its
// table (stdout), the nccl-tests text (--nccl-out: the format `fsdplab calibrate` reads, as of
// nccl-tests 2.17), its JSON (--json, -J; format "fsdplab.bench_gather", version 1) for every
// --op, and the numbers those outputs carry that calibrate reads (the communication contention
// and the streams' wake-ups of --op concurrent). One room for each format: a writer and its
// reader change together.
//
//   GatherBenchOptions o;  o.op = "all_gather";  o.world_size = 2;
//   std::vector<GatherBenchRow> rows = ...;      // a backend's BenchGather
//   WriteFileAtomic("ag.txt", BenchGatherNcclText(o, rows, "host", "node0", getpid()));
//   StatusOr<MeasuredContention> c = ReadContentionFile("concurrent.json");  // calibrate
//
// Rows timed outside fsdplab (e.g. torch.distributed collectives a user timed) come in as a
// file of `SIZE_BYTES TIME_US` lines (ReadTimedRows; `#` starts a comment) and leave through the
// same writers (`fsdplab bench-gather --rows FILE`), so that no other program formats
// nccl-tests text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fsdplab/calib/calibration.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/live/gather_bench.h"
#include "fsdplab/live/live.h"

namespace fsdplab::calib {

// The collective bench (--op all_gather | reduce_scatter): its stdout table (header, rows with
// nccl-tests' columns and the overlap columns, `# Avg bus bandwidth`), the nccl-tests text
// (`# Collective test starting`, a device list of `world_size` ranks on `host`, both halves of
// every row, the footer; `note` lines, when given, follow the first line) and the JSON.
std::string BenchGatherTable(const GatherBenchOptions& o, const std::vector<GatherBenchRow>& rows,
                             std::string_view backend);
std::string BenchGatherNcclText(const GatherBenchOptions& o,
                                const std::vector<GatherBenchRow>& rows, std::string_view backend,
                                std::string_view host, long pid, std::string_view note = {});
std::string BenchGatherJson(const GatherBenchOptions& o, const std::vector<GatherBenchRow>& rows,
                            std::string_view backend);

// Rows timed elsewhere: one `SIZE_BYTES TIME_US` pair per line (the collective's full buffer
// and the time of one call; blank lines and `#` comments skipped), as rows of `o.op` over
// `o.world_size` ranks of `o.dtype` (count = size / (world x element size); the in-place half
// repeats the time). Errors name the file and the line.
StatusOr<std::vector<GatherBenchRow>> ReadTimedRows(const std::string& path,
                                                    const GatherBenchOptions& o);

// --op concurrent. The slowdowns the simulator uses: sum over sizes of the time together / sum of
// the time alone - 1, per collective (all_gather, reduce_scatter). Weighted by time like a step
// is: small messages, whose slowdown is mostly thread wake-ups, count for little next to the
// large ones that fill a backward pass.
std::pair<double, double> WeightedSlowdowns(const std::vector<ContentionRow>& rows);

// The stream wake-up the simulator uses (host only: no probes elsewhere): per condition, the mean
// over every probe of every size (a size's probes run as long as its loops do, so the sizes weigh
// by time as they do in a step), with the live probes' gaps and on-demand starts; nullopt when a
// condition has no probe.
struct MeasuredWake final {
  StreamWake wake;
  int probes = 0;
  int gap_pairs = 0;       // back-to-back collectives behind wake.after_*
  int demand_gathers = 0;  // on-demand gathers behind wake.demand_all_gather
};
std::optional<MeasuredWake> StreamWakeOf(const std::vector<ContentionRow>& rows,
                                         const CollectiveGaps& gaps,
                                         const DemandGatherStarts& demand);

std::string ContentionTable(const GatherBenchOptions& o, const std::vector<ContentionRow>& rows,
                            const CollectiveGaps& gaps, const DemandGatherStarts& demand,
                            std::string_view backend);
std::string ContentionJson(const GatherBenchOptions& o, const std::vector<ContentionRow>& rows,
                           const CollectiveGaps& gaps, const DemandGatherStarts& demand,
                           std::string_view backend);

// What calibrate takes from the -J file of --op concurrent: the contention factors (a negative
// one, timing noise, becomes 0 with a note), the world size and the stream wake-up. Errors name
// the file and the field (format, version, op, world_size, rows[i].wrong, comm_contention.*).
struct MeasuredContention final {
  CommContention factors;
  std::optional<int> world_size;
  std::string statistic;           // how the file summarised its rows (bench-gather: time-weighted)
  std::vector<std::string> notes;  // values clamped to 0
  std::optional<StreamWake> stream_wake;  // host benches only
};
StatusOr<MeasuredContention> ReadContentionFile(const std::string& path);

// --op drift: one collective of `size` bytes timed again and again.
std::string DriftTable(const GatherBenchOptions& o, std::uint64_t size,
                       const std::vector<DriftSample>& samples, const DriftSummary& s,
                       double window_s, std::string_view backend);
std::string DriftJson(const GatherBenchOptions& o, std::uint64_t size,
                      const std::vector<DriftSample>& samples, const DriftSummary& s,
                      double window_s, std::string_view backend);

// --trace: per message size of `op` (all_gather or reduce_scatter), the mean time of its calls
// in the timed steps of a live run's timeline (every rank's; steps from `warmup_steps` on), in
// nccl-tests' row shape (bytes as uint8 elements: a unit's planes may mix types).
std::vector<GatherBenchRow> TraceRows(const Timeline& t, const std::string& op, int world,
                                      int warmup_steps);

// The outputs of --trace: one nccl-tests block per collective kind (each noting the trace and
// the steps), the JSON ("op": the one kind or "both", "trace", "steps", "rows" of every kind) and
// the table.
struct TraceBlock final {
  std::string op;
  std::vector<GatherBenchRow> rows;
};
struct TraceOutputs final {
  std::string nccl;
  std::string json;
  std::string table;
};
TraceOutputs TraceBenchOutputs(const GatherBenchOptions& o, std::string_view backend,
                               std::string_view trace_path, const std::vector<TraceBlock>& blocks,
                               std::string_view host, long pid);

}  // namespace fsdplab::calib
