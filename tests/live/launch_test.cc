// Launcher detection: every launcher's variables, the closest launcher winning over Slurm's, and
// the errors for partial or conflicting variables (each names the variables).
#include "fsdplab/live/launch.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace fsdplab {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(DetectLaunch, NoVariablesIsOneProcess) {
  StatusOr<LaunchInfo> l = DetectLaunch(Env({{"SLURM_NTASKS", "4"}}));  // a plain salloc shell
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->launcher, Launcher::kNone);
  EXPECT_FALSE(l->multi_process());
}

TEST(DetectLaunch, EachLauncherIsRead) {
  StatusOr<LaunchInfo> mpi = DetectLaunch(Env({{"OMPI_COMM_WORLD_RANK", "2"},
                                               {"OMPI_COMM_WORLD_SIZE", "3"},
                                               {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}));
  ASSERT_TRUE(mpi.ok()) << mpi.status().message();
  EXPECT_EQ(mpi->launcher, Launcher::kMpi);
  EXPECT_EQ(mpi->rank, 2);
  EXPECT_EQ(mpi->world_size, 3);
  EXPECT_EQ(mpi->local_rank, 2);

  StatusOr<LaunchInfo> hydra = DetectLaunch(Env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}));
  ASSERT_TRUE(hydra.ok()) << hydra.status().message();
  EXPECT_EQ(hydra->launcher, Launcher::kMpi);
  EXPECT_EQ(hydra->rank, 1);
  EXPECT_EQ(hydra->local_rank, -1);

  StatusOr<LaunchInfo> torch = DetectLaunch(Env({{"RANK", "1"},
                                                 {"WORLD_SIZE", "4"},
                                                 {"LOCAL_RANK", "1"},
                                                 {"MASTER_ADDR", "node0"},
                                                 {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(torch.ok()) << torch.status().message();
  EXPECT_EQ(torch->launcher, Launcher::kTorchrun);
  EXPECT_EQ(torch->rank, 1);
  EXPECT_EQ(torch->world_size, 4);
  EXPECT_EQ(torch->master_addr, "node0");
  EXPECT_EQ(torch->master_port, 29500);
  EXPECT_EQ(torch->rendezvous_port, 29501);  // torchrun's own store holds MASTER_PORT

  StatusOr<LaunchInfo> own = DetectLaunch(Env({{"FSDPLAB_RANK", "0"},
                                               {"FSDPLAB_WORLD_SIZE", "2"},
                                               {"FSDPLAB_MASTER_ADDR", "h"},
                                               {"FSDPLAB_MASTER_PORT", "1"}}));
  ASSERT_TRUE(own.ok()) << own.status().message();
  EXPECT_EQ(own->launcher, Launcher::kFsdplab);
  EXPECT_EQ(own->rendezvous_port, 1);

  StatusOr<LaunchInfo> srun =
      DetectLaunch(Env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}}));
  ASSERT_TRUE(srun.ok()) << srun.status().message();
  EXPECT_EQ(srun->launcher, Launcher::kSlurm);
  EXPECT_EQ(srun->rank, 5);
  EXPECT_EQ(srun->world_size, 8);
  EXPECT_EQ(srun->local_rank, 1);
}

// mpirun inside an sbatch script: every rank inherits the batch task's SLURM_PROCID=0; torchrun
// under srun: SLURM_PROCID is the node's torchrun, RANK the worker. The closer launcher wins.
TEST(DetectLaunch, TheClosestLauncherWinsOverSlurm) {
  StatusOr<LaunchInfo> mpi = DetectLaunch(Env({{"OMPI_COMM_WORLD_RANK", "1"},
                                               {"OMPI_COMM_WORLD_SIZE", "2"},
                                               {"SLURM_PROCID", "0"},
                                               {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(mpi.ok()) << mpi.status().message();
  EXPECT_EQ(mpi->launcher, Launcher::kMpi);
  EXPECT_EQ(mpi->rank, 1);
  StatusOr<LaunchInfo> torch = DetectLaunch(Env({{"RANK", "6"},
                                                 {"WORLD_SIZE", "8"},
                                                 {"MASTER_ADDR", "n0"},
                                                 {"MASTER_PORT", "29500"},
                                                 {"SLURM_PROCID", "1"},
                                                 {"SLURM_NTASKS", "2"}}));
  ASSERT_TRUE(torch.ok()) << torch.status().message();
  EXPECT_EQ(torch->launcher, Launcher::kTorchrun);
  EXPECT_EQ(torch->rank, 6);
}

TEST(DetectLaunch, PartialVariablesAreNamed) {
  StatusOr<LaunchInfo> torch = DetectLaunch(Env({{"RANK", "0"}, {"MASTER_PORT", "29500"}}));
  ASSERT_FALSE(torch.ok());
  EXPECT_EQ(torch.status().code(), StatusCode::kInvalidInput);
  EXPECT_EQ(torch.status().message(),
            "torchrun launch is incomplete: WORLD_SIZE, MASTER_ADDR not set (set: RANK=0 "
            "MASTER_PORT=29500); a torchrun launch needs RANK, WORLD_SIZE, MASTER_ADDR and "
            "MASTER_PORT");
  StatusOr<LaunchInfo> srun = DetectLaunch(Env({{"SLURM_PROCID", "0"}}));
  ASSERT_FALSE(srun.ok());
  EXPECT_EQ(srun.status().message().rfind("srun launch is incomplete: SLURM_NTASKS not set", 0), 0u)
      << srun.status().message();
  StatusOr<LaunchInfo> local = DetectLaunch(Env({{"LOCAL_RANK", "0"}}));
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.status().message().find("RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"),
            std::string::npos)
      << local.status().message();
}

TEST(DetectLaunch, BadValuesAreNamed) {
  StatusOr<LaunchInfo> rank =
      DetectLaunch(Env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
  ASSERT_FALSE(rank.ok());
  EXPECT_EQ(rank.status().message(), "OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2");
  StatusOr<LaunchInfo> word = DetectLaunch(
      Env({{"RANK", "one"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}));
  ASSERT_FALSE(word.ok());
  EXPECT_EQ(word.status().message(), "RANK='one' is not an integer");
  StatusOr<LaunchInfo> port = DetectLaunch(
      Env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}));
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().message(), "MASTER_PORT=70000 is out of range [1, 65535]");
}

TEST(DetectLaunch, ConflictingLaunchersAreNamed) {
  StatusOr<LaunchInfo> l = DetectLaunch(Env({{"OMPI_COMM_WORLD_RANK", "1"},
                                             {"OMPI_COMM_WORLD_SIZE", "2"},
                                             {"RANK", "0"},
                                             {"WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "h"},
                                             {"MASTER_PORT", "1"}}));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().message(),
            "conflicting launchers: mpirun (OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2) says "
            "rank 1 of 2, but torchrun (RANK=0 WORLD_SIZE=2 MASTER_ADDR=h MASTER_PORT=1) says "
            "rank 0 of 2; unset the variables of the one that did not start this process");
  // The same rank from two launchers is no conflict.
  StatusOr<LaunchInfo> same = DetectLaunch(Env({{"RANK", "1"},
                                                {"WORLD_SIZE", "2"},
                                                {"MASTER_ADDR", "h"},
                                                {"MASTER_PORT", "1"},
                                                {"FSDPLAB_RANK", "1"},
                                                {"FSDPLAB_WORLD_SIZE", "2"},
                                                {"FSDPLAB_MASTER_ADDR", "h"},
                                                {"FSDPLAB_MASTER_PORT", "1"}}));
  ASSERT_TRUE(same.ok()) << same.status().message();
  EXPECT_EQ(same->launcher, Launcher::kTorchrun);
}

}  // namespace
}  // namespace fsdplab
