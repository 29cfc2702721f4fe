// Reading nccl-tests output (all_gather_perf, reduce_scatter_perf, all_reduce_perf, ...) as people
// really have it: a log of one test or of a script that ran several in turn, the JSON file of
// nccl-tests 2.19+, and `fsdplab bench-gather`'s own standard output (table or --json).
//
//   NcclTestsOptions opts;                        // what the file cannot say for itself
//   opts.collective = CollectiveKind::kAllGather; // pick the all_gather block of a script's log
//   StatusOr<std::vector<NcclTestsResult>> blocks = ReadNcclTestsBlocks("run.log", opts);
//   for (const NcclTestsRow& row : blocks->front().rows) use(row.size_bytes, row.out_of_place);
//
// A log is split into blocks, one per run of a test binary. A block starts at
// `# Collective test starting: X`, at a line naming a test binary (`mpirun ... all_reduce_perf -b
// 8 ...`, `+ ./build/all_gather_perf ...`), at an `# nThread` line, a device list or a column
// header that follows rows, at a row after the `# Avg bus bandwidth` footer, at a row whose size
// is smaller than the previous one (the sweep restarted), and at a row whose redop/root columns
// differ from the rows before it. `# Collective test concluded` ends one. Blocks without rows are
// dropped. A block that starts without a header of its own (a repeated sweep, nccl-tests -N; the
// next reduction op or type of -o all / -d all) keeps the name and device list of the run before
// it, unless that run never named its collective and the redop/root columns change. Each block
// keeps its own device list (a list repeated inside a block counts once, by rank), its own header,
// footer and rows.
//
// Lines may carry `mpirun --tag-output` tags (`[1,0]<stdout>:`), anywhere in the line (output of
// several processes interleaves), an `srun --label` prefix (`3: `) or an MPICH/Intel MPI rank
// prefix (`[3] `) at the start, and indentation; `NCCL INFO`/`NCCL WARN` lines, `NCCL version`
// lines, `# Reducing maxBytes` and other comments are skipped. The columns come from the
// `#  size  count  type ...` header when there is one (the out-of-place half starts at its first
// `time` column, the in-place half at the second; further columns such as a timestamp, per
// iteration values or bench-gather's overlap columns are ignored), else from the number of fields:
// 11 (no redop, no root; old all_gather), 12 (redop, no root; old reduce_scatter) or 13 (redop
// and root; nccl-tests 2.x). `#wrong` may be `N/A`; numbers may use exponent notation.
//
// JSON (nccl-tests 2.19+, `-J FILE`; layout as its src/util.cu writes it, JSON_FILE_VERSION 1):
//   {"version": 1, "args": ["./all_gather_perf", ...], "config": {"nthreads": 1, "ngpus": 8,
//    "devices": [{"rank": 0, "hostname": "h0", "device": 0}, ...]},
//    "results": [{"size": 128, "count": 4, "type": "float", "redop": "none", "root": "-1",
//                 "out_of_place": {"time": 35.05, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0},
//                 "in_place": {...}}, ...],
//    "average_bus_bandwidth": {"bandwidth": 110.98}}
// Unknown keys are ignored; `time` may be `cpu_time`; a double may be the string "nan";
// "out_of_place" may be null. `fsdplab bench-gather --json` / `-J` ({"format":
// "fsdplab.bench_gather", "op": "all_gather", "world_size": 2, "rows": [{"size_bytes", "count",
// "type", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "inplace_time_us", ...}]}) is read too.
//
// Which collective a block is: its own `Collective test starting` line or binary name
// (bench-gather: its `# fsdplab bench-gather: OP ...` line); else, for a file of one block, the
// file name (all_gather, allgather, ag_ / reduce_scatter, reducescatter, rs_ / all_reduce,
// allreduce, ar_); else the row layout when only one collective prints it (a reduction op with
// size = k x count x element size is a reduce_scatter over k ranks); else --collective, which
// also picks the blocks of that collective out of a log of several. A requested collective that
// the file does not hold is an error that lists what it holds: another is never substituted.
// The ranks: the block's device list, else size / (count x element size) for all_gather and
// reduce_scatter (nccl-tests prints the full buffer in `size` and one rank's share in `count`),
// else bench-gather's `N ranks`, else nThread x nGpus when above 1, else --ranks.
// Errors name the source, the line and the flag that resolves them.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::calib {

// One timing: the out-of-place or in-place half of a row.
struct NcclTiming final {
  TimeUs time_us = 0;
  double algbw_GBps = 0;
  double busbw_GBps = 0;
  std::optional<double> wrong;  // nullopt for N/A
  friend bool operator==(const NcclTiming&, const NcclTiming&) = default;
};

struct NcclTestsRow final {
  Bytes size_bytes = 0;     // the `size` column: the whole buffer (all ranks' data)
  std::uint64_t count = 0;  // elements (one rank's share for all_gather/reduce_scatter)
  std::string type;         // "float", "bfloat16", ...
  std::string redop;        // "" when the format has no redop column
  std::optional<int> root;  // nullopt when the format has no root column
  std::optional<NcclTiming> out_of_place;  // nullopt only when the JSON says null
  std::optional<NcclTiming> in_place;      // nullopt when the row has no in-place half
  int line = 0;                            // 1-based line in the text; 0 for JSON
  friend bool operator==(const NcclTestsRow&, const NcclTestsRow&) = default;
};

struct NcclDevice final {
  int rank = 0;
  std::string hostname;
  int device = 0;
  friend bool operator==(const NcclDevice&, const NcclDevice&) = default;
};

// One block: the output of one run of one test binary.
struct NcclTestsResult final {
  std::string source;  // file name, with "#N" when the file holds several blocks
  int block = 1;       // 1-based position of the block in its file
  int blocks_in_file = 1;
  int first_line = 0;  // first line of the block (0 for JSON)
  int last_line = 0;
  std::string program;  // "all_gather_perf" when the block says so
  // The collective as nccl-tests names it ("all_gather", "alltoall", "sendrecv", ...); empty
  // when unknown. `collective` is set for the three the cost model knows.
  std::string collective_name;
  std::optional<CollectiveKind> collective;
  std::string collective_from;      // where the name came from, for messages ("file name", ...)
  int ranks = 0;                    // number of ranks of the run (> 0 once resolved)
  std::vector<NcclDevice> devices;  // this block's device list, once per rank; may be empty
  std::optional<int> nthreads;
  std::optional<int> ngpus;
  std::optional<int> ranks_hint;         // bench-gather's "N ranks"
  std::optional<double> avg_busbw_GBps;  // `# Avg bus bandwidth`
  std::vector<NcclTestsRow> rows;        // in file order, size-0 rows included

  // Distinct hostnames in the device list; 0 when there is no device list.
  int NumHosts() const;
};

struct NcclTestsOptions final {
  // Names the collective of a file that does not say it, and picks that collective's blocks out
  // of a file of several (--collective).
  std::optional<CollectiveKind> collective;
  std::optional<int> ranks;  // used when the file does not say (--ranks)
  std::optional<int> block;  // 1-based: use only this block of each file (--block)
};

// The command-line flags that resolve an ambiguity, as errors name them.
inline constexpr std::string_view kCollectiveFlag = "--collective";
inline constexpr std::string_view kRanksFlag = "--ranks";
inline constexpr std::string_view kBlockFlag = "--block";

// Bytes of one element of an nccl-tests type name ("float" 4, "bfloat16" 2, "int8" 1, ...);
// nullopt for a name it does not know.
std::optional<Bytes> NcclTypeBytes(std::string_view type);

// Guesses the collective from a file name or program name ("all_gather_perf", "ag_8x.txt").
std::optional<CollectiveKind> CollectiveFromName(std::string_view name);

// The collective of an nccl-tests binary name ("./build/all_reduce_perf_mpi" -> "all_reduce");
// empty when `token` is not one.
std::string CollectiveOfBinary(std::string_view token);

// Every block of a text or JSON output, unresolved: collective and ranks as the file states
// them (no inference, no options). For tools that list what a log holds.
StatusOr<std::vector<NcclTestsResult>> SplitNcclTests(std::string_view text,
                                                      std::string_view source);

// The blocks of the collectives the cost model knows (all_gather, reduce_scatter, all_reduce),
// with collective and ranks resolved; with options.collective, only that collective's blocks.
// `notes` (may be null) receives what was skipped (blocks of other collectives).
StatusOr<std::vector<NcclTestsResult>> ParseNcclTestsBlocks(
    std::string_view text, std::string_view source, const NcclTestsOptions& options = {},
    std::vector<std::string>* notes = nullptr);
StatusOr<std::vector<NcclTestsResult>> ReadNcclTestsBlocks(
    const std::string& path, const NcclTestsOptions& options = {},
    std::vector<std::string>* notes = nullptr);

// Exactly one block: as ParseNcclTestsBlocks, and an error naming --collective / --block when the
// file holds several.
StatusOr<NcclTestsResult> ParseNcclTests(std::string_view text, std::string_view source,
                                         const NcclTestsOptions& options = {});
StatusOr<NcclTestsResult> ReadNcclTestsFile(const std::string& path,
                                            const NcclTestsOptions& options = {});

}  // namespace fsdplab::calib
