"""The PyTorch profiler's own cost per recorded operator and memory event, on this CPU.

    ~/.cache/fsdplab/torch2-venv/bin/python bench/profiler_cost.py [--iters N] [--rounds R]

Runs a loop of small operators (two per iteration, each allocating its output and freeing the
previous one: two operators and four memory events) on one thread, timed in process CPU time,
without the profiler and under torch.profiler with CPU activity alone, with record_shapes, and
with record_shapes and profile_memory, the modes interleaved for R rounds. The difference per
operator against the unprofiled loop is what `fsdplab import-kineto --check` multiplies the
profile's operator count by (its defaults are this script's medians on the machine
bench/README.md names; `--profiler-op-us` gives another CPU's). Prints one JSON line per mode.
"""

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

MODES = {
    "none": None,
    "cpu": dict(record_shapes=False, profile_memory=False),
    "shapes": dict(record_shapes=True, profile_memory=False),
    "shapes+memory": dict(record_shapes=True, profile_memory=True),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def loop():
        t0 = time.process_time()
        for _ in range(args.iters):
            c = torch.add(a, b)
            c.mul(2)
        return time.process_time() - t0

    loop()  # warm-up
    cpu_s = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode, kw in MODES.items():
            if kw is None:
                cpu_s[mode].append(loop())
                continue
            with profile(activities=[ProfilerActivity.CPU], **kw):
                cpu_s[mode].append(loop())
    ops = 2 * args.iters
    base = statistics.median(cpu_s["none"])
    for mode, xs in cpu_s.items():
        med = statistics.median(xs)
        print(json.dumps({"mode": mode, "us_per_op": round(med * 1e6 / ops, 3),
                          "extra_us_per_op": round((med - base) * 1e6 / ops, 3),
                          "rounds": len(xs), "ops": ops, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
