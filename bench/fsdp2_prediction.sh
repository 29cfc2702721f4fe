#!/usr/bin/env bash
# Predicts a real FSDP2 step and compares with the measurement (DESIGN §5: within 10% of a real
# FSDP2 step, CPU, gloo, recorded by the recorder).
#
#   bench/fsdp2_prediction.sh [BUILD_DIR]        (OUT=DIR keeps the files; default a temp dir)
#
# 1. bench/fsdp2_prediction.py run: on 2 gloo ranks (one CPU thread each), the all-gather and
#    reduce-scatter curves in nccl-tests text, real FSDP2 steps of a 6-layer transformer timed,
#    three steps recorded by tools/torch/fsdplab_record.py, one step's peak memory;
# 2. fsdplab calibrate: the collective model from those curves (measured before and after the
#    model's steps; calibrate averages repeated sizes);
# 3. fsdplab simulate --rank-trace, both ranks' traces, twice:
#    - fsdp2_policy: FSDP2's policy as it runs on a GPU, `--preset fsdp2` (recorded order, one
#      unit of implicit forward prefetch, backward prefetch 1, reshard after forward with the
#      root excepted, nothing gathered before the forward);
#    - cpu_synchronous: FSDP2 as it runs here: its default unshard is synchronous and the same
#      Python thread computes, so nothing overlaps: every gather on demand (prefetch 0) and one
#      stream for all collectives, so that the next gather (which compute waits for) queues
#      behind each reduce-scatter;
# 4. prints predicted vs measured step time, exposed communication and peak memory.
# Needs torch 2.x: the environment of `bash scripts/setup.sh --torch2` (FSDPLAB_TORCH2_PYTHON
# overrides). Run it on an otherwise idle machine: the two ranks and gloo share the cores, and
# other load shows up as error. LAYERS, DMODEL, BATCH, SEQ, STEPS override the model and run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
f="$build/tools/fsdplab"
[ -x "$f" ] || { echo "fsdp2_prediction: no fsdplab at $f (build first)" >&2; exit 1; }
py="${FSDPLAB_TORCH2_PYTHON:-$(bash "$root/scripts/setup.sh" --torch2)}"
out="${OUT:-$(mktemp -d)}"
[ -n "${OUT:-}" ] || trap 'rm -rf "$out"' EXIT
mkdir -p "$out"

"$py" "$root/bench/fsdp2_prediction.py" run --out "$out" --fsdplab "$f" --layers "${LAYERS:-6}" \
  --d-model "${DMODEL:-256}" --batch "${BATCH:-8}" --seq "${SEQ:-64}" --steps "${STEPS:-8}" \
  >/dev/null
"$f" calibrate "$out/ag.txt" "$out/ag2.txt" "$out/rs.txt" "$out/rs2.txt" --ranks 2 \
  -o "$out/cluster.json" >/dev/null
for t in "$out"/traces/*.json; do "$f" validate "$t" >/dev/null; done

common=(--rank-trace "$out/traces" --cluster "$out/cluster.json" --world-size 2 --json)
# FSDP2's policy as on a GPU: its preset (docs/design.md, "Framework presets").
"$f" simulate "${common[@]}" --preset fsdp2 -o "$out/fsdp2_policy.json" >/dev/null
# As FSDP2 runs on this CPU: every unshard on demand and waited for, one stream for all
# collectives.
"$f" simulate "${common[@]}" --forward-prefetch 0 --backward-prefetch 0 \
  --reshard-after-forward true --prefetch-first-unit false --unified-comm-stream true \
  -o "$out/cpu_synchronous.json" >/dev/null

"$py" "$root/bench/fsdp2_prediction.py" compare --out "$out" "$out/fsdp2_policy.json" \
  "$out/cpu_synchronous.json"
[ -n "${OUT:-}" ] && echo "files in $out"
exit 0
