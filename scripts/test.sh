#!/usr/bin/env bash
# The whole test suite: set up, build with warnings as errors, run every test (C++ and the
# PyTorch recorder's, under Debian's torch 1.13 and under torch 2.x), the Python package built
# as a wheel and tested in fresh virtual environments (scripts/test_python.sh), the host
# executor's tests under ThreadSanitizer, the core, trace, report, live, sim, inputs and host
# tests and the fuzz corpora under AddressSanitizer + UBSan, and the format check. The sanitizer builds keep line
# numbers in every report (-g1) and compile at the level that is cheapest in build plus test time
# (the presets): TSan at -O1; ASan + UBSan at -Og, as UBSan's checks nearly double a test file's
# compile at -O1.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Also torch 2.x (cached outside the clone): the recorder's tests run under Debian's 1.13 and 2.x.
torch2_python="$(bash scripts/setup.sh --torch2)"
jobs="$(nproc)"
# Each phase's wall time, printed when the next begins and at the end: the suite must stay well
# under CI's limit, and the builds, not the tests, take most of it.
phase_name=""
phase_start=$SECONDS
phase() {
  [ -n "$phase_name" ] && echo "-- $phase_name: $((SECONDS - phase_start)) s"
  phase_name="$1"
  phase_start=$SECONDS
  [ -n "$1" ] && echo "== $1 =="
  return 0
}

phase "format check (clang-format)"
git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror

phase "build (Release, -Werror)"
cmake --preset default -DFSDPLAB_TORCH2_PYTHON="$torch2_python" >/dev/null
cmake --build --preset default -j"$jobs"

phase "tests"
ctest --preset default -j"$jobs"

phase "Python package: wheel from a clean checkout, API tests under Debian's python3 and torch 2.x"
bash scripts/test_python.sh "$torch2_python"

phase "host executor under ThreadSanitizer"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j"$jobs" --target fsdplab_host_tests
ctest --preset tsan -j"$jobs"

phase "core, trace, report, live, sim, inputs, host and fuzz corpora under AddressSanitizer + UBSan"
cmake --preset asan >/dev/null
# Only what the asan test preset runs (its labels): the suites' binaries and the fuzz replays.
cmake --build --preset asan -j"$jobs" --target fsdplab_core_tests fsdplab_trace_tests \
  fsdplab_report_tests fsdplab_live_tests fsdplab_sim_tests \
  fsdplab_inputs_tests fsdplab_host_tests fsdplab_fuzz_trace_reader_replay \
  fsdplab_fuzz_policy_cluster_replay fsdplab_fuzz_nccl_tests_replay fsdplab_fuzz_kineto_replay \
  fsdplab_fuzz_args_replay
ctest --preset asan -j"$jobs"
phase ""
echo "-- whole suite: $SECONDS s"
