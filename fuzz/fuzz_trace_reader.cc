// Fuzz target: the trace reader (trace/src/trace_reader.cc). Any input must be read or rejected
// without a crash; what is read must write and read back as the same trace, and the collecting
// validator must agree with the reader on whether the text is valid.
#include <string>
#include <string_view>

#include "fsdplab/trace/trace_io.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fsdplab;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<Trace> trace = ParseTrace(text);
  const std::vector<Status> problems = ValidateTraceText(text);
  FSDP_FUZZ_CHECK(trace.ok() == problems.empty());
  if (!trace.ok()) return 0;
  FSDP_FUZZ_CHECK(CheckTraceEvents(*trace).empty());
  const std::string written = WriteTrace(*trace);
  StatusOr<Trace> back = ParseTrace(written);
  FSDP_FUZZ_CHECK(back.ok());
  FSDP_FUZZ_CHECK(SameTrace(*trace, *back));
  FSDP_FUZZ_CHECK(WriteTrace(*back) == written);
  return 0;
}
