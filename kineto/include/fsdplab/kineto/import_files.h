// Profiles of an FSDP2 run, one per rank, imported as `fsdplab import-kineto` and the Python
// API's import_kineto() do: each file read and imported (kineto.h), checked to be a trace the
// simulator replays, ordered by rank, and with every rank given, each collective split into
// waiting for peers and transfer.
//
//   FSDP_ASSIGN_OR_RETURN(ImportedFiles r, ImportProfileFiles({"r0.json", "r1.json"}, {}, {}, {}));
//   WriteTrace(r.ranks.front().trace);
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/status.h"
#include "fsdplab/kineto/kineto.h"

namespace fsdplab::kineto {

struct ImportedFiles final {
  std::vector<Imported> ranks;       // by rank
  std::vector<std::string> sources;  // the file of each
};

// `only_rank`: only that rank's profile (a profile without a rank is the file's position).
// `model_json_path`: the units from a file ({"units": [...]} as in a trace) instead of the
// profiles' recorded shapes.
StatusOr<ImportedFiles> ImportProfileFiles(const std::vector<std::string>& files,
                                           ImportOptions options, std::optional<int> only_rank,
                                           const std::optional<std::string>& model_json_path);

}  // namespace fsdplab::kineto
