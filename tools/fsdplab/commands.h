// The fsdplab subcommands. Each takes the arguments after its name and returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace fsdplab::cli {

using Argv = std::vector<std::string>;

int RunValidate(const Argv& argv);
int RunOrder(const Argv& argv);
int RunSchedule(const Argv& argv);
int RunSimulate(const Argv& argv);
int RunSweep(const Argv& argv);
int RunTune(const Argv& argv);
int RunCalibrate(const Argv& argv);
int RunCost(const Argv& argv);
int RunSynth(const Argv& argv);
int RunLive(const Argv& argv, bool record);  // `run` and `record`
int RunCompare(const Argv& argv);
int RunReport(const Argv& argv);
int RunBenchGather(const Argv& argv);
int RunImportKineto(const Argv& argv);
int RunExportPolicy(const Argv& argv);
int RunImportPolicy(const Argv& argv);

}  // namespace fsdplab::cli
