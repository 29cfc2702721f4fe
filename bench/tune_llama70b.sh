#!/usr/bin/env bash
# `fsdplab tune` on a Llama-3-70B-shaped synthetic trace (80 layers, hidden 8192, MLP 28672, 64
# heads, 8 k/v heads, vocabulary 128256; every other layer MXFP8 and recomputed inside its
# backward, the others bf16 without recompute) at
# 1,024 ranks (128 nodes x 8 GPUs, the default tiers), under a memory cap that rules out the
# fastest global policy. Prints the sweep of the global budgets (to show which the cap rules out),
# then tune's result: policies evaluated per second, the tuned policy's gain over the best global
# policy under the same cap (or the bound that says none can be 5% faster), and why.
#
#   bench/tune_llama70b.sh [BUILD_DIR] [CAP]        # CAP default 38000M (37.1 GiB); TIME_LIMIT (s) default 8
#
# One core: tune runs single-threaded (sweep is given --jobs 1 here too).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
cap="${2:-38000M}"
f="$build/tools/fsdplab"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$f" synth --layers 80 --hidden 8192 --ffn 28672 --heads 64 --kv-heads 8 --vocab 128256 \
  --dtype mxfp8 --recompute inside --dtype-recompute-every 2 --world-size 1024 -o "$work/llama70b.json"
echo
echo "== the global policies (sweep, memory cap $cap) =="
"$f" sweep "$work/llama70b.json" --world-size 1024 --unshard-all-planes-in-backward all \
  --forward-prefetch 0,1,2 --backward-prefetch 0,1,2 --memory-cap "$cap" --jobs 1
echo
echo "== tune (one core, time limit ${TIME_LIMIT:-8} s) =="
taskset -c 0 /usr/bin/time -f "tune: %e s wall, %U s user, %M KiB max RSS" \
  "$f" tune "$work/llama70b.json" --world-size 1024 --memory-cap "$cap" \
  --time-limit "${TIME_LIMIT:-8}" --out "$work/tuned.json"
echo
echo "== the tuned policy, simulated from its file (--policy) =="
"$f" simulate "$work/llama70b.json" --world-size 1024 --policy "$work/tuned.json" |
  grep -E '^(Step time|Exposed comm|Peak memory)'
