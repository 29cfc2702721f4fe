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
#include "fsdplab/core/trace.h"
#include "fsdplab/sim/calibration.h"

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
  StatusOr<std::vector<sim::Segment>> intra =
      sim::ReadCalibrationSegments(*text, CollectiveKind::kAllGather, sim::TierKind::kIntra);
  StatusOr<std::vector<sim::Segment>> inter =
      sim::ReadCalibrationSegments(*text, CollectiveKind::kAllGather, sim::TierKind::kInter);
  ASSERT_TRUE(intra.ok() && inter.ok());
  EXPECT_FALSE(intra->empty());
  EXPECT_FALSE(inter->empty());  // 16 ranks, no device list, 8 per node: spans nodes
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

}  // namespace
}  // namespace fsdplab
