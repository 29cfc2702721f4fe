// Reading nccl-tests output (all_gather_perf, reduce_scatter_perf, ...): the text table that the
// tests print, and the JSON file that nccl-tests 2.19+ writes beside it.
//
//   NcclTestsOptions opts;                      // what the file cannot say for itself
//   opts.ranks = 16;                            // e.g. an excerpt without its device list
//   StatusOr<NcclTestsResult> r = ReadNcclTestsFile("all_gather.out", opts);
//   for (const NcclTestsRow& row : r->rows) use(row.size_bytes, row.out_of_place.time_us);
//
// Text form. Lines may carry an `mpirun --tag-output` prefix (`[1,0]<stdout>:`) and leading
// indentation; `NCCL INFO`/`NCCL WARN` lines, `NCCL version` lines, `# Reducing maxBytes` and
// other comments are skipped. The column layout comes from the `#  size  count  type ...` header
// when there is one (so extra trailing columns such as a timestamp or per-iteration values are
// ignored), else from the number of fields: 11 (no redop, no root; old all_gather), 12 (redop,
// no root; old reduce_scatter) or 13 (redop and root; nccl-tests 2.x). `#wrong` may be `N/A`;
// numbers may use exponent notation.
//
// JSON form (nccl-tests 2.19+, `-J FILE`; layout as its src/util.cu writes it, JSON_FILE_VERSION
// 1): {"version": 1, "args": ["./all_gather_perf", ...], "nccl_version": 22602,
//      "config": {"nthreads": 1, "ngpus": 8, ..., "devices": [{"rank": 0, "hostname": "h0",
//      "device": 0, ...}, ...]},
//      "results": [{"size": 128, "count": 4, "type": "float", "redop": "none", "root": "-1",
//                   "out_of_place": {"time": 35.05, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0},
//                   "in_place": {...}}, ...],
//      "average_bus_bandwidth": {"bandwidth": 110.98, ...}, ...}
// Unknown keys are ignored; `time` may be `cpu_time`; a double may be the string "nan";
// "out_of_place" may be null. The collective comes from args[0] (`all_gather_perf`).
//
// Where facts come from:
//   collective: `# Collective test starting: all_gather_perf` / JSON args[0], else the file name
//     (all_gather, allgather, ag_ / reduce_scatter, reducescatter, rs_, all_reduce ...), else
//     NcclTestsOptions::collective. A flag that contradicts the file is an error.
//   ranks: the `#  Rank N ... on HOST device D` lines (or JSON devices), else size / (count x
//     element size) for all_gather and reduce_scatter (nccl-tests prints the full buffer in
//     `size` and one rank's share in `count`), else nThread x nGpus, else NcclTestsOptions::ranks.
// Errors name the source and the line ("ag.txt:17: field 6 'abc' is not a number").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/core/units.h"

namespace fsdplab::sim {

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

struct NcclTestsResult final {
  std::string source;                        // file name or label, for messages
  std::optional<CollectiveKind> collective;  // nullopt: unknown (not all_gather/rs/ar)
  std::string program;                       // "all_gather_perf" when the file says so
  int ranks = 0;                             // number of ranks of the run (> 0)
  std::vector<NcclDevice> devices;           // from the device list; may be empty
  std::optional<int> nthreads;
  std::optional<int> ngpus;
  std::optional<double> avg_busbw_GBps;  // `# Avg bus bandwidth`
  std::vector<NcclTestsRow> rows;        // in file order, size-0 rows included

  // Distinct hostnames in the device list; 0 when there is no device list.
  int NumHosts() const;
};

struct NcclTestsOptions final {
  std::optional<CollectiveKind> collective;  // used when the file does not say
  std::optional<int> ranks;                  // used when the file does not say
};

// Bytes of one element of an nccl-tests type name ("float" 4, "bfloat16" 2, "int8" 1, ...);
// nullopt for a name it does not know.
std::optional<Bytes> NcclTypeBytes(std::string_view type);

// Guesses the collective from a file name or program name ("all_gather_perf", "ag_8x.txt").
std::optional<CollectiveKind> CollectiveFromName(std::string_view name);

// Parses the text or the JSON form (chosen by the first non-blank character). `source` names the
// input in messages and is used to guess the collective.
StatusOr<NcclTestsResult> ParseNcclTests(std::string_view text, std::string_view source,
                                         const NcclTestsOptions& options = {});
StatusOr<NcclTestsResult> ReadNcclTestsFile(const std::string& path,
                                            const NcclTestsOptions& options = {});

}  // namespace fsdplab::sim
