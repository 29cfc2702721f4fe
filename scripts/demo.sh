#!/usr/bin/env bash
# The main job on the bundled sample traces: set up, build, then simulate a GPT-like model under
# the default policy, show what the recorded order fixes on a model registered out of order, and
# sweep prefetch budgets for the best policy under a memory cap.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target fsdplab >/dev/null
fsdplab=build/tools/fsdplab

echo "=== 1. Simulate traces/gpt_small.json (default policy, 8-GPU NVLink node) ==="
"$fsdplab" simulate traces/gpt_small.json --steps 3 -o build/report.json --html build/report.html
echo "(report page: build/report.html; open it in a browser, it needs no network)"

echo
echo "=== 2. A model whose layers run in the opposite order from registration ==="
echo "--- registration order (the default) ---"
"$fsdplab" order traces/reversed_registration.json --order registration
echo "--- recorded order ---"
"$fsdplab" order traces/reversed_registration.json --order recorded
echo "--- what the recorded order saves (simulated, 3 steps) ---"
"$fsdplab" sweep traces/reversed_registration.json --order registration,recorded --steps 3

echo
echo "=== 3. Sweep prefetch budgets on traces/gpt_small.json: fastest policy under 550 MiB ==="
"$fsdplab" sweep traces/gpt_small.json --forward-prefetch 0,1,2,4 --backward-prefetch 0,1,2 \
  --steps 3 --memory-cap 550M --plot build/sweep.svg -o build/sweep.json --html build/sweep.html
echo "(plot of step time against reserved memory, Pareto front marked: build/sweep.svg)"
"$fsdplab" report build/report.json --sweep build/sweep.json -o build/report.html >/dev/null
echo "(report page of section 1's run and this sweep: build/report.html; the sweep with the"
echo " chosen policy's own timeline and memory: build/sweep.html)"

echo
echo "=== 4. Predicted vs measured: gpt_small live on this machine's CPU (host backend) ==="
# Two ranks as threads, real collectives on real buffers, the compute an emulated device that
# keeps the trace's durations. The collective model is calibrated on this machine (bench-gather
# -> calibrate), so the simulator predicts this machine, not a GPU node.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The collective curves are gpt_small's own collectives timed one at a time on the executor's
# buffers, with no compute (bench-gather --trace), so that the caches hold what its own shards
# and pool buffers leave there; bench/host_prediction_grid.py calibrates each workload the same
# way. The contention bench below covers the sizes its collectives move (24 and 62.5 MiB:
# 16M-64M) on as many bytes as they walk (simulate's collective_footprint_bytes, at most 8x this
# machine's last-level cache, scripts/cold_working_set.sh).
"$fsdplab" simulate traces/gpt_small.json --world-size 2 --steps 2 -o "$work/span.json" >/dev/null
read -r lo hi footprint < <(python3 "$root/bench/host_prediction_grid.py" --bench-span "$work/span.json")
sizes=(--backend host --world-size 2 -b "$lo" -e "$hi" -f 2 -n 8 -w 2)
ws=(--working-set "$(bash "$root/scripts/cold_working_set.sh" "$footprint")")
# The curves are measured beside the live runs, one bench before each run and one after the
# last, and fitted together: this machine's copy speed drifts by tens of percent over minutes,
# and four benches spread over the runs' minutes sample what they ran in where two at the ends
# can both miss it (bench/host_prediction_grid.py measures its workloads the same way).
bench_curves() {
  "$fsdplab" bench-gather --backend host --world-size 2 --trace traces/gpt_small.json -n 8 \
    --nccl-out "$work/curves$1.txt" >/dev/null
}
# Three live runs; the one with the median step time is compared (the others show the noise).
# 20 steps of about 75-85 ms: each run lasts one drift window (2.5 s, the drift line below), so a
# hiccup of the machine moves its mean step little (bench/host_prediction_grid.py, RUN_SECONDS).
for i in 0 1 2; do
  bench_curves "$i"
  "$fsdplab" run --backend host traces/gpt_small.json --world-size 2 --steps 20 --compute timed \
    --no-check --json -o "$work/measured$i.json" >/dev/null
  # The contention and the streams' wake-ups between the runs, on the same working set: on one
  # hot buffer the all-gather's slowdown beside a reduce-scatter read 1.07-1.95x at 16-64 MiB
  # (two benches back to back), on 952M 0.94-1.09x.
  if [ "$i" = 1 ]; then
    "$fsdplab" bench-gather "${sizes[@]}" "${ws[@]}" --op concurrent -J "$work/both.json" | tail -1
  fi
done
bench_curves 3
median="$(for i in 0 1 2; do
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["summary"]["step_time_us"], sys.argv[1])' \
    "$work/measured$i.json"
done | sort -g | tee "$work/runs.txt" | sed -n 2p | cut -d' ' -f2)"
echo "measured step time of the three runs: $(awk '{printf "%s%.1f ms", (NR > 1 ? ", " : ""), $1 / 1000}' "$work/runs.txt")"
"$fsdplab" calibrate "$work"/curves[0-3].txt \
  --contention "$work/both.json" -o "$work/cluster.json" >/dev/null
"$fsdplab" simulate traces/gpt_small.json --cluster "$work/cluster.json" --world-size 2 \
  --steps 20 -o "$work/predicted.json" >/dev/null
"$fsdplab" compare "$work/predicted.json" "$median" | sed -n '1,/^$/p;$p'
# How far this machine alone moves one collective between windows as long as a live run: an
# error inside that spread is this machine's noise, not the model's.
"$fsdplab" bench-gather --backend host --world-size 2 --op drift -b 16M --seconds 10 "${ws[@]}" |
  tail -1
echo "(the host's collectives are memory copies on shared cores: an error inside the drift above"
echo " is this machine's noise, not the model's; bench/host_prediction.sh repeats this for every"
echo " sample trace, and --grid over 24 synthetic workloads)"
