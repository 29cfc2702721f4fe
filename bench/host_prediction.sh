#!/usr/bin/env bash
# Predicted vs measured step time on the host backend (docs/design.md §5: the simulator within
# 5% of the host executor). Runs every sample trace live with --compute timed, calibrates the
# collective model from `bench-gather --backend host` (the all-gather and reduce-scatter curves,
# measured before and after the live runs, and with --op concurrent how much each slows the
# other while both run), simulates the same steps with the calibrated cluster, and prints the
# error per trace and the median |error|.
#
#   bench/host_prediction.sh [BUILD_DIR] [COMM_CONTENTION]
#   bench/host_prediction.sh --grid [--seed N] [--count N] [--build DIR]
#
# MPI_NP=N: the ranks as N processes (`mpirun -np N`, collectives over MPI) for both the
# bench-gather calibration and the live runs, instead of threads of one process.
# TORCHRUN_NP=N: the same under torchrun (`torchrun --nproc-per-node N --no-python`, collectives
# over Gloo; TORCHRUN overrides the torch 2.x environment's torchrun).
# TRACES="gpt_small two_microbatches": only those sample traces.
#
# --grid: a seeded grid of at least 24 synthetic workloads instead of the sample traces (see
# bench/host_prediction_grid.py: compute/communication 0.1-10, units 1-64 MB, 1-4 microbatches,
# recompute, MXFP8, budgets 0-2, 2 and 3 ranks).
#
# COMM_CONTENTION: override the measured contention with one factor for both collectives (as
# `fsdplab simulate --comm-contention`); by default the measured factors in the cluster file are
# used. STEPS (default 8) sets the steps per run; the summary is the mean of the steps after the
# first, as in every report. REPEAT (default 3; 5 with --grid) live runs per trace; the median one is compared,
# and every run's step time is printed so that the run-to-run noise is beside the error. Run it on an otherwise idle machine: the host collectives are
# memory copies on the same cores, and any other load shows up as error.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${1:-}" = --grid ]; then
  shift
  exec python3 "$root/bench/host_prediction_grid.py" --build "$root/build" "$@"
fi
build="${1:-$root/build}"
contention=()
[ -n "${2:-}" ] && contention=(--comm-contention "$2")
f="$build/tools/fsdplab"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
world=2
launch=()
if [ -n "${MPI_NP:-}" ]; then
  world=$MPI_NP
  launch=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$MPI_NP"
    --oversubscribe)
elif [ -n "${TORCHRUN_NP:-}" ]; then
  world=$TORCHRUN_NP
  launch=("${TORCHRUN:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdplab/torch2-venv/bin/torchrun}"
    --nproc-per-node "$TORCHRUN_NP" --master-addr 127.0.0.1 --master-port "${MASTER_PORT:-29611}"
    --no-python)
fi
steps=${STEPS:-8}
repeat=${REPEAT:-3}
sizes=(-b 256K -e 128M -f 2 -n 10 -w 3)

# The collective model is measured before and after the live runs and fitted to both (calibrate
# averages repeated sizes): this machine's speed drifts by several percent within a minute, and a
# model measured only before the runs carried that drift into every prediction at once.
# WORKING_SET (default 8x this machine's last-level cache, scripts/cold_working_set.sh): the
# all-gather and reduce-scatter curves are
# measured on buffers cold in the caches, as a live step that walks many units' buffers finds
# them (bench-gather --working-set); 0 measures one hot buffer, as nccl-tests does.
ws=(--working-set "${WORKING_SET:-$(bash "$root/scripts/cold_working_set.sh")}")
bench() {
  "${launch[@]}" "$f" bench-gather --backend host --world-size $world "${sizes[@]}" "${ws[@]}" \
    --nccl-out "$work/ag$1.txt" >/dev/null
  "${launch[@]}" "$f" bench-gather --backend host --world-size $world "${sizes[@]}" "${ws[@]}" \
    --op reduce_scatter --nccl-out "$work/rs$1.txt" >/dev/null
}
bench 0
"${launch[@]}" "$f" bench-gather --backend host --world-size $world "${sizes[@]}" "${ws[@]}" \
  --op concurrent -J "$work/concurrent.json" | tail -1

names=()
for t in "$root"/traces/*.json; do
  name="$(basename "$t" .json)"
  if [ -n "${TRACES:-}" ] && [[ " $TRACES " != *" $name "* ]]; then continue; fi
  names+=("$name")
  extra=()
  [ "$name" = mxfp8_inside_recompute ] && extra=(--unshard-all-planes-in-backward all)
  [ "$name" = divergent_step ] && extra=(--order registration)
  for ((i = 0; i < repeat; i++)); do
    "${launch[@]}" "$f" run --backend host "$t" --world-size $world --steps "$steps" --compute timed \
      --no-check "${extra[@]}" --json -o "$work/$name.meas$i.json" >/dev/null
  done
done

bench 1
"$f" calibrate "$work"/ag0.txt "$work"/ag1.txt "$work"/rs0.txt "$work"/rs1.txt \
  --contention "$work/concurrent.json" -o "$work/cluster.json" >/dev/null

printf '%-24s %13s %13s %8s   %s\n' trace "predicted us" "measured us" "error" \
  "measured step time of each run (us): the noise floor"
errors=()
for name in "${names[@]}"; do
  t="$root/traces/$name.json"
  extra=()
  [ "$name" = mxfp8_inside_recompute ] && extra=(--unshard-all-planes-in-backward all)
  [ "$name" = divergent_step ] && extra=(--order registration)
  "$f" simulate "$t" --cluster "$work/cluster.json" --world-size $world --steps "$steps" \
    "${contention[@]}" "${extra[@]}" --json -o "$work/sim.json" >/dev/null
  # The live run with the median step time is compared.
  runs=()
  for ((i = 0; i < repeat; i++)); do
    runs+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["step_time_us"], sys.argv[1])' "$work/$name.meas$i.json")")
  done
  median_run="$(printf '%s\n' "${runs[@]}" | sort -g | awk -v n="$repeat" 'NR == int((n + 1) / 2) {print $2}')"
  spread="$(printf '%s\n' "${runs[@]}" | awk '{printf "%s%.0f", (NR > 1 ? " " : ""), $1}')"
  line="$("$f" compare "$work/sim.json" "$median_run" --json)"
  read -r pred meas err < <(printf '%s' "$line" | python3 -c 'import json,sys; s=json.load(sys.stdin)["summary"]; print(s["step_time_predicted_us"], s["step_time_measured_us"], s["step_time_error_pct"])')
  printf '%-24s %13.1f %13.1f %7.1f%%   %s\n' "$name" "$pred" "$meas" "$err" "$spread"
  errors+=("$err")
done
# The target is on the size of the error: the median of |error| over the traces.
printf '%s\n' "${errors[@]}" | tr -d - | sort -g |
  awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "median |error| %.1f%%, largest %.1f%%\n", m, a[NR]}'
