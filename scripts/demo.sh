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
echo "--- step time and exposed communication, registration vs recorded ---"
for order in registration recorded; do
  "$fsdplab" simulate traces/reversed_registration.json --order "$order" --steps 3 --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin); s=r["summary"]; print(f"  {sys.argv[1]:<13} step {s[\"step_time_us\"]:9.1f} us   exposed comm {s[\"exposed_comm_us\"]:8.1f} us   overlap {s[\"overlap_ratio\"]:.2f}")' "$order"
done

echo
echo "=== 3. Sweep prefetch budgets and orders on traces/gpt_small.json ==="
"$fsdplab" sweep traces/gpt_small.json --forward-prefetch 0,1,2,4 --backward-prefetch 0,1,2 \
  --order registration,recorded --steps 3
