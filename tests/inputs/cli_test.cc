// `fsdplab calibrate` and `fsdplab synth` end to end: exit codes and the files they write.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "fsdplab/core/file_util.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/trace/trace_io.h"

namespace fsdplab {
namespace {

const std::string kNccl = std::string(FSDPLAB_TEST_DATA_DIR) + "/nccl-tests/";

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fsdplab_inputs_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs `fsdplab ARGS`, stdout and stderr to files; returns the exit status.
  int Run(const std::string& args) {
    std::string cmd = std::string(FSDPLAB_BIN) + " " + args + " >" + (dir_ / "out").string() +
                      " 2>" + (dir_ / "err").string();
    int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string Slurp(const std::string& name) {
    StatusOr<std::string> s = ReadFile((dir_ / name).string());
    return s.ok() ? *s : std::string();
  }
  std::filesystem::path dir_;
};

TEST_F(CliTest, CalibrateWritesAClusterFileTheReaderAccepts) {
  std::string cluster = (dir_ / "cluster.json").string();
  ASSERT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt " + kNccl +
                "ag_16xH100_2node_gke-a3mega-tcpxo_cluster-toolkit.txt -o " + cluster),
            0)
      << Slurp("err");
  EXPECT_NE(Slurp("out").find("max |error|"), std::string::npos);
  StatusOr<std::string> text = ReadFile(cluster);
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["world_size"], 16);    // the larger measured world
  EXPECT_EQ(j["gpus_per_node"], 8);  // 8 devices on the one host of the 8-GPU run
  StatusOr<sim::Cluster> c = sim::ParseClusterJson(*text);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->all_gather.intra.empty());
  EXPECT_FALSE(c->all_gather.inter.empty());  // 16 ranks, no device list, 8 per node: spans nodes
  EXPECT_EQ(c->all_gather.inter.curve.world_size, 16);
}

// A script's log of five collectives: with --collective only that one is calibrated, with the
// values of its own block; without, every known collective separately.
TEST_F(CliTest, CalibrateMultiCollectiveLog) {
  const std::string log = kNccl + "multi_8xH100_script-5-collectives.txt";
  std::string cluster = (dir_ / "cluster.json").string();
  ASSERT_EQ(Run("calibrate " + log + " --collective all_gather -o " + cluster), 0) << Slurp("err");
  StatusOr<sim::Cluster> c = sim::ReadClusterFile(cluster);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->reduce_scatter.empty());
  EXPECT_TRUE(c->all_reduce.empty());
  std::string alone = (dir_ / "alone.json").string();
  ASSERT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt -o " + alone), 0)
      << Slurp("err");
  StatusOr<sim::Cluster> a = sim::ReadClusterFile(alone);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(c->all_gather, a->all_gather);  // the same curve as the block cut out
  ASSERT_EQ(Run("calibrate " + log + " -o " + cluster), 0) << Slurp("err");
  EXPECT_NE(Slurp("out").find("alltoall skipped"), std::string::npos) << Slurp("out");
  c = sim::ReadClusterFile(cluster);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->all_gather.intra.empty());
  EXPECT_FALSE(c->reduce_scatter.intra.empty());
  EXPECT_FALSE(c->all_reduce.intra.empty());
  EXPECT_EQ(c->gpus_per_node, 8);  // five device lists of the same 8 GPUs: still 8 per node
  // all_gather's asymptotic bandwidth is its own (~360 GB/s), not a mix with all_reduce's.
  EXPECT_NEAR(c->all_gather.intra.curve.tail_busbw_GBps, 360, 10);
  // Asking for a collective the log lacks: exit 2, and what it holds.
  EXPECT_EQ(Run("calibrate " + kNccl +
                "multi_8xH100_all_reduce-then-all_gather.txt "
                "--collective reduce_scatter"),
            2);
  EXPECT_NE(Slurp("err").find("no reduce_scatter results"), std::string::npos) << Slurp("err");
}

TEST_F(CliTest, CalibratePlotAndBenchGatherOutput) {
  std::string svg = (dir_ / "fit.svg").string();
  ASSERT_EQ(
      Run("calibrate " + kNccl + "bench-gather_host-2ranks_all_gather_stdout.txt --plot " + svg), 0)
      << Slurp("err");
  StatusOr<std::string> text = ReadFile(svg);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->rfind("<svg", 0), 0u);
  EXPECT_NE(text->find("all_gather intra (2 ranks)"), std::string::npos);
  EXPECT_NE(text->find("</svg>"), std::string::npos);
  // The report shows measured, fitted and error per size.
  EXPECT_NE(Slurp("out").find("measured us"), std::string::npos);
}

TEST_F(CliTest, CostPrintsTimeBandwidthTierAndSegment) {
  std::string cluster = (dir_ / "cluster.json").string();
  ASSERT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt -o " + cluster), 0)
      << Slurp("err");
  ASSERT_EQ(Run("cost --cluster " + cluster +
                " --collective all_gather --world-size 8 --bytes 1K,64M,16G --json"),
            0)
      << Slurp("err");
  nlohmann::json j = nlohmann::json::parse(Slurp("out"));
  ASSERT_EQ(j["sizes"].size(), 3u);
  // 64 MiB was measured at 210.89 us; the curve passes within the fit's error (1%) of it, and
  // algbw = 67108864 B / time, busbw = algbw x 7/8.
  const nlohmann::json& mid = j["sizes"][1];
  const double t = mid["time_us"].get<double>();
  EXPECT_NEAR(t, 210.89, 0.01 * 210.89);
  EXPECT_NEAR(mid["algbw_GBps"].get<double>(), 67108864 / t / 1e3, 1e-9);
  EXPECT_NEAR(mid["busbw_GBps"].get<double>(), 67108864 / t / 1e3 * 7 / 8, 1e-9);
  EXPECT_EQ(mid["tier"], "intra");
  EXPECT_NE(mid["detail"].get<std::string>().find("segment"), std::string::npos);
  // 16 GiB is beyond the sweep: the asymptotic bandwidth.
  EXPECT_NE(j["sizes"][2]["detail"].get<std::string>().find("asymptotic"), std::string::npos);
  // Every size carries the band the calibration's cross-validated error gives: around the time,
  // and wider than nothing (the fit's own sizes were left out and predicted within a few %).
  for (const nlohmann::json& size : j["sizes"]) {
    const double time = size["time_us"].get<double>();
    EXPECT_LT(size["low_us"].get<double>(), time) << size.dump();
    EXPECT_GT(size["high_us"].get<double>(), time) << size.dump();
    EXPECT_GT(size["low_us"].get<double>(), 0.5 * time) << size.dump();
    EXPECT_LT(size["high_us"].get<double>(), 2.0 * time) << size.dump();
  }
  // reduce_scatter was not calibrated: the intra line (no band: low = high = time), and the notes
  // say why.
  ASSERT_EQ(Run("cost --cluster " + cluster + " --collective reduce_scatter --bytes 1M --json"), 0);
  const nlohmann::json line = nlohmann::json::parse(Slurp("out"))["sizes"][0];
  EXPECT_EQ(line["low_us"], line["time_us"]);
  EXPECT_EQ(line["high_us"], line["time_us"]);
  ASSERT_EQ(Run("cost --cluster " + cluster + " --collective reduce_scatter --bytes 1M"), 0);
  EXPECT_NE(Slurp("out").find("intra line"), std::string::npos) << Slurp("out");
  EXPECT_NE(Slurp("out").find("reduce_scatter intra: no curve"), std::string::npos);
  EXPECT_EQ(Run("cost --cluster " + cluster + " --collective broadcast --bytes 1M"), 1);
  EXPECT_EQ(Run("cost --collective all_gather --bytes 1M"), 1);
  EXPECT_EQ(Run("cost --cluster " + (dir_ / "missing.json").string() +
                " --collective all_gather --bytes 1M"),
            2);
}

// Rows timed outside fsdplab (e.g. a user's torch.distributed timings) become
// nccl-tests text through the one writer of it, and calibrate reads them back exactly.
TEST_F(CliTest, BenchGatherRowsFormatsRowsTimedElsewhere) {
  const std::string rows = (dir_ / "ag.rows").string();
  const std::string nccl = (dir_ / "ag.txt").string();
  ASSERT_TRUE(WriteFileAtomic(rows, "# size time\n65536 51.25\n\n262144 80.5\n1048576 170\n").ok());
  ASSERT_EQ(Run("bench-gather --rows " + rows + " --op all_gather --world-size 2 -d float " +
                "--nccl-out " + nccl),
            0)
      << Slurp("err");
  const std::string cluster = (dir_ / "cluster.json").string();
  ASSERT_EQ(Run("calibrate " + nccl + " --json -o " + cluster), 0) << Slurp("err");
  const nlohmann::json fit = nlohmann::json::parse(Slurp("out"))["fits"][0];
  EXPECT_EQ(fit["collective"], "all_gather");
  EXPECT_EQ(fit["world_size"], 2);
  ASSERT_EQ(fit["points"].size(), 3u);
  // The times as given (nccl-tests prints 2 decimals): 51.25, 80.50, 170.00 us.
  EXPECT_DOUBLE_EQ(fit["points"][0]["measured_us"].get<double>(), 51.25);
  EXPECT_DOUBLE_EQ(fit["points"][1]["measured_us"].get<double>(), 80.5);
  EXPECT_DOUBLE_EQ(fit["points"][2]["measured_us"].get<double>(), 170.0);
  // A malformed line: invalid input (2) naming the file and the line; no output file.
  ASSERT_TRUE(WriteFileAtomic(rows, "65536 51.25\n262144 fast\n").ok());
  const std::string bad = (dir_ / "bad.txt").string();
  EXPECT_EQ(Run("bench-gather --rows " + rows + " --op all_gather --nccl-out " + bad), 2);
  EXPECT_NE(Slurp("err").find("ag.rows:2"), std::string::npos) << Slurp("err");
  EXPECT_FALSE(std::filesystem::exists(bad));
  // Not with --trace, nor for --op concurrent: usage errors (1).
  EXPECT_EQ(Run("bench-gather --rows " + rows + " --op concurrent"), 1);
}

// simulate --band: one run with every calibrated collective at the fast end of its band and one
// at the slow end; the report notes both step times beside the nominal one, in that order.
TEST_F(CliTest, SimulateBandNotesTheStepTimeAtEitherEnd) {
  const std::string cluster = (dir_ / "cluster.json").string();
  ASSERT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt " + kNccl +
                "rs_8xH100_together-ring.txt -o " + cluster),
            0)
      << Slurp("err");
  const std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  ASSERT_EQ(Run("simulate " + trace + " --cluster " + cluster + " --band --json"), 0)
      << Slurp("err");
  const nlohmann::json report = nlohmann::json::parse(Slurp("out"));
  std::string note;
  for (const auto& n : report["notes"]) {
    if (n.get<std::string>().find("collective cost band") != std::string::npos) note = n;
  }
  ASSERT_FALSE(note.empty()) << report["notes"].dump();
  double low = 0, high = 0, nominal = 0;
  ASSERT_EQ(std::sscanf(note.c_str(),
                        "collective cost band (--band): step time %lf us with every calibrated "
                        "collective at the fast end of its cross-validated error band, %lf us at "
                        "the slow end (%lf us",
                        &low, &high, &nominal),
            3)
      << note;
  EXPECT_LT(low, nominal);
  EXPECT_GT(high, nominal);
  EXPECT_NEAR(nominal, report["summary"]["step_time_us"].get<double>(), 0.05);
  // Without --band, no such note: the report is what it was.
  ASSERT_EQ(Run("simulate " + trace + " --cluster " + cluster + " --json"), 0);
  EXPECT_EQ(Slurp("out").find("collective cost band"), std::string::npos);
}

TEST_F(CliTest, CalibrateErrors) {
  // A malformed row: exit 2, the message names the file and the line.
  std::string bad = (dir_ / "all_gather_bad.txt").string();
  ASSERT_TRUE(WriteFileAtomic(bad,
                              "#  size count type redop root time algbw busbw #wrong time algbw "
                              "busbw #wrong\n"
                              "1024 32 float none -1 20.1 0.05 0.04 0 20.2 0.05 0.04 0\n"
                              "2048 64 float none -1 2x.1 0.05 0.04 0 20.2 0.05 0.04 0\n")
                  .ok());
  EXPECT_EQ(Run("calibrate " + bad + " --ranks 8"), 2);
  EXPECT_NE(Slurp("err").find("all_gather_bad.txt:3:"), std::string::npos) << Slurp("err");
  EXPECT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt --tier sideways"), 1);
  EXPECT_EQ(Run("calibrate"), 1);
  EXPECT_EQ(Run("calibrate " + (dir_ / "missing.txt").string()), 2);
  // --ranks contradicting the device list (8 ranks) is an error.
  EXPECT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt --ranks 4"), 2);
}

// The -J output of `fsdplab bench-gather --op concurrent`, with these figures.
std::string ConcurrentBenchJson(int world_size, double all_gather, double reduce_scatter,
                                const std::string& op = "concurrent") {
  nlohmann::ordered_json doc = {{"format", "fsdplab.bench_gather"},
                                {"version", 1},
                                {"backend", "host"},
                                {"op", op},
                                {"world_size", world_size},
                                {"dtype", "bf16"},
                                {"warmup", 3},
                                {"iters", 10},
                                {"check", true},
                                {"rows",
                                 {{{"size_bytes", 1048576},
                                   {"all_gather_alone_us", 120.5},
                                   {"reduce_scatter_alone_us", 300.1},
                                   {"all_gather_together_us", 180.2},
                                   {"reduce_scatter_together_us", 420.7},
                                   {"all_gather_slowdown", 0.495},
                                   {"reduce_scatter_slowdown", 0.402},
                                   {"wrong", 0}}}},
                                {"comm_contention",
                                 {{"all_gather", all_gather},
                                  {"reduce_scatter", reduce_scatter},
                                  {"statistic", "median over sizes"}}}};
  return doc.dump(2);
}

TEST_F(CliTest, CalibrateContentionGoesToTheClusterFile) {
  std::string bench = (dir_ / "concurrent.json").string();
  ASSERT_TRUE(WriteFileAtomic(bench, ConcurrentBenchJson(8, 0.48, 0.41)).ok());
  std::string cluster = (dir_ / "cluster.json").string();
  ASSERT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt --contention " + bench +
                " -o " + cluster),
            0)
      << Slurp("err");
  EXPECT_NE(Slurp("out").find("comm contention from " + bench +
                              " (median over sizes): all-gather x1.48, reduce-scatter x1.41"),
            std::string::npos)
      << Slurp("out");
  StatusOr<sim::Cluster> c = sim::ReadClusterFile(cluster);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->comm_contention.has_value());
  EXPECT_EQ(*c->comm_contention, (calib::CommContention{0.48, 0.41}));
  EXPECT_EQ(c->world_size, 8);
  EXPECT_FALSE(c->all_gather.intra.empty());

  // --json carries it too.
  ASSERT_EQ(
      Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt --contention " + bench + " --json"),
      0)
      << Slurp("err");
  nlohmann::json j = nlohmann::json::parse(Slurp("out"));
  EXPECT_DOUBLE_EQ(j["comm_contention"]["all_gather"].get<double>(), 0.48);
  EXPECT_EQ(j["comm_contention"]["source"], bench);
  EXPECT_DOUBLE_EQ(j["cluster"]["comm_contention"]["reduce_scatter"].get<double>(), 0.41);

  // Alone, with a slowdown below 0 (noise): the file's world, and 0 with a note.
  ASSERT_TRUE(WriteFileAtomic(bench, ConcurrentBenchJson(2, -0.03, 0.2)).ok());
  ASSERT_EQ(Run("calibrate --contention " + bench + " -o " + cluster), 0) << Slurp("err");
  EXPECT_NE(Slurp("out").find("comm_contention.all_gather -0.03 is negative"), std::string::npos)
      << Slurp("out");
  c = sim::ReadClusterFile(cluster);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->world_size, 2);
  EXPECT_EQ(*c->comm_contention, (calib::CommContention{0.0, 0.2}));

  // A host bench's stream wake-up goes to the cluster too, and is said.
  nlohmann::json host = nlohmann::json::parse(ConcurrentBenchJson(2, 0.48, 0.41));
  host["stream_wake_us"] = {{"idle", 15.5},
                            {"while_all_gather", 70},
                            {"while_reduce_scatter", 90},
                            {"together_all_gather", 160},
                            {"together_reduce_scatter", 130},
                            {"demand_all_gather", 95},
                            {"probes", 1200},
                            {"statistic", "mean over probes, every size"}};
  ASSERT_TRUE(WriteFileAtomic(bench, host.dump()).ok());
  ASSERT_EQ(Run("calibrate --contention " + bench + " -o " + cluster), 0) << Slurp("err");
  EXPECT_NE(Slurp("out").find("communication streams resume 15.5 us after their events (70.0 us "
                              "while an all-gather runs, 90.0 us while a reduce-scatter does; "
                              "released by one event together, an all-gather starts 160.0 us "
                              "and a reduce-scatter 130.0 us after it; an all-gather issued "
                              "on demand starts 95.0 us after the kernel it waited for)"),
            std::string::npos)
      << Slurp("out");
  c = sim::ReadClusterFile(cluster);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE(c->stream_wake.has_value());
  EXPECT_EQ(*c->stream_wake, (calib::StreamWake{15.5, 70, 90, 160, 130, 0, 0, 95}));
  // A bad one is an error naming the file and the field.
  host["stream_wake_us"]["while_all_gather"] = -4;
  ASSERT_TRUE(WriteFileAtomic(bench, host.dump()).ok());
  EXPECT_EQ(Run("calibrate --contention " + bench + " -o " + cluster), 2);
  EXPECT_NE(Slurp("err").find("stream_wake_us.while_all_gather"), std::string::npos)
      << Slurp("err");
}

TEST_F(CliTest, CalibrateContentionErrors) {
  std::string bench = (dir_ / "gather_bench.json").string();
  // Another op of bench-gather: exit 2, the message names the file and the field.
  ASSERT_TRUE(WriteFileAtomic(bench, ConcurrentBenchJson(8, 0.48, 0.41, "all_gather")).ok());
  EXPECT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt --contention " + bench), 2);
  EXPECT_NE(Slurp("err").find(bench + ": op: 'all_gather'"), std::string::npos) << Slurp("err");
  // Measured on 2 ranks, the nccl-tests output on 8: both named.
  ASSERT_TRUE(WriteFileAtomic(bench, ConcurrentBenchJson(2, 0.48, 0.41)).ok());
  EXPECT_EQ(Run("calibrate " + kNccl + "ag_8xH100_together-ring.txt --contention " + bench), 2);
  EXPECT_NE(Slurp("err").find("world_size 2 but the nccl-tests outputs measured 8 ranks"),
            std::string::npos)
      << Slurp("err");
  // Not JSON, a missing figure, a missing file.
  ASSERT_TRUE(WriteFileAtomic(bench, "# size count type\n").ok());
  EXPECT_EQ(Run("calibrate --contention " + bench), 2);
  EXPECT_NE(Slurp("err").find(bench + ": not valid JSON"), std::string::npos) << Slurp("err");
  nlohmann::json doc = nlohmann::json::parse(ConcurrentBenchJson(2, 0.48, 0.41));
  doc["comm_contention"].erase("reduce_scatter");
  ASSERT_TRUE(WriteFileAtomic(bench, doc.dump()).ok());
  EXPECT_EQ(Run("calibrate --contention " + bench), 2);
  EXPECT_NE(Slurp("err").find("comm_contention.reduce_scatter: missing"), std::string::npos)
      << Slurp("err");
  EXPECT_EQ(Run("calibrate --contention " + (dir_ / "missing.json").string()), 2);
}

TEST_F(CliTest, SynthWritesAValidTrace) {
  std::string out = (dir_ / "t.json").string();
  ASSERT_EQ(Run("synth --layers 6 --hidden 1024 --ffn 2816 --heads 16 --kv-heads 4 --vocab 32000 "
                "--dtype mxfp8 --recompute selective --microbatches 2 --steps 3 "
                "--shared-layers 1 --tie-embeddings -o " +
                out),
            0)
      << Slurp("err");
  StatusOr<Trace> t = ReadTraceFile(out);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->steps.size(), 3u);
  EXPECT_EQ(t->model.num_units(), 6);  // root + 5 distinct layers
  nlohmann::json meta = nlohmann::json::parse(t->meta.extra_json);
  // Root: 32000 x 1024 + 1024 (tied) = 32,769,024. Layer: q, o 2 x 1024^2 = 2,097,152; k, v
  // 2 x 256 x 1024 = 524,288; MLP 3 x 1024 x 2816 = 8,650,752; norms 2,048: 11,274,240.
  // 5 layers: 56,371,200 + 32,769,024 = 89,140,224.
  EXPECT_EQ(meta["parameters"], 89140224);
  EXPECT_NE(Slurp("err").find("89140224 parameters"), std::string::npos) << Slurp("err");
  EXPECT_EQ(Run("synth --recompute sometimes"), 1);
  EXPECT_NE(Slurp("err").find("--recompute"), std::string::npos);
}

// Limits on what a command line asks for (core/limits.h): rejected, naming the limit, before
// anything is allocated. `--steps 2^40` used to be cast to int (0) and silently run the
// default 2 steps; `synth --steps 2^30` built a trace of 2^30 step copies.
TEST_F(CliTest, AbsurdStepsAndSizesAreRejected) {
  const std::string trace = std::string(FSDPLAB_TRACES_DIR) + "/gpt_small.json";
  EXPECT_EQ(Run("simulate " + trace + " --steps 1099511627776"), 1);
  EXPECT_NE(Slurp("err").find("--steps: 1099511627776 is more than the 1048576 steps a run may "
                              "have"),
            std::string::npos)
      << Slurp("err");
  EXPECT_EQ(Run("schedule " + trace + " --steps 2147483648"), 1);
  EXPECT_NE(Slurp("err").find("--steps: 2147483648 is more than the 1048576 steps"),
            std::string::npos)
      << Slurp("err");
  // Within the step limit, but 2^20 steps of gpt_small's events are more than 2^24 events.
  EXPECT_EQ(Run("simulate " + trace + " --steps 1048576"), 1);
  EXPECT_NE(Slurp("err").find("is more than the 16777216 events a run may replay"),
            std::string::npos)
      << Slurp("err");
  EXPECT_EQ(Run("synth --layers 1000000000 -o " + (dir_ / "t.json").string()), 1);
  EXPECT_NE(Slurp("err").find("1000000000 is more than the 1048576 units a model may have"),
            std::string::npos)
      << Slurp("err");
  EXPECT_EQ(Run("synth --steps 1000000 --microbatches 1000 -o " + (dir_ / "t.json").string()), 1);
  EXPECT_NE(Slurp("err").find("more than the 16777216 a trace may hold"), std::string::npos)
      << Slurp("err");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "t.json"));
}

// A cluster's integers were read with get<int>(), which wraps: 2^32 + 8 ranks read as 8, and a
// segment size of 1e30 was cast to an integer (undefined behaviour).
TEST(ClusterLimits, OutOfRangeNumbersAreRejected) {
  StatusOr<sim::Cluster> wrap = sim::ParseClusterJson(R"({"world_size": 4294967304})");
  ASSERT_FALSE(wrap.ok());
  EXPECT_EQ(wrap.status().message(), "cluster.world_size: 4294967304 is out of range");
  StatusOr<sim::Cluster> neg = sim::ParseClusterJson(R"({"gpus_per_node": -4294967288})");
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().message(), "cluster.gpus_per_node: -4294967288 is out of range");
  StatusOr<sim::Cluster> seg = sim::ParseClusterJson(
      R"({"calibration": {"all_gather": {"intra": [{"min_bytes": 0, "max_bytes": 1e30,
          "latency_us": 1, "bandwidth_GBps": 1}]}}})");
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().message(),
            "cluster.calibration.all_gather.intra[0].max_bytes: 1e+30 is out of range");
  StatusOr<sim::Cluster> version = sim::ParseClusterJson(R"({"version": 4294967297})");
  ASSERT_FALSE(version.ok());  // read as 1 before
}

}  // namespace
}  // namespace fsdplab
