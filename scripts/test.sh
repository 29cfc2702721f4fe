#!/usr/bin/env bash
# The whole test suite: set up, build with warnings as errors, run every test (C++ and the
# PyTorch recorder's, under Debian's torch 1.13 and under torch 2.x), the host executor's tests
# under ThreadSanitizer, the core, sim, inputs and host tests and the fuzz corpora under
# AddressSanitizer + UBSan, and the format check.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Also torch 2.x (cached outside the clone): the recorder's tests run under Debian's 1.13 and 2.x.
torch2_python="$(bash scripts/setup.sh --torch2)"
jobs="$(nproc)"

echo "== format check (clang-format) =="
git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror

echo "== build (Release, -Werror) =="
cmake --preset default -DFSDPLAB_TORCH2_PYTHON="$torch2_python" >/dev/null
cmake --build --preset default -j"$jobs"

echo "== tests =="
ctest --preset default -j"$jobs"

echo "== host executor under ThreadSanitizer =="
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j"$jobs" --target fsdplab_host_tests
ctest --preset tsan -j"$jobs"

echo "== core, sim, inputs, host and fuzz corpora under AddressSanitizer + UBSan =="
cmake --preset asan >/dev/null
cmake --build --preset asan -j"$jobs"
ctest --preset asan -j"$jobs"
