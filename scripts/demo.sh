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
"$fsdplab" simulate traces/gpt_small.json --steps 3

echo
echo "=== 2. A model whose layers run in the opposite order from registration ==="
echo "--- registration order (the default) ---"
"$fsdplab" order traces/reversed_registration.json --order registration
echo "--- recorded order ---"
"$fsdplab" order traces/reversed_registration.json --order recorded
echo "--- what the recorded order saves (simulated, 3 steps) ---"
"$fsdplab" sweep traces/reversed_registration.json --order registration,recorded --steps 3

echo
echo "=== 3. Sweep prefetch budgets on traces/gpt_small.json: fastest policy under 480 MiB ==="
"$fsdplab" sweep traces/gpt_small.json --forward-prefetch 0,1,2,4 --backward-prefetch 0,1,2 \
  --steps 3 --memory-cap 480M --plot build/sweep.svg
echo "(plot of step time against peak memory, Pareto front marked: build/sweep.svg)"
