// Internal to the simulator: which ranks are simulated. Ranks that would run identical timelines
// form rank classes and are simulated once (RankClasses); with SimOptions::prune_ranks, only the
// classes that can be the last to reach a collective, and those the timeline keeps, are
// simulated at all (PruneRanks). Both are exact; see docs/design.md, "Rank classes" and
// "Distinct ranks at scale".
#pragma once

#include <string>
#include <vector>

#include "fsdplab/sim/simulator.h"
#include "fsdplab/sim/variability.h"
#include "program.h"

namespace fsdplab::sim {

// A class of ranks simulated as one: the same program (trace) at the same compute speed, and
// under hsdp the same place in the mesh where that matters.
struct RankClass {
  int program = 0;      // index into the programs
  double factor = 1;    // compute scale x straggler factors x the rank's own scale
  bool varies = false;  // its speed changes from step to step (StepFactors; a class of one rank)
  int first_rank = 0;   // the rank that stands for the class
  int members = 0;
  int row = 0;     // its collective group on the communication streams (shard group key)
  int column = 0;  // its group on the all-reduce stream (replica column key)
};

struct RankClassing {
  std::vector<RankClass> classes;
  int rows_split = 0;     // hsdp: shard groups that hold a rank unlike the common one
  int columns_split = 0;  // hsdp: replica columns that do
};

// The classes of `world` ranks, ordered by their first rank (see rank_classes.cc).
RankClassing RankClasses(const SimOptions& options, const StepFactors& step_factors, int world,
                         bool one_trace, int shard_group);

// The note that lists the classes.
std::string ClassesNote(const RankClassing& classing, int world, int recorded, int shard_group);

// Class c's compute factor in step `step` (its factor times its per-step factor).
double ClassFactor(const RankClass& c, const StepFactors& step_factors, int step);

// Per step, the largest and smallest compute factor over the classes, and the class with the
// largest (the lowest first rank on ties).
struct StepSpeeds {
  std::vector<double> slowest;
  std::vector<double> fastest;
  std::vector<int> slowest_class;
};
StepSpeeds ComputeStepSpeeds(const RankClassing& classing, const StepFactors& step_factors,
                             int steps);

// What PruneRanks decided.
struct PrunedRanks {
  bool pruned = false;
  std::vector<int> classes;  // the classes to simulate, ascending (when pruned)
  // zero3 with per-step variation and no class slowest in every step: the upper envelope of
  // the classes' per-step compute factors (empty: none), simulated as one more rank that stands
  // for none; every step's slowest class is simulated, and at no collective may the envelope
  // arrive after all of them (checked by the engine).
  std::vector<double> envelope;
  // hsdp: every simulated rank meets in one all-reduce group, and the simulated ranks of each
  // shard group must reach every all-reduce at the same time (checked by the engine).
  bool one_all_reduce_group = false;
  std::string note;  // what was simulated and why it is exact, or why nothing was pruned
};

// The classes that must be simulated for every result to be what simulating all of them gives.
// `programs`: each class's program (by RankClass::program).
PrunedRanks PruneRanks(const RankClassing& classing, const std::vector<const SimProgram*>& programs,
                       const SimOptions& options, const StepFactors& step_factors,
                       const StepSpeeds& speeds, bool one_trace, int world, int shard_group,
                       int steps);

}  // namespace fsdplab::sim
