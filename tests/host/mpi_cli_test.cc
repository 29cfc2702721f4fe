// The commands across processes, run as a user would under mpirun (this binary itself is not
// started by mpirun; each test starts one job): the report and timeline from rank 0, faults on
// one rank, and the launch errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "fsdplab/core/file_util.h"
#include "fsdplab/core/trace.h"
#include "host_test_util.h"

namespace fsdplab::host {
namespace {

using testing::Count;
using testing::ExpectReportAndTimelineOfThreeRanks;
using testing::Result;
using testing::Shell;

// `mpirun -np N fsdplab ARGS`, as root on a machine with fewer cores than ranks.
Result Mpirun(int np, const std::string& args) {
  return Shell(fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 {} -n {} --oversubscribe {} {}",
      FSDPLAB_MPIEXEC, np, FSDPLAB_BIN, args));
}

class MpiCliTest : public testing::CliFixture {
 protected:
  MpiCliTest() : CliFixture("fsdplab_mpi_cli_") {}
};

// Rank 0 alone prints and writes, with every rank's ops in the timeline (pid = rank).
TEST_F(MpiCliTest, RankZeroWritesTheReportWithEveryRank) {
  Result text = Mpirun(3, "run --backend host " + trace_ + " --steps 2");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_EQ(Count(text.out, "Step time:"), 1) << text.out;
  EXPECT_NE(text.out.find("3 ranks as processes (mpirun)"), std::string::npos) << text.out;

  const std::string report = Path("report.json");
  const std::string timeline = Path("timeline.json");
  Result r = Mpirun(
      3, "run --backend host " + trace_ + " --steps 2 -o " + report + " --timeline " + timeline);
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectReportAndTimelineOfThreeRanks(report, timeline);
}

TEST_F(MpiCliTest, ARankThatThrowsStopsEveryRankWithItsPosition) {
  Result r = Mpirun(3, "run --backend host " + trace_ +
                           " --fail-rank 1 --fail-op compute --fail-step 1 --fail-unit "
                           "model.layers.1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("rank 1, step 1, microbatch 0, unit 'model.layers.1', op compute forward: "
                       "exception in compute: injected fault\nevery rank stopped:"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("aborted because rank 1 failed"), std::string::npos) << r.out;
}

TEST_F(MpiCliTest, MismatchedCollectivesAreReportedNotHung) {
  Result r = Mpirun(2, "run --backend host " + trace_ + " --fail-rank 0 --fail-op mismatch");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("rank 0 called reduce_scatter of 'model'"), std::string::npos) << r.out;
}

// A hung rank and a dead one: nobody waits past the timeout (0.5 s here).
TEST_F(MpiCliTest, AHungOrDeadRankEndsTheJobInBoundedTime) {
  Result hang = Mpirun(2, "run --backend host " + trace_ +
                              " --timeout 0.5 --fail-rank 1 --fail-op hang --fail-unit "
                              "model.layers.0");
  EXPECT_EQ(hang.code, 3) << hang.out;
  EXPECT_NE(hang.out.find("timed out after 0.5 s"), std::string::npos) << hang.out;
  EXPECT_LT(hang.seconds, 15.0) << hang.out;
  Result die = Mpirun(2, "run --backend host " + trace_ +
                             " --timeout 0.5 --fail-rank 1 --fail-op die --fail-step 1");
  EXPECT_NE(die.code, 0) << die.out;
  EXPECT_EQ(Count(die.out, "Step time:"), 0) << die.out;
  EXPECT_LT(die.seconds, 15.0) << die.out;
}

// hsdp across processes on a 2 x 2 mesh: rank 0's report has the shard group's collectives
// (per step, 4 reduce-scatters, one per unit, and as many replica all-reduces) and every rank.
TEST_F(MpiCliTest, HsdpWithTwoReplicasRunsAcrossProcesses) {
  const std::string report = Path("report.json");
  Result r = Mpirun(4, "run --backend host " + trace_ +
                           " --sharding hsdp --shard-group-size 2 --steps 2 -o " + report);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Count(r.out, "Step time:"), 1) << r.out;
  StatusOr<std::string> json = ReadFile(report);
  ASSERT_TRUE(json.ok()) << json.status().message();
  const nlohmann::json doc = nlohmann::json::parse(*json);
  ASSERT_EQ(doc["steps"].size(), 2u);
  EXPECT_EQ(doc["steps"][1]["reduce_scatter"]["count"], 4);
  EXPECT_EQ(doc["steps"][1]["all_reduce"]["count"], 4);
  EXPECT_NE(r.out.find("within its shard group of 2 ranks and all-reduces within its replica "
                       "column of 2, each on a sub-group of its own over MPI"),
            std::string::npos)
      << r.out;
}

// The same with rank 3 (shard group 1, replica column 1) killed in step 1: mpirun names it and
// ends the job, ranks 0 and 2 included, within the 2 s timeout (ranks as slow as 4 on 2 cores
// need more than 0.5 s for the checked first step), and no rank reports a step.
TEST_F(MpiCliTest, ADeadRankOfOneReplicaEndsTheHsdpJobInBoundedTime) {
  Result r = Mpirun(4, "run --backend host " + trace_ +
                           " --sharding hsdp --shard-group-size 2 --timeout 2 --fail-rank 3 "
                           "--fail-op die --fail-step 1");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("process rank 3 with PID"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited on signal 9"), std::string::npos) << r.out;
  EXPECT_EQ(Count(r.out, "Step time:"), 0) << r.out;
  EXPECT_LT(r.seconds, 15.0) << r.out;
}

// One process per rank, one table from rank 0, every element checked on every rank.
TEST_F(MpiCliTest, BenchGatherAcrossProcesses) {
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    SCOPED_TRACE(op);
    const std::string json = Path(std::string(op) + ".json");
    Result r = Mpirun(3, fmt::format("bench-gather --backend host -b 96K -e 384K -f 4 -n 3 -w 1 "
                                     "--op {} -J {}",
                                     op, json));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(Count(r.out, "# fsdplab bench-gather:"), 1) << r.out;
    StatusOr<std::string> text = ReadFile(json);
    ASSERT_TRUE(text.ok()) << text.status().message();
    const nlohmann::json doc = nlohmann::json::parse(*text);
    EXPECT_EQ(doc["world_size"], 3);
    ASSERT_EQ(doc["rows"].size(), 2u);  // 96K and 384K
    for (const auto& row : doc["rows"]) {
      EXPECT_EQ(row["wrong"], 0);
      EXPECT_GT(row["time_us"].get<double>(), 0.0);
    }
  }
  Result both = Mpirun(2, "bench-gather --backend host -b 64K -e 64K -n 3 -w 1 --op concurrent");
  ASSERT_EQ(both.code, 0) << both.out;
  EXPECT_NE(both.out.find("2 ranks"), std::string::npos) << both.out;
}

TEST_F(MpiCliTest, LaunchErrorsNameTheVariables) {
  // torchrun's variables disagreeing with mpirun's.
  Result conflict = Shell("RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 " +
                          fmt::format("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                                      "{} -n 2 --oversubscribe {} run --backend host {}",
                                      FSDPLAB_MPIEXEC, FSDPLAB_BIN, trace_));
  EXPECT_EQ(conflict.code, 2) << conflict.out;
  EXPECT_NE(conflict.out.find("conflicting launchers: mpirun (OMPI_COMM_WORLD_RANK=1 "
                              "OMPI_COMM_WORLD_SIZE=2"),
            std::string::npos)
      << conflict.out;
  // A partial torchrun launch.
  Result partial = Shell(fmt::format("RANK=1 {} run --backend host {}", FSDPLAB_BIN, trace_));
  EXPECT_EQ(partial.code, 2) << partial.out;
  EXPECT_NE(partial.out.find("torchrun launch is incomplete: WORLD_SIZE, MASTER_ADDR, "
                             "MASTER_PORT not set"),
            std::string::npos)
      << partial.out;
  // die needs one process per rank.
  Result die = Shell(
      fmt::format("{} run --backend host {} --fail-rank 0 --fail-op die", FSDPLAB_BIN, trace_));
  EXPECT_EQ(die.code, 1) << die.out;
}

}  // namespace
}  // namespace fsdplab::host
