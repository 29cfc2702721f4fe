#!/usr/bin/env bash
# Does a tuned per-unit policy's predicted gain show up live? On the host backend (2 ranks, CPU
# threads, timed compute): calibrate the collective model on this machine, tune a small
# GPT-like trace under a memory cap that rules out the fastest global policy, then run both the
# best global policy and the tuned one live and compare the measured gain (sign and size) with
# the predicted one.
#
#   bench/tune_host_check.sh [BUILD_DIR]      # STEPS (default 6) live steps; REPEAT (default 3)
#
# Run it on an otherwise idle machine: the host's collectives are memory copies on the same
# cores, and other load shows up as noise (each run's step time is printed beside the median).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
f="$build/tools/fsdplab"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
world=2
steps=${STEPS:-6}
repeat=${REPEAT:-3}
sizes=(-b 1M -e 64M -f 2 -n 5 -w 2)

"$f" bench-gather --backend host --world-size $world "${sizes[@]}" --nccl-out "$work/ag.txt" >/dev/null
"$f" bench-gather --backend host --world-size $world "${sizes[@]}" --op reduce_scatter \
  --nccl-out "$work/rs.txt" >/dev/null
"$f" calibrate "$work/ag.txt" "$work/rs.txt" -o "$work/cluster.json" >/dev/null

# Eight layers; compute a little longer than the gathers on a 2-rank host (TFLOPS to adjust).
"$f" synth --layers 8 --hidden 1024 --ffn 4096 --heads 16 --vocab 8192 --seq 512 \
  --tflops "${TFLOPS:-1}" --world-size $world -o "$work/model.json" 2>/dev/null
common=(--cluster "$work/cluster.json" --world-size $world --steps "$steps")

# The cap: just under what the allocator reserves for the fastest global policy (what the cap
# holds), so that it is ruled out.
"$f" sweep "$work/model.json" "${common[@]}" --forward-prefetch 0,1,2 --backward-prefetch 0,1,2 \
  --csv "$work/sweep.csv" --jobs 1 >/dev/null
cap="$(python3 - "$work/sweep.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("status", "ok") in ("ok", "")]
best = min(float(r["step_time_us"]) for r in rows)
print(min(int(r["peak_reserved_bytes"]) for r in rows if float(r["step_time_us"]) == best) - 1)
PY
)"
echo "memory cap: $cap bytes (1 below the least reserved by the fastest global policies)"
"$f" tune "$work/model.json" "${common[@]}" --memory-cap "$cap" --out "$work/tuned.json" \
  --global-out "$work/global.json" | grep -E "^(best global|tuned policy|gain|bound)"

measure() {  # median measured step time (us) of REPEAT live runs with policy file $1
  local times=()
  for ((i = 0; i < repeat; i++)); do
    "$f" run --backend host "$work/model.json" --world-size $world --steps "$steps" \
      --compute timed --no-check --policy "$1" --json -o "$work/run.json" >/dev/null
    times+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["step_time_us"])' "$work/run.json")")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk -v n="$repeat" 'NR == int((n + 1) / 2)'
  echo "  runs: ${times[*]}" >&2
}
predict() {
  "$f" simulate "$work/model.json" "${common[@]}" --policy "$1" --json -o "$work/sim.json" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["step_time_us"])' "$work/sim.json"
}
pg="$(predict "$work/global.json")"; pt="$(predict "$work/tuned.json")"
echo "measuring the global policy:"; mg="$(measure "$work/global.json")"
echo "measuring the tuned policy:";  mt="$(measure "$work/tuned.json")"
python3 - "$pg" "$pt" "$mg" "$mt" <<'PY'
import sys
pg, pt, mg, mt = map(float, sys.argv[1:])
pgain, mgain = 100 * (pg - pt) / pg, 100 * (mg - mt) / mg
print(f"predicted: global {pg:.0f} us, tuned {pt:.0f} us, gain {pgain:+.1f}%")
print(f"measured:  global {mg:.0f} us, tuned {mt:.0f} us, gain {mgain:+.1f}%")
same = (pgain > 0) == (mgain > 0)
print(f"same sign: {'yes' if same else 'NO'}; size measured/predicted: "
      f"{(mgain / pgain if pgain else float('nan')):.2f}")
PY
