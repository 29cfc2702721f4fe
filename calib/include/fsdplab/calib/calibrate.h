// A calibration as `fsdplab calibrate` and the Python API's calibrate() make it: nccl-tests
// outputs read (nccl_tests.h), grouped by collective and tier, each group fitted (calibration.h),
// and the communication contention of `fsdplab bench-gather --op concurrent` added; the cluster
// file, the text report and the JSON document built once here.
//
//   CalibrateInputs in;  in.files = {"all_gather_perf.txt"};
//   FSDP_ASSIGN_OR_RETURN(Calibration c, Calibrate(in));
//   WriteFileAtomic("cluster.json", c.cluster_json);
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fsdplab/calib/calibration.h"
#include "fsdplab/calib/nccl_tests.h"
#include "fsdplab/core/status.h"

namespace fsdplab::calib {

struct CalibrateInputs final {
  std::vector<std::string> files;  // nccl-tests outputs (or bench-gather's)
  NcclTestsOptions parse;          // ranks, collective, block when a file does not say them
  std::optional<TierKind> tier;    // else inferred per block (InferTier)
  FitOptions fit;
  double compute_scale = 1.0;
  std::optional<int> gpus_per_node;  // else the outputs' device lists, else 8
  std::optional<std::string> contention_file;
};

struct Calibration final {
  CalibratedCluster cluster;
  std::string cluster_json;  // the cluster file (CalibratedClusterJson)
  std::string text;          // the fits and notes, for people
  // {"fits", "notes", "comm_contention"?, "cluster"}: `--json` prints it indented by 2, the
  // Python API returns it as a dict.
  nlohmann::ordered_json doc;
};

StatusOr<Calibration> Calibrate(const CalibrateInputs& inputs);

}  // namespace fsdplab::calib
