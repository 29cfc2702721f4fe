// A driver for the fuzz targets without libFuzzer, under any compiler and sanitizer (CI's gcc
// builds): runs every file named on the command line (a directory: every regular file in it,
// sorted) through LLVMFuzzerTestOneInput once, and with --mutate, then feeds it mutations of
// those inputs for a time budget.
//
//   fsdplab_fuzz_trace_reader_replay fuzz/corpus/trace_reader fuzz/regressions/trace_reader
//   fsdplab_fuzz_trace_reader_replay --mutate 20 --seed 1
//       --dict fuzz/dict/trace_reader.dict fuzz/corpus/trace_reader
//
// The mutations are blind (no coverage feedback: that is what the libFuzzer build is for) and
// reproducible from the seed: byte flips, erased and duplicated ranges, inserted dictionary
// words, random bytes, splices of two inputs, truncations. When a mutated input crashes (a
// signal, or a sanitizer's report), it is written to crash-<seed>-<n>.bin in the current
// directory before the process dies, to be reduced and added to fuzz/regressions/<target>/.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "fuzz_target.h"

// A sanitizer's runtime, when one is linked, calls this back before it ends the process on a
// report (weak: absent without a sanitizer).
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

// The input being run, for the crash handlers (which may only use async-signal-safe calls).
const Bytes* g_current = nullptr;
char g_crash_path[64] = "";

void WriteCurrent() {
  if (g_current == nullptr || g_crash_path[0] == '\0') return;
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  std::size_t done = 0;
  while (done < g_current->size()) {
    const ssize_t n = ::write(fd, g_current->data() + done, g_current->size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  const char msg[] = "\nfuzz: the crashing input is in ";
  (void)!::write(2, msg, sizeof msg - 1);
  (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
  (void)!::write(2, "\n", 1);
}

extern "C" void OnFatalSignal(int sig) {
  WriteCurrent();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

bool ReadBytes(const fs::path& path, Bytes& out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  out.clear();
  std::uint8_t buf[65536];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  return ok;
}

void Run(const Bytes& bytes) { LLVMFuzzerTestOneInput(bytes.data(), bytes.size()); }

// A libFuzzer/AFL dictionary: one "word" per line (with \\, \" and \xNN escapes), optionally
// name= before it; # starts a comment.
std::vector<Bytes> ReadDict(const fs::path& path, bool& ok) {
  std::vector<Bytes> words;
  std::ifstream in(path);
  ok = static_cast<bool>(in);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t open = line.find('"');
    const std::size_t close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
    Bytes w;
    for (std::size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        const char c = line[++i];
        if (c == 'x' && i + 2 < close) {
          w.push_back(static_cast<std::uint8_t>(std::stoi(line.substr(i + 1, 2), nullptr, 16)));
          i += 2;
        } else {
          w.push_back(static_cast<std::uint8_t>(c));
        }
      } else {
        w.push_back(static_cast<std::uint8_t>(line[i]));
      }
    }
    if (!w.empty()) words.push_back(std::move(w));
  }
  return words;
}

// One to four mutations of `in`, of at most `max_len` bytes.
Bytes Mutate(const Bytes& in, const std::vector<Bytes>& corpus, const std::vector<Bytes>& dict,
             std::mt19937_64& rng, std::size_t max_len) {
  Bytes b = in;
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < rounds; ++k) {
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!b.empty()) b[pick(b.size())] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
        break;
      case 1: {  // set a byte to an interesting value
        static constexpr std::uint8_t kValues[] = {0,   1,   0x7f, 0x80, 0xff, '0', '9', '-', '.',
                                                   'e', '"', ',',  ':',  '{',  '}', '[', ']', ' '};
        if (!b.empty()) b[pick(b.size())] = kValues[pick(sizeof kValues)];
        break;
      }
      case 2: {  // erase a range
        if (b.empty()) break;
        const std::size_t at = pick(b.size());
        const std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - at, 64));
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
                b.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 3: {  // duplicate a range
        if (b.empty()) break;
        const std::size_t at = pick(b.size());
        const std::size_t n = 1 + pick(std::min<std::size_t>(b.size() - at, 64));
        const Bytes part(b.begin() + static_cast<std::ptrdiff_t>(at),
                         b.begin() + static_cast<std::ptrdiff_t>(at + n));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)), part.begin(),
                 part.end());
        break;
      }
      case 4: {  // insert a dictionary word, or random bytes without a dictionary
        Bytes w;
        if (!dict.empty()) {
          w = dict[pick(dict.size())];
        } else {
          w.resize(1 + pick(8));
          for (std::uint8_t& c : w) c = static_cast<std::uint8_t>(rng());
        }
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(pick(b.size() + 1)), w.begin(), w.end());
        break;
      }
      case 5: {  // splice: this input's head, another's tail
        const Bytes& other = corpus[pick(corpus.size())];
        const std::size_t cut = pick(b.size() + 1);
        const std::size_t from = pick(other.size() + 1);
        b.resize(cut);
        b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      default:  // truncate
        b.resize(pick(b.size() + 1));
        break;
    }
  }
  if (b.size() > max_len) b.resize(max_len);
  return b;
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--mutate SECONDS [--seed N] [--dict FILE] [--max-len BYTES]] "
               "FILE|DIR ...\n",
               argv0);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  double mutate_s = 0;
  std::uint64_t seed = 1;
  std::size_t max_len = 65536;
  fs::path dict_path;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--mutate" && has_value) {
      mutate_s = std::atof(argv[++i]);
    } else if (a == "--seed" && has_value) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--dict" && has_value) {
      dict_path = argv[++i];
    } else if (a == "--max-len" && has_value) {
      max_len = std::strtoull(argv[++i], nullptr, 10);
    } else if (a.rfind("--", 0) == 0) {
      return Usage(argv[0]);
    } else {
      fs::path p(a);
      std::error_code ec;
      if (fs::is_directory(p, ec)) {
        for (const auto& e : fs::directory_iterator(p)) {
          if (e.is_regular_file()) files.push_back(e.path());
        }
      } else {
        files.push_back(p);
      }
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "%s: no input found\n", argv[0]);
    return Usage(argv[0]);
  }
  std::vector<Bytes> corpus;
  int bad = 0;
  for (const fs::path& f : files) {
    Bytes b;
    if (!ReadBytes(f, b)) {
      std::fprintf(stderr, "cannot read %s\n", f.c_str());
      ++bad;
      continue;
    }
    Run(b);
    corpus.push_back(std::move(b));
  }
  std::printf("%zu inputs run, %d unreadable\n", files.size(), bad);
  if (bad != 0 || mutate_s <= 0) return bad == 0 ? 0 : 1;

  std::vector<Bytes> dict;
  if (!dict_path.empty()) {
    bool ok = false;
    dict = ReadDict(dict_path, ok);
    if (!ok) {
      std::fprintf(stderr, "cannot read the dictionary %s\n", dict_path.c_str());
      return 1;
    }
  }
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, OnFatalSignal);
  if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(WriteCurrent);
  std::mt19937_64 rng(seed);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(mutate_s));
  std::uint64_t runs = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    for (int k = 0; k < 64; ++k, ++runs) {
      const Bytes b = Mutate(corpus[rng() % corpus.size()], corpus, dict, rng, max_len);
      std::snprintf(g_crash_path, sizeof g_crash_path, "crash-%llu-%llu.bin",
                    static_cast<unsigned long long>(seed), static_cast<unsigned long long>(runs));
      g_current = &b;
      Run(b);
      g_current = nullptr;
    }
  }
  std::printf("%llu mutated inputs run in %.0f s (seed %llu, %zu dictionary words), no crash\n",
              static_cast<unsigned long long>(runs), mutate_s,
              static_cast<unsigned long long>(seed), dict.size());
  return 0;
}
