// Fuzz target: the Kineto (PyTorch profiler) reader and import (kineto/). Any input must be read
// or rejected without a crash; a profile that imports must give a trace the reader, the event
// checks and the structural checks accept (the simulator can replay it).
#include <string>
#include <string_view>

#include "fsdplab/kineto/kineto.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fsdplab;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<kineto::Profile> profile = kineto::ParseProfile(text, "fuzz.json");
  if (!profile.ok()) {
    FSDP_FUZZ_CHECK(profile.status().code() == StatusCode::kInvalidInput);
    return 0;
  }
  StatusOr<kineto::Imported> im = kineto::ImportProfile(*profile, {});
  if (!im.ok()) {
    FSDP_FUZZ_CHECK(im.status().code() == StatusCode::kInvalidInput);
    return 0;
  }
  const std::string written = WriteTrace(im->trace);
  FSDP_FUZZ_CHECK(ValidateTraceText(written).empty());
  FSDP_FUZZ_CHECK(CheckTraceStructure(im->trace).empty());
  StatusOr<Trace> back = ParseTrace(written);
  FSDP_FUZZ_CHECK(back.ok());
  std::vector<kineto::Imported*> ranks = {&*im, &*im};
  (void)kineto::SplitCollectiveWaits(ranks);
  return 0;
}
