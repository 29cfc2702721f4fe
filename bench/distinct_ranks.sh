#!/usr/bin/env bash
# Every rank a compute speed of its own, at scale: `fsdplab simulate` of a Llama-3-70B-shaped
# synthetic trace (80 layers, hidden 8192, MLP 28672, 64 heads, 8 k/v heads, vocabulary 128256,
# bf16; default tiers, 8 GPUs per node) on one core (taskset -c 0), with wall time, CPU time
# (user + sys) and max RSS from /usr/bin/time -v. Rows, for WORLD in 1K, 4K, 16K, 64K, 131K:
#   zero3   one step, --rank-jitter 0.05:1 (every rank distinct), --prune-ranks
#           (target at 131,072: under 30 s and 4 GB);
#   hsdp64  the same with --sharding hsdp --shard-group-size 64 (2,048 shard groups at 131K);
#   full    zero3 with every rank simulated (no --prune-ranks), up to FULL_MAX ranks (default
#           16384): the engine's cost per distinct rank, linear in the ranks;
# and one run of 100 steps at 131,072 ranks with a persistent and a per-step part and 4
# stragglers per step (--rank-jitter 0.02:1 --step-jitter 0.03:2 --step-stragglers 4:1.3,
# --prune-ranks; target under 2 minutes), printing the step-time distribution.
#
#   bench/distinct_ranks.sh [BUILD_DIR]          # FULL_MAX=0 skips the full rows
#
# A run that fails (non-zero exit, or no step time in its report) stops the script with exit 1.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
full_max="${FULL_MAX:-16384}"
f="$build/tools/fsdplab"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$f" synth --layers 80 --hidden 8192 --ffn 28672 --heads 64 --kv-heads 8 --vocab 128256 \
  --steps 1 -o "$work/llama70b.json" 2>/dev/null

# measure LABEL WORLD ARGS...: one table row.
measure() {
  local label="$1" world="$2"
  shift 2
  if ! taskset -c 0 /usr/bin/time -v "$f" simulate "$work/llama70b.json" --world-size "$world" \
    --timeline-ranks 1 "$@" >"$work/out.txt" 2>"$work/time.txt"; then
    echo "FAILED: $label at $world ranks" >&2
    tail -5 "$work/out.txt" "$work/time.txt" >&2
    exit 1
  fi
  local step wall user sys rss simulated
  step="$(grep -m1 -E '^Step time:' "$work/out.txt" | sed -E 's/^Step time: *//; s/ \(.*//')"
  if [[ -z "$step" ]]; then
    echo "FAILED: $label at $world ranks: no step time in the report" >&2
    exit 1
  fi
  wall="$(grep 'Elapsed (wall' "$work/time.txt" | awk '{print $NF}')"
  user="$(grep 'User time' "$work/time.txt" | awk '{print $NF}')"
  sys="$(grep 'System time' "$work/time.txt" | awk '{print $NF}')"
  rss="$(grep 'Maximum resident' "$work/time.txt" | awk '{print $NF}')"
  simulated="$(grep -oE '[0-9]+ simulated|every one of the [0-9]+ ranks' "$work/out.txt" |
    head -1 | grep -oE '[0-9]+' | head -1)"
  printf '| %-7s | %7s | %9s | %8.2f | %8s | %7.0f | %9s |\n' "$label" "$world" "$simulated" \
    "$(echo "$user + $sys" | bc)" "$wall" "$((rss / 1024))" "$step"
}

echo "| run     |   ranks | simulated | CPU s    | wall     | RSS MB  | step time |"
echo "|---------|---------|-----------|----------|----------|---------|-----------|"
for world in 1024 4096 16384 65536 131072; do
  measure zero3 "$world" --steps 1 --rank-jitter 0.05:1 --prune-ranks
  measure hsdp64 "$world" --steps 1 --rank-jitter 0.05:1 --prune-ranks \
    --sharding hsdp --shard-group-size 64
  if ((world <= full_max)); then
    measure full "$world" --steps 1 --rank-jitter 0.05:1
  fi
done

echo
echo "== 100 steps, 131,072 ranks: --rank-jitter 0.02:1 --step-jitter 0.03:2 --step-stragglers 4:1.3 =="
measure steps100 131072 --steps 100 --rank-jitter 0.02:1 --step-jitter 0.03:2 \
  --step-stragglers 4:1.3 --prune-ranks
sed -n '/^Step-time distribution/,/^$/p' "$work/out.txt"
