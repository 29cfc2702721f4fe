// Fuzz target: the command-line parser (tools/fsdplab/args.cc) with the policy flags of
// cli_common.cc, as the subcommands declare them. The input is argv, NUL-separated.
#include <string>
#include <string_view>
#include <vector>

#include "args.h"
#include "cli_common.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/size_text.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fsdplab;
  using namespace fsdplab::cli;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> argv;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find('\0', start);
    if (end == std::string_view::npos) end = text.size();
    argv.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }

  Args args(argv);
  args.Declare("--json", ArgKind::kSwitch, "json");
  args.Declare("-o", ArgKind::kValue, "out");
  args.Declare("--steps", ArgKind::kValue, "steps");
  args.Declare("--straggler", ArgKind::kRepeated, "straggler");
  DeclarePolicyFlags(args);
  if (!args.Parse().ok()) return 0;
  (void)args.Has("--json");
  (void)args.GetAll("--straggler");
  (void)args.FlagHelp();
  for (const auto& [flag, value] : args.Given()) {
    (void)ParseSize(value, flag);
    (void)ParseInt(value, flag);
    (void)ParseDouble(value, flag);
    (void)ParseBool(value, flag);
    (void)fsdplab::ParseSize(value);
  }
  // The policy flags against a two-unit model; --policy names a file, which a fuzzer must not
  // open (it could name /dev/zero), so inputs that give it stop here.
  if (args.Get("--policy")) return 0;
  // No steps: a --preset that needs the recorded order (deepspeed-zero3) gets an error value.
  static const Trace trace = [] {
    ModelBuilder b;
    b.AddUnit("model", std::nullopt, {{"w", DType::kBf16, {64, 64}, std::nullopt}});
    b.AddUnit("model.layers.0", std::string("model"),
              {{"w", DType::kMxfp8, {64, 64}, std::nullopt}});
    Trace t;
    t.model = *std::move(b).Build();
    return t;
  }();
  (void)PolicyFromArgs(args, trace);
  std::vector<std::string> varied;
  (void)PolicyGridFromArgs(args, trace, &varied);
  return 0;
}
