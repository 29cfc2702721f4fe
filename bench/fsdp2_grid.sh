#!/usr/bin/env bash
# Real FSDP2 runs of models this project did not write, measured and predicted: the grid every
# change to the FSDP2 model, the memory model and the profiler importer is judged by.
#
#   bench/fsdp2_grid.sh [BUILD_DIR]              the full grid (30 runs, about 45-60 min)
#   bench/fsdp2_grid.sh --quick [BUILD_DIR]      CI size: the encoder, two configurations, ~1 min
#   bench/fsdp2_grid.sh --regrade DIR [BUILD_DIR]  the table again from DIR's kept raw files,
#                                                with this build's predictions (seconds)
#
# OUT=DIR keeps the raw grid there (default: a temporary folder, removed at the end); a run whose
# folder in OUT is complete is kept, so an interrupted grid goes on where it stopped (FORCE=1
# runs everything again). ONLY=REGEX picks runs by id (e.g. ONLY='llama-s-.*'). PHASES=record,
# profile,stack,mem,paired runs only those phases again in OUT's complete runs (keeping the
# timed ones).
# STEPS, WARMUP override the timed steps per process (default 20, twice) and the warm-up (5).
#
# Per run (bench/fsdp2_grid.py says what and how): 2 gloo ranks, each pinned to its own core
# with one intra-op and one inter-op thread; separate processes time the steps with nothing
# attached, record them (fsdplab.torch.Recorder), profile them (torch.profiler, without and
# with Python stacks, recorded too) and track one step's memory (FSDPMemTracker). Then, through the CLI as a user would: `simulate
# --rank-trace traces/ --preset fsdp2 --json`, `import-kineto --out-dir` + `simulate`, and
# `import-kineto --check`; policy runs apply `tune --preset fsdp2` exported with `export-policy
# --to fsdp2 --format json`. Prints the table and writes DIR/table.txt and DIR/summary.json.
# Needs the torch 2.x environment with transformers (`bash scripts/setup.sh --torch2`;
# FSDPLAB_TORCH2_PYTHON overrides). Run it on an otherwise idle machine: two ranks share the two
# cores, and other load shows up as spread (the table prints the load before and after).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=run
regrade=""
case "${1:-}" in
  --quick) mode=quick; shift ;;
  --regrade) mode=regrade; regrade="${2:?--regrade DIR}"; shift 2 ;;
esac
build="${1:-$root/build}"
f="$build/tools/fsdplab"
[ -x "$f" ] || { echo "fsdp2_grid: no fsdplab at $f (build first)" >&2; exit 1; }
py="${FSDPLAB_TORCH2_PYTHON:-$(bash "$root/scripts/setup.sh" --torch2)}"

if [ "$mode" = regrade ]; then
  exec "$py" "$root/bench/fsdp2_grid.py" regrade "$regrade" --fsdplab "$f"
fi
out="${OUT:-$(mktemp -d)}"
[ -n "${OUT:-}" ] || trap 'rm -rf "$out"' EXIT
args=(run --out "$out" --fsdplab "$f")
[ "$mode" = quick ] && args+=(--quick)
[ -n "${ONLY:-}" ] && args+=(--only "$ONLY")
[ -n "${FORCE:-}" ] && args+=(--force)
[ -n "${PHASES:-}" ] && args+=(--phases "$PHASES")
[ -n "${STEPS:-}" ] && args+=(--steps "$STEPS")
[ -n "${WARMUP:-}" ] && args+=(--warmup "$WARMUP")
"$py" "$root/bench/fsdp2_grid.py" "${args[@]}"
[ -n "${OUT:-}" ] && echo "raw grid in $out"
exit 0
