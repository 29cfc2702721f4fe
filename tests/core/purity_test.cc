// The core is the plan (DESIGN §3): no clock, no thread, no socket, no process environment and
// no device. Every source under core/ is read and each line that includes such a header or calls
// such a function is a finding; the core must have none. Clocks, threads and sockets belong to
// live/ and the backends, the process environment to live/launch.h.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fsdplab {
namespace {

// What the core may not use: headers by name, and calls by their spelling in the source.
const std::regex& ForbiddenInclude() {
  static const std::regex re(
      R"(^\s*#\s*include\s*<(thread|mutex|shared_mutex|condition_variable|future|semaphore|latch|)"
      R"(barrier|stop_token|chrono|ctime|time\.h|sys/time\.h|sys/socket\.h|netinet/[^>]*|)"
      R"(arpa/inet\.h|netdb\.h|poll\.h|sys/epoll\.h|sys/select\.h|cuda[^>]*|nccl\.h|cublas[^>]*)>)");
  return re;
}
const std::regex& ForbiddenCall() {
  static const std::regex re(
      R"(\b(std::this_thread|std::chrono|std::thread|std::jthread|std::async|getenv|secure_getenv|)"
      R"(setenv|putenv|environ|clock_gettime|gettimeofday|socket|cuda[A-Z]\w*|nccl[A-Z]\w*)\s*[:(])");
  return re;
}

// "file:line: text" for every forbidden line of `text`. Comments are skipped (they may name
// what the core does not do).
std::vector<std::string> Findings(const std::string& name, const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::size_t first = line.find_first_not_of(" \t");
    if (first != std::string::npos && line.compare(first, 2, "//") == 0) continue;
    if (std::regex_search(line, ForbiddenInclude()) || std::regex_search(line, ForbiddenCall())) {
      out.push_back(name + ":" + std::to_string(n) + ": " + line);
    }
  }
  return out;
}

TEST(CorePurity, NoSourceOfTheCoreUsesClocksThreadsSocketsEnvironmentOrDevices) {
  const std::filesystem::path core = FSDPLAB_CORE_DIR;
  std::vector<std::string> findings;
  int files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(core)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".h" && ext != ".cc" && ext != ".cu")) continue;
    std::ifstream f(entry.path());
    std::stringstream text;
    text << f.rdbuf();
    ++files;
    for (std::string& s : Findings(entry.path().lexically_relative(core).string(), text.str())) {
      findings.push_back(std::move(s));
    }
  }
  EXPECT_GT(files, 20) << "the core's sources were not found under " << core;
  for (const std::string& s : findings) ADD_FAILURE() << s;
}

// The check itself: each kind of use is found, and only where it is used.
TEST(CorePurity, TheCheckFindsEachKindOfUse) {
  const std::string text =
      "#include <thread>\n"                               // 1: a thread
      "#include <chrono>\n"                               // 2: clocks
      "#include <sys/socket.h>\n"                         // 3: a socket
      "#include <cuda_runtime.h>\n"                       // 4: a device
      "  const char* v = std::getenv(\"RANK\");\n"        // 5: the environment
      "  auto t = std::chrono::steady_clock::now();\n"    // 6: a clock
      "  // std::thread in a comment is not a use\n"      // 7
      "#include <vector>\n"                               // 8
      "  int threads = 2;  // a name is not a thread\n";  // 9
  const std::vector<std::string> f = Findings("x.cc", text);
  ASSERT_EQ(f.size(), 6u);
  for (int line = 1; line <= 6; ++line) {
    EXPECT_EQ(f[static_cast<std::size_t>(line - 1)].rfind("x.cc:" + std::to_string(line) + ":", 0),
              0u)
        << f[static_cast<std::size_t>(line - 1)];
  }
}

}  // namespace
}  // namespace fsdplab
