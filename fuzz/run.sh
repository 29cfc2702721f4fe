#!/usr/bin/env bash
# Fuzzes one target with libFuzzer for a time budget, from the checked-in corpus plus a scratch
# corpus (new inputs go to the scratch one; fuzz/corpus stays a small reviewed seed set).
#
#   cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DFSDPLAB_FUZZ=ON \
#     -DFSDPLAB_SANITIZE=address,undefined -DFSDPLAB_BUILD_TESTS=OFF -DFSDPLAB_ENABLE_CUDA=OFF
#   cmake --build build-fuzz --target fsdplab_fuzz_trace_reader
#   fuzz/run.sh trace_reader 600 [build-fuzz] [extra libFuzzer flags...]
#
# A crash leaves crash-*/timeout-*/oom-* files in the current directory: reduce it, add it to
# fuzz/regressions/<target>/ and a GoogleTest case with the expected behaviour.
set -euo pipefail
target="$1"
seconds="${2:-60}"
build="${3:-build-fuzz}"
shift $(( $# < 3 ? $# : 3 ))
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
scratch="${FUZZ_SCRATCH:-$root/$build/fuzz-corpus}/$target"
mkdir -p "$scratch"
"$root/$build/fuzz/fsdplab_fuzz_$target" "$scratch" "$root/fuzz/corpus/$target" \
  -dict="$root/fuzz/dict/$target.dict" -max_total_time="$seconds" -max_len=65536 \
  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$@"
