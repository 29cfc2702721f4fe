#include "fsdplab/calib/nccl_tests.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "fsdplab/core/file_util.h"

namespace fsdplab::calib {
namespace {

const std::string kDir = std::string(FSDPLAB_TEST_DATA_DIR) + "/nccl-tests/";

NcclTestsResult MustRead(const std::string& name, const NcclTestsOptions& opts = {}) {
  StatusOr<NcclTestsResult> r = ReadNcclTestsFile(kDir + name, opts);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : NcclTestsResult{};
}

NcclTestsOptions Opts(std::optional<CollectiveKind> collective, std::optional<int> ranks = {}) {
  NcclTestsOptions o;
  o.collective = collective;
  o.ranks = ranks;
  return o;
}

std::size_t CountZeroRows(const NcclTestsResult& r) {
  std::size_t n = 0;
  for (const NcclTestsRow& row : r.rows) n += row.size_bytes == 0 ? 1 : 0;
  return n;
}

// Row counts below are counted by hand in the files: the size-0 rows, then one row per power of
// two from the first non-zero size to 8 GiB (2^33).
TEST(NcclTestsParse, ModernH100AllGather) {
  NcclTestsResult r = MustRead("ag_8xH100_together-ring.txt");
  // 4 size-0 rows + 2^7 (128) .. 2^33 = 27 sizes.
  ASSERT_EQ(r.rows.size(), 31u);
  EXPECT_EQ(CountZeroRows(r), 4u);
  EXPECT_EQ(r.collective, CollectiveKind::kAllGather);
  EXPECT_EQ(r.program, "all_gather_perf");
  EXPECT_EQ(r.ranks, 8);  // 8 "#  Rank" lines
  EXPECT_EQ(r.devices.size(), 8u);
  EXPECT_EQ(r.NumHosts(), 1);
  EXPECT_EQ(r.devices[3].hostname, "gpu-dp-2jvzl-pqq7p");
  EXPECT_EQ(r.devices[3].device, 3);
  EXPECT_EQ(r.nthreads, 1);
  EXPECT_EQ(r.ngpus, 8);
  ASSERT_TRUE(r.avg_busbw_GBps.has_value());
  EXPECT_DOUBLE_EQ(*r.avg_busbw_GBps, 110.98);
  // "128  4  float  none  -1  35.05  0.00  0.00  0  34.61  0.00  0.00  0" (file line 22).
  const NcclTestsRow& first = r.rows[4];
  EXPECT_EQ(first.size_bytes, 128u);
  EXPECT_EQ(first.count, 4u);
  EXPECT_EQ(first.type, "float");
  EXPECT_EQ(first.redop, "none");
  EXPECT_EQ(first.root, -1);
  EXPECT_EQ(first.line, 22);
  ASSERT_TRUE(first.out_of_place && first.in_place);
  EXPECT_DOUBLE_EQ(first.out_of_place->time_us, 35.05);
  EXPECT_EQ(first.out_of_place->wrong, 0.0);
  EXPECT_DOUBLE_EQ(first.in_place->time_us, 34.61);
  const NcclTestsRow& last = r.rows.back();
  EXPECT_EQ(last.size_bytes, 8589934592u);
  EXPECT_DOUBLE_EQ(last.out_of_place->time_us, 21001.0);
  EXPECT_DOUBLE_EQ(last.out_of_place->busbw_GBps, 357.90);
  EXPECT_DOUBLE_EQ(last.in_place->time_us, 20684.4);
}

TEST(NcclTestsParse, ModernH100ReduceScatter) {
  NcclTestsResult r = MustRead("rs_8xH100_together-ring.txt");
  ASSERT_EQ(r.rows.size(), 31u);  // as the all-gather file: 4 + 27
  EXPECT_EQ(r.collective, CollectiveKind::kReduceScatter);
  EXPECT_EQ(r.ranks, 8);
  EXPECT_EQ(r.rows[4].redop, "sum");
  EXPECT_DOUBLE_EQ(r.rows[4].out_of_place->time_us, 41.94);
}

TEST(NcclTestsParse, OldFormatAllGatherWithoutRedopAndRoot) {
  NcclTestsResult r = MustRead("ag_8xA100-40GB_superbench-oldformat.txt");
  // 5 size-0 rows + 2^5 (32) .. 2^33 = 29 sizes; the NCCL INFO line is skipped.
  ASSERT_EQ(r.rows.size(), 34u);
  EXPECT_EQ(CountZeroRows(r), 5u);
  EXPECT_EQ(r.collective, CollectiveKind::kAllGather);  // from the file name
  EXPECT_TRUE(r.program.empty());
  EXPECT_EQ(r.ranks, 8);
  EXPECT_EQ(r.NumHosts(), 1);           // localhost
  const NcclTestsRow& row = r.rows[5];  // "32  1  float  35.03  0.00  0.00  N/A ..."
  EXPECT_EQ(row.size_bytes, 32u);
  EXPECT_EQ(row.count, 1u);
  EXPECT_TRUE(row.redop.empty());
  EXPECT_FALSE(row.root.has_value());
  EXPECT_FALSE(row.out_of_place->wrong.has_value());  // N/A
  EXPECT_DOUBLE_EQ(row.out_of_place->time_us, 35.03);
  // A time printed without decimals: "4294967296  134217728  float  17016 ...".
  EXPECT_DOUBLE_EQ(r.rows[32].out_of_place->time_us, 17016);
  EXPECT_DOUBLE_EQ(r.rows[32].in_place->time_us, 16474);
}

TEST(NcclTestsParse, OldFormatReduceScatterWithRedop) {
  NcclTestsResult r = MustRead("rs_8xA100-40GB_superbench-oldformat.txt");
  ASSERT_EQ(r.rows.size(), 34u);  // 5 + 29, as the all-gather
  EXPECT_EQ(r.collective, CollectiveKind::kReduceScatter);
  EXPECT_EQ(r.rows[10].redop, "sum");
  EXPECT_FALSE(r.rows[10].root.has_value());
  EXPECT_DOUBLE_EQ(r.rows.back().out_of_place->time_us, 32464);
}

TEST(NcclTestsParse, IndentedExcerptWithoutDeviceList) {
  NcclTestsResult r = MustRead("ag_16xH100_2node_gke-a3mega-tcpxo_cluster-toolkit.txt");
  // 5 size-0 rows + 2^8 (256) .. 2^33 = 26 sizes.
  ASSERT_EQ(r.rows.size(), 31u);
  EXPECT_EQ(r.collective, CollectiveKind::kAllGather);  // "ag_" file name
  // No device list: 256 B = ranks x 4 elements x 4 B, so 16 ranks.
  EXPECT_EQ(r.ranks, 16);
  EXPECT_TRUE(r.devices.empty());
  ASSERT_TRUE(r.avg_busbw_GBps.has_value());
  EXPECT_DOUBLE_EQ(*r.avg_busbw_GBps, 53.8932);  // followed by a trailing space in the file
  EXPECT_DOUBLE_EQ(r.rows.back().out_of_place->time_us, 42668.7);
}

TEST(NcclTestsParse, FlagsFillWhatTheFileLacksAndMustAgreeWithIt) {
  NcclTestsOptions opts;
  opts.ranks = 16;
  EXPECT_EQ(MustRead("ag_16xH100_2node_gke-a3mega-tcpxo_cluster-toolkit.txt", opts).ranks, 16);
  opts.ranks = 8;  // the rows say 16
  StatusOr<NcclTestsResult> r =
      ReadNcclTestsFile(kDir + "ag_16xH100_2node_gke-a3mega-tcpxo_cluster-toolkit.txt", opts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("16 ranks but --ranks 8"), std::string::npos)
      << r.status().message();
  NcclTestsOptions wrong_kind;
  wrong_kind.collective = CollectiveKind::kReduceScatter;
  r = ReadNcclTestsFile(kDir + "ag_8xH100_together-ring.txt", wrong_kind);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
}

// The variations of the wild, in one file: tag-output prefixes, NCCL lines, "Reducing maxBytes",
// exponent notation, CRLF line ends, trailing spaces, a timestamp column after the in-place half.
TEST(NcclTestsParse, VariationsFromTheWild) {
  std::string text =
      "[1,0]<stdout>:# nccl-tests version 2.19.0 nccl-headers=22800 nccl-library=22800\n"
      "[1,0]<stdout>:# Collective test starting: reduce_scatter_perf\n"
      "[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 1024 maxBytes 4294967296 step: 4(factor)\n"
      "[1,0]<stdout>:#\n"
      "[1,0]<stdout>:# Using devices\n"
      "[1,0]<stdout>:#  Rank  0 Group  0 Pid  11 on nodeA device  0 [0000:01:00] NVIDIA H100\n"
      "[1,0]<stdout>:#  Rank  1 Group  0 Pid  12 on nodeB device  0 [0000:01:00] NVIDIA H100\n"
      "nodeA:11:11 [0] NCCL INFO NCCL version 2.28.3+cuda13.0\r\n"
      "[1,0]<stdout>:# Reducing maxBytes to 1073741824 due to memory limitation\n"
      "[1,0]<stdout>:#       size   count   type  redop  root   time  algbw  busbw #wrong   time"
      "  algbw  busbw #wrong  timestamp\n"
      "[1,0]<stdout>:        1024     128  float    sum    -1  20.50   0.05   0.02      0  21.00"
      "   0.05   0.02      0  2025-01-02 03:04:05  \r\n"
      "nodeB:12:12 [0] NCCL INFO Channel 00/02 : 0 1\n"
      "[1,0]<stdout>:  1073741824 134217728 float sum -1 1.2e+04 89.48 44.74 0 1.25E4 85.90 "
      "42.95 0 2025-01-02 03:04:06\n"
      "[1,0]<stdout>:# Avg bus bandwidth    : 22.38 \n";
  StatusOr<NcclTestsResult> r = ParseNcclTests(text, "wild.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->collective, CollectiveKind::kReduceScatter);
  EXPECT_EQ(r->ranks, 2);       // two device lines (nGpus 1 is per process)
  EXPECT_EQ(r->NumHosts(), 2);  // nodeA, nodeB
  ASSERT_EQ(r->rows.size(), 2u);
  EXPECT_EQ(r->rows[0].line, 11);
  EXPECT_DOUBLE_EQ(r->rows[0].in_place->time_us, 21.00);
  EXPECT_DOUBLE_EQ(r->rows[1].out_of_place->time_us, 12000.0);
  EXPECT_DOUBLE_EQ(r->rows[1].in_place->time_us, 12500.0);
  EXPECT_EQ(r->rows[1].line, 13);
  EXPECT_DOUBLE_EQ(*r->avg_busbw_GBps, 22.38);
}

// The JSON file of nccl-tests 2.19+ (the layout its src/util.cu writes).
TEST(NcclTestsParse, JsonOutput) {
  std::string text = R"({"version": 1, "start_time": "2025-01-02 03:04:05",
    "args": ["./build/all_gather_perf", "-b", "1K", "-e", "1G", "-f", "2", "-g", "8"],
    "env": [], "nccl_version": 22803,
    "config": {"nthreads": 1, "ngpus": 8, "minimum_bytes": 1024, "maximum_bytes": 1073741824,
      "step_factor": 2, "warmup_iters": 5, "iterations": 20, "aggregated_iterations": 1,
      "validation": 1, "graph": 0, "blocking_collectives": "false", "parallel_init": "false",
      "devices": [{"rank": 0, "group": 0, "pid": 7, "hostname": "h0", "device": 0,
                   "device_hex": "0000:01:00", "device_info": "NVIDIA H100"},
                  {"rank": 1, "group": 0, "pid": 7, "hostname": "h0", "device": 1,
                   "device_hex": "0000:02:00", "device_info": "NVIDIA H100"}]},
    "results": [
      {"size": 0, "count": 0, "type": "float", "redop": "none", "root": "    -1",
       "out_of_place": {"time": 0.9, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
       "in_place": {"time": 0.9, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
       "actual_iterations": 20, "experiment_name": "all_gather"},
      {"size": 1024, "count": 128, "type": "float", "redop": "none", "root": "    -1",
       "out_of_place": {"time": 12.5, "alg_bw": 0.08, "bus_bw": 0.04, "nwrong": null},
       "in_place": {"time": "nan", "alg_bw": 0.08, "bus_bw": 0.04, "nwrong": 0.0}}],
    "out_of_bounds": {"count": 0, "okay": "true"},
    "average_bus_bandwidth": {"bandwidth": 0.02, "okay": "unchecked"},
    "errors": [], "end_time": "2025-01-02 03:04:09"})";
  StatusOr<NcclTestsResult> r = ParseNcclTests(text, "run.json");
  // A "nan" time cannot be used: the in-place half of row 1 is an error naming it.
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("results[1].in_place.time"), std::string::npos)
      << r.status().message();
  std::string fixed = text;
  fixed.replace(fixed.find("\"nan\""), 5, "12.75");
  r = ParseNcclTests(fixed, "run.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->program, "all_gather_perf");
  EXPECT_EQ(r->collective, CollectiveKind::kAllGather);
  EXPECT_EQ(r->ranks, 2);
  ASSERT_EQ(r->rows.size(), 2u);
  EXPECT_EQ(r->rows[1].size_bytes, 1024u);
  EXPECT_EQ(r->rows[1].root, -1);
  EXPECT_DOUBLE_EQ(r->rows[1].out_of_place->time_us, 12.5);
  EXPECT_FALSE(r->rows[1].out_of_place->wrong.has_value());
  EXPECT_DOUBLE_EQ(r->rows[1].in_place->time_us, 12.75);
  EXPECT_DOUBLE_EQ(*r->avg_busbw_GBps, 0.02);
}

TEST(NcclTestsParse, MalformedInputNamesFileAndLine) {
  const std::string header =
      "# Collective test starting: all_gather_perf\n"
      "#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong\n";
  // Line 4: the out-of-place time is not a number.
  StatusOr<NcclTestsResult> r =
      ParseNcclTests(header +
                         "1024 32 float none -1 20.1 0.05 0.04 0 20.2 0.05 0.04 0\n"
                         "2048 64 float none -1 abc 0.10 0.09 0 20.2 0.05 0.04 0\n",
                     "bad.txt", Opts(std::nullopt, 8));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  EXPECT_NE(r.status().message().find("bad.txt:4:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'abc'"), std::string::npos);
  // Line 3: a row cut short.
  r = ParseNcclTests(header + "1024 32 float none -1 20.1 0.05\n", "short.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("short.txt:3:"), std::string::npos) << r.status().message();
  // Without a header, a row of 10 fields fits no known layout.
  r = ParseNcclTests("1024 32 float 20.1 0.05 0.04 0 20.2 0.05 0.04\n", "ag_x.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ag_x.txt:1:"), std::string::npos) << r.status().message();
  // No rows at all.
  r = ParseNcclTests("# nThread 1 nGpus 8\n", "empty.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no result rows"), std::string::npos);
  // JSON: a size that is not an integer.
  r = ParseNcclTests(R"({"results": [{"size": "big", "count": 1}]})", "r.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("results[0].size"), std::string::npos);
}

TEST(NcclTestsParse, TypeSizesAndNames) {
  EXPECT_EQ(NcclTypeBytes("float"), 4u);
  EXPECT_EQ(NcclTypeBytes("bfloat16"), 2u);
  EXPECT_EQ(NcclTypeBytes("int8"), 1u);
  EXPECT_EQ(NcclTypeBytes("double"), 8u);
  EXPECT_FALSE(NcclTypeBytes("quaternion").has_value());
  EXPECT_EQ(CollectiveFromName("/x/y/all_gather_perf"), CollectiveKind::kAllGather);
  EXPECT_EQ(CollectiveFromName("rs_8xA100.txt"), CollectiveKind::kReduceScatter);
  EXPECT_EQ(CollectiveFromName("allreduce.log"), CollectiveKind::kAllReduce);
  EXPECT_FALSE(CollectiveFromName("broadcast.log").has_value());
}

std::string Slurp(const std::string& name) {
  StatusOr<std::string> s = ReadFile(kDir + name);
  EXPECT_TRUE(s.ok()) << name;
  return s.ok() ? *s : std::string();
}

// A script that ran five tests in turn (tests/data/nccl-tests/README.md): five blocks, each with
// its own name and device list (the same 8 GPUs each time, counted once per block).
TEST(NcclTestsBlocks, ScriptLogSplitsIntoItsCollectives) {
  StatusOr<std::vector<NcclTestsResult>> blocks =
      SplitNcclTests(Slurp("multi_8xH100_script-5-collectives.txt"), "multi.txt");
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  ASSERT_EQ(blocks->size(), 5u);
  const char* names[] = {"all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"};
  for (std::size_t i = 0; i < 5; ++i) {
    const NcclTestsResult& b = (*blocks)[i];
    EXPECT_EQ(b.collective_name, names[i]);
    EXPECT_EQ(b.block, static_cast<int>(i + 1));
    EXPECT_EQ(b.devices.size(), 8u) << names[i];  // not 8 x (i + 1)
    EXPECT_EQ(b.source, "multi.txt#" + std::to_string(i + 1));
  }
  EXPECT_EQ((*blocks)[0].rows.size(), 31u);  // all_reduce: 8 B .. 8 GiB
  EXPECT_EQ((*blocks)[1].rows.size(), 31u);  // all_gather: 4 size-0 rows + 128 B .. 8 GiB
  EXPECT_EQ((*blocks)[0].collective, CollectiveKind::kAllReduce);
  EXPECT_FALSE((*blocks)[3].collective.has_value());  // alltoall: not in the cost model
}

// --collective picks exactly the block of that collective: the rows are those of the same block
// cut out of the log (the published single-collective file).
TEST(NcclTestsBlocks, PickedCollectiveEqualsTheBlockCutOut) {
  const std::string log = Slurp("multi_8xH100_script-5-collectives.txt");
  struct Case {
    CollectiveKind kind;
    const char* single;
  };
  for (Case c : {Case{CollectiveKind::kAllGather, "ag_8xH100_together-ring.txt"},
                 Case{CollectiveKind::kReduceScatter, "rs_8xH100_together-ring.txt"},
                 Case{CollectiveKind::kAllReduce, "ar_8xH100_together-ring.txt"}}) {
    NcclTestsOptions opts;
    opts.collective = c.kind;
    StatusOr<NcclTestsResult> picked = ParseNcclTests(log, "multi.txt", opts);
    ASSERT_TRUE(picked.ok()) << picked.status().ToString();
    NcclTestsResult alone = MustRead(c.single);
    ASSERT_EQ(picked->rows.size(), alone.rows.size()) << c.single;
    for (std::size_t i = 0; i < alone.rows.size(); ++i) {
      EXPECT_EQ(picked->rows[i].size_bytes, alone.rows[i].size_bytes);
      EXPECT_EQ(picked->rows[i].out_of_place, alone.rows[i].out_of_place) << c.single << " " << i;
      EXPECT_EQ(picked->rows[i].in_place, alone.rows[i].in_place);
    }
    EXPECT_EQ(picked->ranks, 8);
    EXPECT_EQ(picked->avg_busbw_GBps, alone.avg_busbw_GBps);
  }
  // all_gather at 32 MiB: 125.45 us, as in the all_gather block (not the mean of five).
  StatusOr<NcclTestsResult> ag = ParseNcclTests(log, "multi.txt", Opts(CollectiveKind::kAllGather));
  ASSERT_TRUE(ag.ok());
  for (const NcclTestsRow& row : ag->rows) {
    if (row.size_bytes == 33554432) {
      EXPECT_DOUBLE_EQ(row.out_of_place->time_us, 125.45);
    }
  }
}

TEST(NcclTestsBlocks, WithoutAFlagEveryKnownCollectiveSeparately) {
  std::vector<std::string> notes;
  StatusOr<std::vector<NcclTestsResult>> blocks =
      ParseNcclTestsBlocks(Slurp("multi_8xH100_script-5-collectives.txt"), "multi.txt", {}, &notes);
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  ASSERT_EQ(blocks->size(), 3u);
  EXPECT_EQ((*blocks)[0].collective, CollectiveKind::kAllReduce);
  EXPECT_EQ((*blocks)[1].collective, CollectiveKind::kAllGather);
  EXPECT_EQ((*blocks)[2].collective, CollectiveKind::kReduceScatter);
  ASSERT_EQ(notes.size(), 2u);  // alltoall and sendrecv skipped, said so
  EXPECT_NE(notes[0].find("alltoall skipped"), std::string::npos) << notes[0];
  // One block asked for, several there: the error names the flag.
  StatusOr<NcclTestsResult> one =
      ParseNcclTests(Slurp("multi_8xH100_all_reduce-then-all_gather.txt"), "two.txt");
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("--collective"), std::string::npos)
      << one.status().message();
}

TEST(NcclTestsBlocks, AnAbsentCollectiveIsNeverSubstituted) {
  NcclTestsOptions opts;
  opts.collective = CollectiveKind::kReduceScatter;
  StatusOr<std::vector<NcclTestsResult>> r =
      ParseNcclTestsBlocks(Slurp("multi_8xH100_all_reduce-then-all_gather.txt"), "two.txt", opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidInput);
  const std::string m = r.status().message();
  EXPECT_NE(m.find("no reduce_scatter results"), std::string::npos) << m;
  EXPECT_NE(m.find("all_reduce"), std::string::npos) << m;  // what it holds
  EXPECT_NE(m.find("all_gather"), std::string::npos) << m;
}

// mpirun --tag-output with 16 processes: tags at the start of every line and inside the rows
// (where the tagger starts a new chunk); a NCCL WARN of another rank between the rows.
TEST(NcclTestsBlocks, MpirunTagsAnywhereInALine) {
  NcclTestsResult r = MustRead("ag_16xH100_2node_mpirun-tag-output.txt");
  NcclTestsResult plain = MustRead("ag_16xH100_2node_gke-a3mega-tcpxo_cluster-toolkit.txt");
  EXPECT_EQ(r.collective, CollectiveKind::kAllGather);
  EXPECT_EQ(r.ranks, 16);
  EXPECT_EQ(r.NumHosts(), 2);
  ASSERT_EQ(r.rows.size(), plain.rows.size());
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    EXPECT_EQ(r.rows[i].size_bytes, plain.rows[i].size_bytes);
    EXPECT_EQ(r.rows[i].out_of_place, plain.rows[i].out_of_place) << i;
    EXPECT_EQ(r.rows[i].in_place, plain.rows[i].in_place) << i;
  }
  // srun --label and MPICH/Intel MPI prefixes at the start of a line.
  std::string labelled =
      "0: # Collective test starting: all_gather_perf\n"
      "0: #  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
      "0:     1024  128  float  none  -1  20.5 0.05 0.04 0  21.0 0.05 0.04 0\n"
      "[0] 2048  256  float  none  -1  21.5 0.10 0.08 0  21.0 0.10 0.09 0\n";
  StatusOr<NcclTestsResult> s = ParseNcclTests(labelled, "srun.txt");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->rows.size(), 2u);
  EXPECT_EQ(s->ranks, 2);  // 1024 B = 2 x 128 x 4 B
  EXPECT_DOUBLE_EQ(s->rows[1].out_of_place->time_us, 21.5);
}

// Without a device list or a name: the message names the flag that resolves it, one at a time,
// and --collective alone is enough where size / count gives the ranks.
TEST(NcclTestsBlocks, AmbiguousFilesNameTheFlagThatResolvesThem) {
  const std::string ar = Slurp("excerpt_8xH100_unnamed-all_reduce.txt");
  StatusOr<NcclTestsResult> r = ParseNcclTests(ar, "excerpt.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--collective"), std::string::npos) << r.status().message();
  r = ParseNcclTests(ar, "excerpt.txt",
                     Opts(std::nullopt, 8));  // --ranks alone: still the collective
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--collective"), std::string::npos) << r.status().message();
  r = ParseNcclTests(ar, "excerpt.txt", Opts(CollectiveKind::kAllReduce));
  ASSERT_FALSE(r.ok());  // all_reduce: size = count x 4 B says nothing of the ranks
  EXPECT_NE(r.status().message().find("--ranks"), std::string::npos) << r.status().message();
  r = ParseNcclTests(ar, "excerpt.txt", Opts(CollectiveKind::kAllReduce, 8));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rows.size(), 31u);
  // The all_gather excerpt under a neutral name: --collective alone; 256 B = 16 x 4 x 4 B.
  const std::string ag = Slurp("ag_16xH100_2node_gke-a3mega-tcpxo_cluster-toolkit.txt");
  r = ParseNcclTests(ag, "excerpt.txt", Opts(CollectiveKind::kAllGather));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->ranks, 16);
  // A reduction op with size = 8 x count x 4 B can only be a reduce_scatter: no flag needed.
  const std::string rs_table =
      "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
      "1024 32 float sum -1 20.5 0.05 0.04 0 21.0 0.05 0.04 0\n"
      "2048 64 float sum -1 21.5 0.10 0.08 0 21.0 0.10 0.09 0\n";
  r = ParseNcclTests(rs_table, "excerpt.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->collective, CollectiveKind::kReduceScatter);
  EXPECT_EQ(r->ranks, 8);
}

// Sweeps run back to back without headers: a size restart or a change of redop starts a block.
// Within a run that named itself (all_reduce_perf -o all: one sweep per reduction op) every sweep
// is that collective; in a table that never said, a changed redop may be another collective.
TEST(NcclTestsBlocks, SizeRestartsAndRedopChangesSplitBlocks) {
  const std::string named =
      "# Collective test starting: all_reduce_perf\n"
      "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
      "1024 256 float sum -1 20.5 0.05 0.09 0 21.0 0.05 0.09 0\n"
      "2048 512 float sum -1 21.5 0.10 0.17 0 21.0 0.10 0.17 0\n"
      "1024 256 float sum -1 20.7 0.05 0.09 0 21.0 0.05 0.09 0\n"  // restart: -N 2
      "2048 512 float sum -1 21.9 0.10 0.16 0 21.0 0.10 0.17 0\n"
      "1024 256 float max -1 20.1 0.05 0.09 0 20.0 0.05 0.09 0\n"  // -o all: the next op
      "2048 512 float max -1 20.9 0.10 0.17 0 21.0 0.10 0.17 0\n";
  StatusOr<std::vector<NcclTestsResult>> b = SplitNcclTests(named, "runs.txt");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->size(), 3u);
  for (const NcclTestsResult& r : *b) EXPECT_EQ(r.collective_name, "all_reduce") << r.source;
  EXPECT_DOUBLE_EQ((*b)[1].rows[0].out_of_place->time_us, 20.7);
  EXPECT_EQ((*b)[2].rows[0].redop, "max");
  const std::string unnamed =
      "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
      "1024 32 float none -1 20.5 0.05 0.04 0 21.0 0.05 0.04 0\n"
      "2048 64 float none -1 21.5 0.10 0.08 0 21.0 0.10 0.09 0\n"
      "4096 128 float sum -1 30.0 0.10 0.08 0 31.0 0.10 0.09 0\n";
  b = SplitNcclTests(unnamed, "tables.txt");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[0].collective_name, "");
  EXPECT_EQ((*b)[1].collective_name, "");
}

// `fsdplab bench-gather`'s own standard output (table) and --json.
TEST(NcclTestsBlocks, ReadsBenchGatherOutput) {
  NcclTestsResult t = MustRead("bench-gather_host-2ranks_all_gather_stdout.txt");
  EXPECT_EQ(t.collective, CollectiveKind::kAllGather);
  EXPECT_EQ(t.ranks, 2);          // "2 ranks" in its header (its count column is the whole buffer)
  ASSERT_EQ(t.rows.size(), 10u);  // 64 KiB .. 32 MiB
  EXPECT_EQ(t.rows[0].size_bytes, 65536u);
  EXPECT_FALSE(t.rows[0].in_place.has_value());  // the overlap columns are not an in-place half
  NcclTestsResult j = MustRead("bench-gather_host-4ranks_reduce_scatter.json");
  EXPECT_EQ(j.collective, CollectiveKind::kReduceScatter);
  EXPECT_EQ(j.ranks, 4);
  ASSERT_EQ(j.rows.size(), 10u);
  EXPECT_TRUE(j.rows[0].in_place.has_value());
  // The contention document is not a cost measurement: the error says where it goes.
  StatusOr<NcclTestsResult> c = ParseNcclTests(
      R"({"format": "fsdplab.bench_gather", "version": 1, "op": "concurrent", "rows": []})",
      "c.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--contention"), std::string::npos);
}

// Every output in the test data parses, or fails with a message that names the flag to give.
TEST(NcclTestsBlocks, EveryFileParsesOrNamesTheFix) {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(kDir)) {
    if (e.path().extension() != ".txt" && e.path().extension() != ".json") continue;
    ++files;
    StatusOr<std::vector<NcclTestsResult>> b = ReadNcclTestsBlocks(e.path().string());
    if (b.ok()) {
      EXPECT_FALSE(b->empty()) << e.path();
      for (const NcclTestsResult& r : *b) EXPECT_GE(r.ranks, 2) << r.source;
      continue;
    }
    const std::string m = b.status().message();
    EXPECT_TRUE(m.find("--collective") != std::string::npos ||
                m.find("--ranks") != std::string::npos || m.find("--block") != std::string::npos)
        << m;
  }
  EXPECT_GE(files, 15);
}

// The all_reduce pasted in nccl-tests issue #78: the binary named on the mpirun line, the old
// header (redop, no root), no device list; all_reduce's size / count does not give the ranks.
TEST(NcclTestsBlocks, OldFormatAllReduceNamedByItsCommandLine) {
  StatusOr<NcclTestsResult> r =
      ReadNcclTestsFile(kDir + "ar_256xV100_mpirun-oldformat_nccl-tests-issue78.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--ranks"), std::string::npos) << r.status().message();
  r = ReadNcclTestsFile(kDir + "ar_256xV100_mpirun-oldformat_nccl-tests-issue78.txt",
                        Opts(std::nullopt, 256));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->collective, CollectiveKind::kAllReduce);
  EXPECT_EQ(r->program, "all_reduce_perf");
  EXPECT_EQ(r->ranks, 256);
  ASSERT_EQ(r->rows.size(), 6u);
  EXPECT_EQ(r->rows[0].redop, "sum");
  EXPECT_FALSE(r->rows[0].root.has_value());
  EXPECT_DOUBLE_EQ(r->rows[4].out_of_place->time_us, 16129);
  EXPECT_DOUBLE_EQ(r->rows[4].in_place->time_us, 14383);
}

// mpirun starting a single-process build of nccl-tests once per rank: every copy is a 1-rank
// run, which measures nothing; the message says why and what to do.
TEST(NcclTestsBlocks, OneRankRunsAreRefusedWithTheReason) {
  const std::string t =
      "# Collective test starting: all_gather_perf\n"
      "# nThread 1 nGpus 1 minBytes 1024 maxBytes 2048 step: 2(factor)\n"
      "#  Rank  0 Group  0 Pid 7 on h0 device  0 [0000:01:00] NVIDIA H100\n"
      "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
      "1024 256 float none -1 5.1 0.2 0.0 0 5.0 0.2 0.0 0\n"
      "2048 512 float none -1 5.2 0.4 0.0 0 5.1 0.4 0.0 0\n";
  StatusOr<NcclTestsResult> r = ParseNcclTests(t, "one.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("MPI=1"), std::string::npos) << r.status().message();
}

// nccl-tests 2.19's -I per-iteration columns after each half, and a timestamp: the halves are
// found by the header's `time` columns (as writeResultHeader prints them).
TEST(NcclTestsBlocks, PerIterationColumns) {
  const std::string t =
      "# Collective test starting: reduce_scatter_perf\n"
      "#  Rank  0 Group  0 Pid 7 on h0 device  0 [0000:01:00] NVIDIA B200\n"
      "#  Rank  1 Group  0 Pid 7 on h0 device  1 [0000:02:00] NVIDIA B200\n"
      "#             size         count      type   redop    root     time   algbw   busbw  #wrong"
      "    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max"
      "    i_p99    i_cv%            timestamp\n"
      "        1048576        131072     float     sum      -1    20.50   51.15   25.58       0"
      "    19.90    22.10    22.00     2.10    21.00   49.93   24.97       0    20.10    23.00"
      "    22.90     2.50  2025-01-02 03:04:05\n";
  StatusOr<NcclTestsResult> r = ParseNcclTests(t, "b200.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->rows.size(), 1u);
  EXPECT_EQ(r->ranks, 2);
  EXPECT_DOUBLE_EQ(r->rows[0].out_of_place->time_us, 20.50);
  EXPECT_DOUBLE_EQ(r->rows[0].in_place->time_us, 21.00);  // not i_min 19.90
  EXPECT_DOUBLE_EQ(r->rows[0].in_place->busbw_GBps, 24.97);
}

}  // namespace
}  // namespace fsdplab::calib
