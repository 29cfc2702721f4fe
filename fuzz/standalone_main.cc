// A driver for the fuzz targets without libFuzzer: runs every file named on the command line
// (a directory: every regular file in it, sorted) through LLVMFuzzerTestOneInput once. This is
// how CI replays the corpora and regression inputs, under any compiler and sanitizer.
//
//   fsdplab_fuzz_trace_replay fuzz/corpus/trace fuzz/regressions/trace
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace {

namespace fs = std::filesystem;

bool RunFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return false;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    fs::path p(argv[i]);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s FILE|DIR ... (no input found)\n", argv[0]);
    return 1;
  }
  int bad = 0;
  for (const fs::path& f : files) bad += RunFile(f) ? 0 : 1;
  std::printf("%zu inputs run, %d unreadable\n", files.size(), bad);
  return bad == 0 ? 0 : 1;
}
