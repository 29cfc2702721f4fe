#!/usr/bin/env bash
# Predicted vs measured step time on the host backend (issue: simulator within 5% of the host
# executor). Calibrates the collective model from `bench-gather --backend host`, then for every
# sample trace runs live steps with --compute timed and simulates the same steps with the
# calibrated cluster, and prints the error per trace and the median.
#
#   bench/host_prediction.sh [BUILD_DIR] [COMM_CONTENTION]
#
# COMM_CONTENTION (default 1): on the host, the all-gather and reduce-scatter "streams" of both
# ranks are threads copying and summing memory on the same cores, so concurrent collectives
# share one resource (1 = each runs at half speed while both run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
contention="${2:-1}"
f="$build/tools/fsdplab"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
world=2
steps=4

"$f" bench-gather --backend host --world-size $world -b 256K -e 128M -f 2 -n 10 -w 3 \
  --nccl-out "$work/ag.txt" >/dev/null
"$f" bench-gather --backend host --world-size $world -b 256K -e 128M -f 2 -n 10 -w 3 \
  --op reduce_scatter --nccl-out "$work/rs.txt" >/dev/null
"$f" calibrate "$work/ag.txt" "$work/rs.txt" -o "$work/cluster.json" >/dev/null

printf '%-28s %14s %14s %9s\n' trace "predicted us" "measured us" "error"
errors=()
for t in "$root"/traces/*.json; do
  name="$(basename "$t" .json)"
  extra=()
  [ "$name" = mxfp8_inside_recompute ] && extra=(--unshard-all-planes-in-backward all)
  [ "$name" = divergent_step ] && extra=(--order registration)
  "$f" run --backend host "$t" --world-size $world --steps $steps --compute timed --no-check \
    "${extra[@]}" -o "$work/meas.json" >/dev/null
  "$f" simulate "$t" --cluster "$work/cluster.json" --world-size $world --steps $steps \
    --comm-contention "$contention" "${extra[@]}" -o "$work/sim.json" >/dev/null
  line="$("$f" compare "$work/sim.json" "$work/meas.json" --json)"
  read -r pred meas err < <(printf '%s' "$line" | python3 -c 'import json,sys; s=json.load(sys.stdin)["summary"]; print(s["step_time_predicted_us"], s["step_time_measured_us"], s["step_time_error_pct"])')
  printf '%-28s %14.1f %14.1f %8.1f%%\n' "$name" "$pred" "$meas" "$err"
  errors+=("$err")
done
printf '%s\n' "${errors[@]}" | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "median error %.1f%%\n", m}'
