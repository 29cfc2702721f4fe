// The entry point every fuzz target defines (libFuzzer's). Built two ways (fuzz/CMakeLists.txt):
// with clang's -fsanitize=fuzzer for fuzzing, or linked with standalone_main.cc, which runs
// files through it (the corpus replay CI does; builds under gcc too).
//
//   extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
//     std::string_view text(reinterpret_cast<const char*>(data), size);
//     ...;         // must not crash, hang or grow memory out of proportion
//     return 0;
//   }
//
// FSDP_FUZZ_CHECK(cond) aborts (a crash the fuzzer reports) when an invariant of the code under
// test fails, such as a trace that does not read back the same after writing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

#define FSDP_FUZZ_CHECK(cond)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
