#!/usr/bin/env bash
# Rank classes at scale: `fsdplab simulate` of a Llama-3-70B-shaped synthetic trace (80 layers,
# hidden 8192, MLP 28672, 64 heads, 8 k/v heads, vocabulary 128256, bf16) for 3 steps at
# 131,072 ranks (16,384 nodes x 8 GPUs, the default tiers), on one core, with wall time and max
# RSS from /usr/bin/time -v:
#   1. four straggler ranks (5 rank classes: target under 2 s and 1 GB resident);
#   2. the same under HSDP (sharding hsdp, shard groups of 8 and of 64 ranks): a straggler
#      splits only its shard group and its replica column, so 4 stragglers make at most
#      (4 + 1) x (4 + 1) classes (target under 2 s and 1 GB resident);
#   3. every rank a compute speed of its own (--rank-jitter 0.02:1: 131,072 classes), with
#      --prune-ranks (only the slowest rank and the timeline's are simulated; target under 30 s
#      and 4 GB). Skipped unless ALL_DISTINCT=1; bench/distinct_ranks.sh has the scaling table.
#
#   bench/rank_classes.sh [BUILD_DIR] [WORLD]       # WORLD default 131072
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
world="${2:-131072}"
f="$build/tools/fsdplab"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$f" synth --layers 80 --hidden 8192 --ffn 28672 --heads 64 --kv-heads 8 --vocab 128256 \
  --steps 3 --world-size "$world" -o "$work/llama70b.json"

measure() {
  local label="$1"
  shift
  echo
  echo "== $label =="
  taskset -c 0 /usr/bin/time -v "$f" simulate "$work/llama70b.json" --world-size "$world" \
    --steps 3 "$@" >"$work/out.txt" 2>"$work/time.txt" || true
  grep -E '^(Step time|Peak memory)' "$work/out.txt" || tail -3 "$work/out.txt"
  grep -E 'rank classes|folded' "$work/out.txt" | head -2 | cut -c1-400 || true
  grep -E 'Elapsed \(wall|Maximum resident' "$work/time.txt"
}

stragglers=(--straggler 5:1.1 --straggler 70000:1.2 --straggler 100001:1.05
  --straggler 131071:1.1)
measure "4 stragglers" "${stragglers[@]}"
for group in 8 64; do
  measure "4 stragglers, hsdp with shard groups of $group" "${stragglers[@]}" \
    --sharding hsdp --shard-group-size "$group"
done
if [[ "${ALL_DISTINCT:-0}" == 1 ]]; then
  measure "every rank distinct (--rank-jitter 0.02:1 --prune-ranks)" --rank-jitter 0.02:1 \
    --prune-ranks --timeline-ranks 1
fi
