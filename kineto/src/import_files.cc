#include "fsdplab/kineto/import_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"

namespace fsdplab::kineto {
namespace {

// The units of a model file: {"units": [...]} as in a trace (a recorder's trace will do).
StatusOr<Model> ReadModelJson(const std::string& path) {
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("units")) {
    return InvalidInput(
        fmt::format("{}: expected a JSON object with \"units\" (as in a trace)", path));
  }
  nlohmann::json trace = {{"format", "fsdplab.trace"},
                          {"version", 1},
                          {"units", doc["units"]},
                          {"steps", nlohmann::json::array()}};
  StatusOr<Trace> t = ParseTrace(trace.dump());
  if (!t.ok()) return t.status().WithContext(path);
  return std::move(t->model);
}

// The imported trace must be one the simulator replays.
// Everything `fsdplab validate` checks, on the text that will be written.
Status CheckImported(const Trace& trace, const std::string& source) {
  std::vector<Status> problems = ValidateTraceText(WriteTrace(trace));
  if (problems.empty()) problems = CheckTraceStructure(trace);
  if (problems.empty()) return Status::Ok();
  return InvalidInput(
      fmt::format("{}: the imported trace is not replayable ({} problem(s)), first: {}", source,
                  problems.size(), problems.front().message()));
}

}  // namespace

StatusOr<ImportedFiles> ImportProfileFiles(const std::vector<std::string>& files,
                                           ImportOptions options, std::optional<int> only_rank,
                                           const std::optional<std::string>& model_json_path) {
  std::vector<Imported> ranks;
  std::vector<std::string> sources;
  if (model_json_path) {
    FSDP_ASSIGN_OR_RETURN(options.model, ReadModelJson(*model_json_path));
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    FSDP_ASSIGN_OR_RETURN(Profile profile, ReadProfile(files[i]));
    const int rank = profile.rank.value_or(static_cast<int>(i));
    if (only_rank && rank != *only_rank) continue;
    FSDP_ASSIGN_OR_RETURN(Imported im, ImportProfile(profile, options));
    if (!profile.rank) {  // no distributedInfo: the files' order gives the ranks
      im.trace.meta.rank = rank;
      im.trace.meta.world_size = std::max(im.trace.meta.world_size, static_cast<int>(files.size()));
    }
    FSDP_RETURN_IF_ERROR(CheckImported(im.trace, files[i]));
    ranks.push_back(std::move(im));
    sources.push_back(files[i]);
  }
  if (ranks.empty()) {
    return InvalidInput(fmt::format("--rank {}: none of the profiles is that rank's", *only_rank));
  }
  std::vector<std::size_t> order(ranks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranks[a].trace.meta.rank < ranks[b].trace.meta.rank;
  });
  std::vector<Imported> sorted;
  std::vector<std::string> sorted_sources;
  for (std::size_t i : order) {
    sorted.push_back(std::move(ranks[i]));
    sorted_sources.push_back(sources[i]);
  }
  ranks = std::move(sorted);
  sources = std::move(sorted_sources);
  for (std::size_t i = 1; i < ranks.size(); ++i) {
    if (ranks[i].trace.meta.rank == ranks[i - 1].trace.meta.rank) {
      return InvalidInput(fmt::format("{} and {} are both rank {}", sources[i - 1], sources[i],
                                      ranks[i].trace.meta.rank));
    }
  }
  // Every rank of the run given: split each collective into waiting for peers and transfer.
  if (ranks.size() > 1 && static_cast<int>(ranks.size()) == ranks.front().trace.meta.world_size) {
    std::vector<Imported*> ptrs;
    for (Imported& r : ranks) ptrs.push_back(&r);
    FSDP_RETURN_IF_ERROR(SplitCollectiveWaits(ptrs));
  }

  return ImportedFiles{std::move(ranks), std::move(sources)};
}

}  // namespace fsdplab::kineto
