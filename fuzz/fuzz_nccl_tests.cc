// Fuzz target: the nccl-tests output parser (calib/src/nccl_tests.cc, nccl_tests_json.cc), on
// text and JSON logs alike: every block, then the blocks the cost model knows.
#include <string>
#include <string_view>
#include <vector>

#include "fsdplab/calib/nccl_tests.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fsdplab;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)calib::SplitNcclTests(text, "fuzz");
  std::vector<std::string> notes;
  auto blocks = calib::ParseNcclTestsBlocks(text, "fuzz", {}, &notes);
  if (blocks.ok()) FSDP_FUZZ_CHECK(!blocks->empty());
  (void)calib::ParseNcclTests(text, "fuzz");
  return 0;
}
